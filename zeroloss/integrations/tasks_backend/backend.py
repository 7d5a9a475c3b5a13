"""The backend: ``enqueue`` stores a ledger message, ``get_result`` reads the ledger back."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from ...core.states import TRAITS, Reason, Status
from ...exceptions import InvalidMessage
from ...ledger.models import Message, MessageEvent
from ...ledger.validation import canonical_json, validate_attempts
from ...runtime.transports import database_for, ledger_aliases, send
from .compat import (
    FRAMEWORK,
    BaseTaskBackend,
    InvalidTaskError,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_enqueued,
)
from .queues import DEFAULT_QUEUE

if TYPE_CHECKING:
    from ...ledger.models import Message

__all__ = ["STATUS_MAP", "InvalidTask", "InvalidTaskArguments", "ZeroLossBackend", "ZeroLossTask"]

NOT_INSTALLED_HINT = (
    'Add "zeroloss" to INSTALLED_APPS, then run manage.py migrate (it creates the ledger\'s tables).'
)


def not_installed_error(alias: str) -> checks.Error:
    """zeroloss.E024: a zeroloss task backend without zeroloss in ``INSTALLED_APPS``."""
    return checks.Error(
        f'TASKS[{alias!r}] is zeroloss\'s backend, but "zeroloss" is not in INSTALLED_APPS: its tasks '
        "would be stored in tables that do not exist, and no zeroloss check would run.",
        hint=NOT_INSTALLED_HINT,
        obj="settings.TASKS",
        id="zeroloss.E024",
    )


@checks.register()
def check_installed(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """zeroloss.E024 where the framework's own check, which asks each backend, does not run: the
    backport on Django 5.2 checks only once ``django_tasks`` is an installed app. Registered when
    this module is imported, i.e. once a zeroloss task backend is loaded (a ``@task`` defined)."""

    if FRAMEWORK != "django_tasks" or apps.is_installed("django_tasks") or apps.is_installed("zeroloss"):
        return []
    return [not_installed_error(b.alias) for b in task_backends.all() if isinstance(b, ZeroLossBackend)]


def _task_status(status: Status) -> TaskResultStatus:
    if TRAITS[status].leased:
        return TaskResultStatus.RUNNING
    if status == Status.COMPLETED:
        return TaskResultStatus.SUCCESSFUL
    if TRAITS[status].finished:
        # The framework has no cancelled status (READY, RUNNING, FAILED, SUCCESSFUL): a dead,
        # cancelled or aborted task did not succeed and will not run again.
        return TaskResultStatus.FAILED
    return TaskResultStatus.READY


#: Ledger status -> the framework's, from the status's traits. A failed attempt that will be
#: retried is ``pending`` again: READY, with its error in ``errors``.
STATUS_MAP = {status: _task_status(status) for status in Status}


class InvalidTask(InvalidMessage, InvalidTaskError):
    """A task, its arguments or its options were refused; nothing was stored.

    Both a :class:`zeroloss.exceptions.InvalidMessage` and the framework's own invalid-task error
    (``django.tasks.exceptions.InvalidTask`` / ``django_tasks.exceptions.InvalidTaskError``).
    """


class InvalidTaskArguments(InvalidTask, TypeError):
    """A task's arguments are not JSON; nothing was stored. A ``TypeError`` too, as Django's own
    backends raise for them (``normalize_json``, ``json.dumps``)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ZeroLossTask(Task):
    """The framework's ``Task`` plus ``max_attempts`` (``None``: the backend's ``OPTIONS``, then
    ``ZEROLOSS['MAX_ATTEMPTS']``). Where ``@task`` passes extra keyword arguments to the backend's
    task class (the backport; Django 6.1) ``@task(max_attempts=5)`` sets it."""

    max_attempts: int | None = None


#: The first line of an error text ``describe_error`` wrote: ``module.Class: message`` (or
#: ``Class: message`` for builtins; the message may be empty or span lines).
_ERROR_HEAD = re.compile(r"[A-Za-z_][\w.]*(?=: )")
_TRACEBACK_START = "Traceback (most recent call last):"
_CUT = "[... traceback cut ...]\n"


#: The audit reasons of a failed attempt (a snooze is none: it adds no error).
_FAILURES = (Reason.FAILED, Reason.DEAD_LETTERED, Reason.DEAD_LETTERED_BY_HANDLER)


def _is_error(detail: str) -> bool:
    """Whether an audit row's detail is an exception ``describe_error`` described (not, e.g., the
    text of a release or of an unknown queue)."""
    return _ERROR_HEAD.match(detail) is not None


