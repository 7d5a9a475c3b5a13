"""Search that uses the ledger's indexes: an exact message id is one probe of the unique index.

Django's ``search_fields`` would turn ``=message_id`` into ``UPPER(message_id) = UPPER(%s)``
and OR it with ``last_error ILIKE '%...%'``: no index serves either, so every search scanned
the whole table. Here a bare term is compared with ``=`` only, and a scan happens only when
the operator asks for one with a prefix.

Messages: ``term`` is an exact message id or an exact queue name; ``id:term`` only a message
id; ``error:text`` searches the last error (case-insensitive, a scan); ``key:name`` the messages
of an exact ordering key (with the queue filter, the ordering indexes serve its live messages;
across retained history it is a scan); ``workflow:id`` the steps of a workflow (its partial
index). Audit events: ``term``
(or ``id:term``) is an exact message id; ``actor:name`` an exact actor (a scan).
"""

from __future__ import annotations

from django.db.models import Q, QuerySet

from ..ledger.models import Message, MessageEvent

ID_PREFIX = "id:"
ERROR_PREFIX = "error:"
KEY_PREFIX = "key:"
ACTOR_PREFIX = "actor:"
WORKFLOW_PREFIX = "workflow:"


def _after(term: str, prefix: str) -> str | None:
    """The rest of ``term`` if it starts with ``prefix``, else ``None``."""
    return term[len(prefix) :].strip() if term.startswith(prefix) else None


def search_messages(queryset: QuerySet[Message], term: str) -> QuerySet[Message]:
    term = term.strip()
    if not term:
        return queryset
    text = _after(term, ERROR_PREFIX)
    if text is not None:
        return queryset.filter(last_error__icontains=text) if text else queryset.none()
    key = _after(term, KEY_PREFIX)
    if key is not None:
        return queryset.filter(ordering_key=key) if key else queryset.none()
    workflow = _after(term, WORKFLOW_PREFIX)
    if workflow is not None:
        return queryset.filter(workflow_id=workflow) if workflow else queryset.none()
    message_id = _after(term, ID_PREFIX)
    if message_id is not None:
        return queryset.filter(message_id=message_id)
    # Both sides are index-backed: the unique index on message_id, (queue_name, status).
    return queryset.filter(Q(message_id=term) | Q(queue_name=term))


def search_events(queryset: QuerySet[MessageEvent], term: str) -> QuerySet[MessageEvent]:
    term = term.strip()
    if not term:
        return queryset
    name = _after(term, ACTOR_PREFIX)
    if name is not None:
        return queryset.filter(actor=name)
    message_id = _after(term, ID_PREFIX)
    # The message by its unique index, then its events by the (message, id) index.
    return queryset.filter(message__message_id=term if message_id is None else message_id)
