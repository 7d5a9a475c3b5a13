"""The page a destructive admin action answers with first, and the forms it asks with.

The selection travels to the confirming POST as hidden fields (:func:`selection_fields`); the
action acts on that POST (``post=yes``, :func:`confirmed`). Used by :mod:`zeroloss.admin.actions`.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.translation import gettext_lazy as _

from ..ledger.models import Message
from .base import ReadOnlyAdmin

#: Messages listed by name on a confirmation page (the count covers all of them).
SHOWN_ON_CONFIRMATION = 200


def select_across(request: HttpRequest) -> bool:
    """Did the operator pick "Select all N messages" (every row the changelist's filter matches)?"""
    return bool(forms.BooleanField(required=False).to_python(request.POST.get("select_across")))


def selection_fields(request: HttpRequest) -> list[tuple[str, str]]:
    """The hidden fields that carry the selection to the confirming POST.

    Chosen rows travel as their primary keys (a page holds at most ``list_max_show_all``).
    "Select all" travels as the flag, and the changelist's filters, search and ordering as
    the form's URL, never as ids: a confirmation form of one field per row would pass
    ``DATA_UPLOAD_MAX_NUMBER_FIELDS`` (1,000) and be refused. Django's changelist still wants
    one row named before it runs an action, so the first chosen row is carried along; with
    ``select_across`` it only opens the door (the filter decides what is acted on).
    """
    chosen = request.POST.getlist(ACTION_CHECKBOX_NAME)
    if select_across(request):
        return [("select_across", "1"), *((ACTION_CHECKBOX_NAME, pk) for pk in chosen[:1])]
    return [("select_across", "0"), *((ACTION_CHECKBOX_NAME, pk) for pk in chosen)]


def confirmation(
    modeladmin: ReadOnlyAdmin,
    request: HttpRequest,
    queryset: QuerySet[Message],
    *,
    action: str,
    title: Any,
    template: str,
    **context: Any,
) -> TemplateResponse:
    """The page that asks before a destructive action; its form posts the selection back."""
    opts = modeladmin.model._meta
    ctx = {
        **modeladmin.admin_site.each_context(request),
        "title": title,
        "opts": opts,
        "app_label": opts.app_label,
        "action_name": action,
        "queryset": queryset.order_by("id")[:SHOWN_ON_CONFIRMATION],
        "count": queryset.count(),
        "select_across": select_across(request),
        "selection_fields": selection_fields(request),
        # The changelist's own URL, query string included: its filters are the selection.
        "form_url": request.get_full_path(),
        **context,
    }
    request.current_app = modeladmin.admin_site.name
    return TemplateResponse(request, template, ctx)


def confirmed(request: HttpRequest) -> bool:
    return request.POST.get("post") == "yes"


def reason_field(help_text: Any) -> forms.CharField:
    """The reason an operator gives on a confirmation page (both reason forms ask the same way)."""
    return forms.CharField(
        label=_("Reason"),
        max_length=1000,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text=help_text,
    )


class SkipKeyHeadForm(forms.Form):
    reason = reason_field(_('Recorded as "key skipped: <reason>" in the head\'s last error and audit trail.'))


class DeadLetterForm(forms.Form):
    reason = reason_field(_("Recorded as the message's last error and in the audit trail."))