def _error_of(detail: str) -> Any:
    """A ``TaskError`` from an audit row's error text (see ``zeroloss.runtime.processing.describe_error``):
    ``module.Class: message`` (the message may span lines), then the traceback. The traceback is
    what follows from its own first line; when the text was cut, what is left of it."""
    found = _ERROR_HEAD.match(detail)
    path = found.group(0) if found else ""
    if "." not in path:
        path = f"builtins.{path}"  # describe_error writes builtins without their module
    start = detail.find(f"\n{_TRACEBACK_START}")
    if start >= 0:
        traceback = detail[start + 1 :]
    elif (cut := detail.find(_CUT)) >= 0:
        traceback = detail[cut:]
    else:  # a message longer than the stored text: the text is all there is
        traceback = detail
    return TaskError(exception_class_path=path, traceback=traceback)


class ZeroLossBackend(BaseTaskBackend):
    """Tasks as zeroloss ledger messages. Configured in ``TASKS``; see ``docs/django-tasks.md``."""

    task_class = ZeroLossTask
    #: How ``queues`` recognises this backend and its subclasses without importing this module.
    is_zeroloss_backend = True

    supports_defer = True  # run_after -> the message's available_at
    supports_priority = True  # the ledger's priority column: claims take higher first
    supports_get_result = True  # read back from the ledger, from any process
    supports_async_task = True  # coroutine tasks run on an event loop in the worker

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        params = {"QUEUES": [DEFAULT_QUEUE], **params}
        # ``QUEUES: []`` is Django's "any queue": every queue no @zeroloss.handler owns.
        super().__init__(alias, params)
        # Lenient here (the system checks E020-E023 report bad settings); enqueue refuses them.
        self.options = params.get("OPTIONS") or {}

    # -- options ------------------------------------------------------------------------------

    def max_attempts_for(self, task: Any) -> int | None:
        value = getattr(task, "max_attempts", None)
        what = f"max_attempts of task {task.module_path}"
        if value is None:
            value = self.options.get("MAX_ATTEMPTS") if isinstance(self.options, dict) else None
            what = f"TASKS[{self.alias!r}]['OPTIONS']['MAX_ATTEMPTS']"
        if value is None:
            return None
        try:
            return validate_attempts(value, what)
        except InvalidMessage as exc:
            raise InvalidTask(str(exc)) from None

    def validate_task(self, task: Any) -> None:
        try:
            super().validate_task(task)
        except InvalidTask:
            raise
        except InvalidTaskError as exc:
            raise InvalidTask(f"Task {task.module_path}: {exc}") from None
        if getattr(task, "max_attempts", None) is not None:
            self.max_attempts_for(task)

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        # zeroloss's own checks (zeroloss.E020-E023, W020) cover every zeroloss task backend
        # once its app is installed: none here then, so none twice. Without the app they are
        # not registered, and the ledger's tables do not exist: the framework's check says so.
        if not apps.is_installed("zeroloss"):
            return [not_installed_error(self.alias)]
        return []

    # -- enqueue ------------------------------------------------------------------------------

    def _payload(self, task: Any, args: Any, kwargs: Any) -> dict[str, Any]:
        try:
            found = import_string(task.module_path)
        except ImportError:
            found = None
        if getattr(found, "func", None) is not task.func:
            raise InvalidTask(
                f"Task {task.module_path} cannot be found by its import path (a worker imports it by that "
                "name): define it at module level under its function's name; nothing was stored."
            )
        try:
            payload = {
                "task": task.module_path,
                "backend": self.alias,
                "args": normalize_json(list(args)),
                "kwargs": normalize_json(dict(kwargs)),
                "run_after": task.run_after.isoformat() if task.run_after is not None else None,
            }
            # Only what survives the JSON round trip unchanged (no int dict keys, NaN, ...).
            same = json.loads(canonical_json(payload)) == payload
        except (TypeError, ValueError) as exc:
            raise InvalidTaskArguments(
                f"Task {task.module_path}: its arguments must be JSON ({exc}); nothing was stored."
            ) from None
        if not same:
            raise InvalidTaskArguments(
                f"Task {task.module_path}: its arguments change in a JSON round trip (dict keys must be "
                "strings); nothing was stored."
            )
        return payload

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Store the task as a ledger message in the caller's transaction (see :func:`zeroloss.send`)."""

        if not apps.is_installed("zeroloss"):
            raise ImproperlyConfigured(f"{not_installed_error(self.alias).msg} {NOT_INSTALLED_HINT}")
        self.validate_task(task)
        payload = self._payload(task, args, kwargs)
        delay = 0.0
        if task.run_after is not None:
            delay = max(0.0, (task.run_after - timezone.now()).total_seconds())
        try:
            message = send(
                task.queue_name,
                payload,
                message_id=uuid.uuid4().hex,
                max_attempts=self.max_attempts_for(task),
                delay=delay,
                priority=task.priority,
            )
        except InvalidTask:
            raise
        except InvalidMessage as exc:
            raise InvalidTask(f"Task {task.module_path}: {exc}") from exc
        result = self._result(task, message, payload, events=[])
        # As Django's own backends: sent once the task exists, i.e. when the caller's
        # transaction commits (at once outside one); never for a rolled-back enqueue.
        transaction.on_commit(
            lambda: task_enqueued.send(type(self), task_result=result), using=message._state.db
        )
        return result

    # -- results ------------------------------------------------------------------------------

    def _aliases(self) -> list[str]:

        if not self.queues:  # any queue: wherever a ledger lives
            return list(dict.fromkeys(["default", *ledger_aliases()]))
        return list(dict.fromkeys(database_for(q) for q in sorted(self.queues)))

    def _find(self, result_id: Any) -> Message:

        if isinstance(result_id, str) and 0 < len(result_id) <= 255 and "\x00" not in result_id:
            for alias in self._aliases():
                found = Message.objects.using(alias).filter(message_id=result_id)
                if self.queues:
                    found = found.filter(queue_name__in=self.queues)
                message = found.first()
                if (
                    message is not None
                    and isinstance(message.payload, dict)
                    and message.payload.get("backend") == self.alias
                    and "task" in message.payload
                ):
                    return message
        raise TaskResultDoesNotExist(result_id)

    def load_task(self, message: Message) -> Any:
        """The message's task, as it was enqueued (queue, priority, run_after)."""
        path = message.payload["task"]
        try:
            task = import_string(path)
        except ImportError as exc:
            raise InvalidTask(
                f"Task {path} of result {message.message_id!r} cannot be imported: {exc}"
            ) from exc
        if not isinstance(task, Task):
            raise InvalidTask(f"{path} (result {message.message_id!r}) is not a task.")
        run_after = message.payload.get("run_after")
        changes: dict[str, Any] = {"priority": message.priority, "queue_name": message.queue_name}
        if run_after:
            changes["run_after"] = dt.datetime.fromisoformat(run_after)
        if task.backend != self.alias:
            changes["backend"] = self.alias
        try:
            return task.using(**changes)
        except InvalidTaskError:
            return task  # e.g. a queue no longer listed: the task as it is defined now

    def _result(self, task: Any, message: Message, payload: dict[str, Any], events: list[Any]) -> Any:
        claims: dict[int, tuple[str, dt.datetime]] = {}
        first_claim: dt.datetime | None = None
        errors = []
        for event in events:
            if event.reason == Reason.REDRIVEN_BY_OPERATOR:
                claims = {}  # attempts start again from 1
            elif event.reason == Reason.CLAIMED:
                claims[event.attempt] = (event.actor, event.created_at)
                first_claim = first_claim or event.created_at
            elif event.reason in _FAILURES and _is_error(event.detail):
                errors.append(_error_of(event.detail))
        counted = [claims[n] for n in sorted(claims) if n <= message.attempts]
        status = STATUS_MAP[Status(message.status)]
        result = TaskResult(
            task=task,
            id=message.message_id,
            status=status,
            enqueued_at=message.created_at,
            started_at=first_claim,
            finished_at=message.completed_at or message.dead_at,
            last_attempted_at=counted[-1][1] if counted else None,
            args=payload.get("args", []),
            kwargs=payload.get("kwargs", {}),
            backend=self.alias,
            errors=errors,
            worker_ids=[actor for actor, _ in counted],
        )
        if status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", message.result)
        return result

    def get_result(self, result_id: str) -> Any:
        """The task's state read from the ledger; ``TaskResultDoesNotExist`` for an unknown id
        (or one purged by ``COMPLETED_RETENTION``)."""

        message = self._find(result_id)
        events = list(
            MessageEvent.objects.using(message._state.db)
            .filter(message_id=message.pk)
            .order_by("id")
            .only("reason", "attempt", "actor", "detail", "created_at")
        )
        return self._result(self.load_task(message), message, message.payload, events)
