from django.apps import AppConfig


class ZeroLossConfig(AppConfig):
    name = "zeroloss"
    verbose_name = "zeroloss"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        from . import checks  # noqa: F401  (registers the system checks)
        from .handlers import autodiscover

        autodiscover()
        if "django_prometheus" in settings.INSTALLED_APPS:
            from .metrics import register_default

            register_default()
