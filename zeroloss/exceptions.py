"""Typed errors. Every one of them means: nothing was written."""

from __future__ import annotations

from django.db import OperationalError


class ZeroLossError(Exception):
    """Base class of every zeroloss error."""


class InvalidMessage(ZeroLossError, ValueError):
    """A message id, queue name, payload or attempt limit was rejected before anything was stored."""


class InvalidPayload(InvalidMessage):
    """The payload is not JSON-serialisable (or holds a value the database cannot store)."""


class PayloadTooLarge(InvalidPayload):
    """The canonical JSON payload is larger than ``ZEROLOSS["MAX_PAYLOAD_BYTES"]``."""


class InvalidHeaders(InvalidMessage):
    """The headers are not a dict of string keys to JSON values (``send(..., headers=...)``)."""


class HeadersTooLarge(InvalidHeaders):
    """The headers' JSON is larger than ``ZEROLOSS["MAX_HEADERS_BYTES"]``."""


class MessageConflict(ZeroLossError):
    """A message with this id already exists with a different queue or payload."""

    def __init__(self, message_id: str, detail: str) -> None:
        super().__init__(f"Message {message_id!r} already exists with {detail}; nothing was changed.")
        self.message_id = message_id


class MessageNotFound(ZeroLossError, LookupError):
    """No message has this id."""

    def __init__(self, message_id: str) -> None:
        super().__init__(f"No message with id {message_id!r}.")
        self.message_id = message_id


class WorkflowNotFound(ZeroLossError, LookupError):
    """No workflow has this id (``zeroloss_status --workflow``, the admin's workflow page)."""

    def __init__(self, workflow_id: str) -> None:
        super().__init__(f"No workflow with id {workflow_id!r}: it was never sent, or its steps were purged.")
        self.workflow_id = workflow_id


class InvalidHandler(ZeroLossError, TypeError):
    """A handler was registered with options it cannot honour (refused at registration)."""


class InvalidLeaseToken(ZeroLossError, ValueError):
    """A lease token that is not a UUID at all (a wrong but well-formed token returns False instead)."""


class ReplicationTimeout(ZeroLossError):
    """The message is committed on the primary, but not enough standbys confirmed it in time.

    ``persist_message`` is idempotent, so retrying with the same id and payload is safe.
    """

    def __init__(self, message_id: str, confirmed: int, required: int, timeout: float) -> None:
        super().__init__(
            f"Message {message_id!r} is committed on the primary but only {confirmed}/{required} copies "
            f"were confirmed within {timeout:g}s; retrying persist_message with the same id is safe."
        )
        self.message_id = message_id
        self.confirmed = confirmed
        self.required = required


class UnknownQueue(ZeroLossError, LookupError):
    """No handler is registered for this queue (and ``ZEROLOSS["QUEUES"]`` does not declare it)."""

    def __init__(self, queue_name: str) -> None:
        super().__init__(
            f"No zeroloss handler is registered for queue {queue_name!r}, and ZEROLOSS['QUEUES'] does "
            "not declare it (declare it there to send from a process that does not import its handler)."
        )
        self.queue_name = queue_name


class CeleryAppNotConfigured(ZeroLossError):
    """``TRANSPORT = "celery"``, but what would publish is not the project's Celery app: Celery's
    default app (the project's app is never imported), or an app whose broker is not
    ``CELERY_BROKER_URL``. Nothing was stored; the message says what to fix."""


class SoftTimeLimitExceeded(Exception):
    """Raised inside a handler that ran past its ``soft_time_limit`` (``@zeroloss.handler``).

    Catch it to clean up and return (the outcome counts as the handler's); left to propagate,
    it fails the attempt like any other exception. A plain ``Exception`` (not a
    :class:`ZeroLossError`), as in Celery, so ``except Exception`` in a handler catches it too.
    """


class LeaseLostInterrupt(BaseException):
    """Raised inside a sync handler on a worker thread once its lease is known lost (taken over
    while its worker was frozen, or run out): another run owns the message, this run's outcome
    will be refused. A ``BaseException``, like ``KeyboardInterrupt``, so that a handler's
    ``except Exception`` does not swallow it (its ``finally`` blocks run). Delivered between two
    bytecodes: a handler blocked in one C call sees it when that call returns."""


class TimeLimitExceeded(Exception):
    """The error recorded for an attempt stopped at its hard ``time_limit``: the process pool
    killed its child, or an async handler was cancelled."""


class StorageFull(ZeroLossError, OperationalError):
    """The database refused to store the message because its disk is full (or failing).

    Nothing was stored. Free space (see docs/guarantees.md, "The disk fills") and retry with the
    same ``message_id``: persisting is idempotent. ``__cause__`` is the driver's error (psycopg's
    ``DiskFull``, SQLSTATE 53100, or ``IoError``, 58030; SQLite's ``database or disk is full``).
    It is also a Django ``OperationalError``, so ``except OperationalError`` still catches it.
    """

    def __init__(self, message_id: str | None, alias: str, cause: BaseException) -> None:
        what = "the message" if message_id is None else f"message {message_id!r}"
        detail = " ".join(str(cause).split())
        super().__init__(
            f"Database {alias!r} refused to store {what}: its disk is full or failing ({detail}). "
            "Nothing was stored: free space on the database's disk, then retry with the same "
            "message_id (persisting is idempotent)."
        )
        self.message_id = message_id
        self.alias = alias


class InvalidWorkflow(InvalidMessage):
    """A workflow that cannot be stored as sent: a cycle, a dependency on an unknown step or on a
    step of another workflow, steps on queues of different databases. Nothing was stored."""


class WorkflowConflict(ZeroLossError):
    """A workflow id sent again with other steps than the stored ones. Nothing was changed."""

    def __init__(self, workflow_id: str, detail: str) -> None:
        super().__init__(
            f"Workflow {workflow_id!r} already exists with {detail}; nothing was changed. A workflow's "
            "id makes sending it idempotent: send other steps under another id."
        )
        self.workflow_id = workflow_id
