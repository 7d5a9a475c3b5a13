from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ZeroLossConfig(AppConfig):
    name = "zeroloss"
    verbose_name = _("zeroloss")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import _ready  # deferred: it imports the models, which need the app registry

        _ready.connect()
