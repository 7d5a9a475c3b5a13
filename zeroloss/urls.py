"""URLs a project can include: ``path("zeroloss/", include("zeroloss.urls"))``."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver

app_name = "zeroloss"

urlpatterns: list[URLPattern | URLResolver] = []
