from django.apps import AppConfig


class ZeroLossConfig(AppConfig):
    name = "zeroloss"
    verbose_name = "zeroloss"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
        from .handlers import autodiscover

        autodiscover()
