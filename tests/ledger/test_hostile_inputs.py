"""Hostile input, counted: every input below is refused with a clear answer and changes nothing.

Each case is one test id. The answer is the class of a typed error (a ``ZeroLossError``
subclass, or Django's ``ImproperlyConfigured`` for settings), ``exit 2`` for a command (usage
on stderr, no traceback), or an HTTP status for the admin. Before and after each input every
zeroloss table (messages, audit rows, purge records, deduplication windows, nodes) is read in
full and must be equal. A few texts are not refused but *sanitised* (NUL, lone surrogates in
error texts and reasons): those cases check the stored text and that nothing else changed.

Separate ``manage.py`` processes stay only where a broken refusal would hang (``--watch inf``,
``--loop --interval inf``: the process is killed); other command lines run in-process.

``docs/guarantees.md`` (section "Hostile input") lists every case with its answer; a test
here keeps that table and this list equal.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import math
import re
import subprocess
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import pytest
from django.contrib.auth.models import Permission, User
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction
from django.db.models import Model
from django.test import Client
from django.urls import reverse

import zeroloss
from tests.conftest import ROOT
from tests.support import expire_leases
from tests.support.cli import cli, command_line
from zeroloss.exceptions import ZeroLossError
from zeroloss.ledger.models import DedupKey, Message, MessageEvent, PurgeRecord, ReplicationNode
from zeroloss.ledger.service import ZeroLossMessageService, validate_queue_name
from zeroloss.ledger.types import Completion, Lease, Verdict
from zeroloss.runtime import handlers

QUEUE = "hostile"
DEEP = 1200
#: A command that hangs on an input is killed after this many seconds (and the case fails).
HANG_AFTER = 15.0


# -- the ledger every input is thrown at ----------------------------------------------------


@dataclass
class Ledger:
    service: ZeroLossMessageService
    live: Lease  # l1, under a live lease


def seed() -> Ledger:
    """p1 pending, l1 leased (live), s1 stuck (expired lease), d1 dead, c1 completed, a dedup
    window, and node n0: something for every hostile input to (not) change."""
    service = ZeroLossMessageService(instance_id="hostile-seed", ack_timeout=600)
    service.persist_message("p1", QUEUE, {"n": 1}, dedup_key="once")
    for mid in ("l1", "s1", "d1", "c1"):
        service.persist_message(mid, QUEUE, {"n": mid}, max_attempts=1 if mid == "d1" else None)
    live = service.claim_message("l1")
    stuck = service.claim_message("s1")
    dead = service.claim_message("d1")
    done = service.claim_message("c1")
    assert live and stuck and dead and done
    assert expire_leases(["s1"]) == 1
    assert service.fail("d1", dead.token, "boom")
    assert service.acknowledge("c1", done.token)
    service.register_replication_node("n0", "127.0.0.1:5433", metadata={"zone": "a"})
    return Ledger(service, live)


def snapshot() -> dict[str, list[dict[str, Any]]]:
    """Every row of every zeroloss table."""
    tables: tuple[type[Model], ...] = (Message, MessageEvent, PurgeRecord, DedupKey, ReplicationNode)
    return {model.__name__: list(model._default_manager.order_by("pk").values()) for model in tables}


# -- how an answer is read -----------------------------------------------------------------


def error_of(call: Callable[[], Any]) -> str:
    """The class name of the typed error ``call`` raised; anything else is named as what it is."""
    try:
        with transaction.atomic():  # a database error must not break the test's transaction
            call()
    except (ZeroLossError, ImproperlyConfigured) as exc:
        # A typed error must also say what was wrong.
        return type(exc).__name__ if str(exc) else f"{type(exc).__name__} without a message"
    except Exception as exc:
        return f"untyped {type(exc).__module__}.{type(exc).__name__}: {exc}"[:300]
    return "accepted"


def api(call: Callable[[Ledger], Any]) -> Callable[[Ledger], str]:
    return lambda ledger: error_of(lambda: call(ledger))


def command(*args: str) -> Callable[[Ledger], str]:
    """``call_command``: the exit code a shell would see (2 for usage errors)."""

    def run(ledger: Ledger) -> str:
        out, err = io.StringIO(), io.StringIO()
        try:
            with transaction.atomic():
                call_command(*args, stdout=out, stderr=err)
        except CommandError as exc:
            return f"exit {exc.returncode}"
        except Exception as exc:
            return f"untyped {type(exc).__module__}.{type(exc).__name__}: {exc}"[:300]
        return "exit 0"

    return run


def exit_answer(code: int, stderr: str) -> str:
    """A command line's answer: its exit code, and a usage line on stderr for exit 2."""
    if "Traceback" in stderr:
        return f"exit {code} with a traceback: {stderr.strip().splitlines()[-1]}"
    if code == 2:
        assert "error:" in stderr.lower(), stderr
    return f"exit {code}"


def command_line_case(*args: str) -> Callable[[Ledger], str]:
    """The command line's own parsing, in this process: exit 2 with a usage line, no traceback."""

    def run(ledger: Ledger) -> str:
        try:
            result = command_line(*args)
        except Exception as exc:  # a process would have died with a traceback
            return f"untyped {type(exc).__module__}.{type(exc).__name__}: {exc}"[:300]
        return exit_answer(result.code, result.err)

    return run


def manage(*args: str) -> Callable[[Ledger], str]:
    """The real command line, a separate process that can be killed if the input makes it hang
    (endless ``--watch``/``--loop``): exit 2 with a usage line and no traceback."""

    def run(ledger: Ledger) -> str:
        try:
            proc = cli(*args, timeout=HANG_AFTER)
        except subprocess.TimeoutExpired:
            return f"hung (killed after {HANG_AFTER:g}s)"
        return exit_answer(proc.returncode, proc.stderr)

    return run


def setting(**zeroloss_settings: Any) -> Callable[[Ledger], str]:
    """A ``ZEROLOSS`` setting, then a send: the settings are validated before anything is stored."""

    def run(ledger: Ledger) -> str:
        from django.conf import settings as django_settings
        from django.test.utils import override_settings

        with override_settings(ZEROLOSS={**django_settings.ZEROLOSS, **zeroloss_settings}):
            return error_of(lambda: zeroloss.send(QUEUE, {"n": "settings"}, message_id="settings-1"))

    return run


def whole_setting(value: Any) -> Callable[[Ledger], str]:
    """``ZEROLOSS`` itself replaced by ``value``."""

    def run(ledger: Ledger) -> str:
        from django.test.utils import override_settings

        with override_settings(ZEROLOSS=value):
            return error_of(lambda: zeroloss.send(QUEUE, {"n": "settings"}, message_id="settings-1"))

    return run


def canonicalised(ledger: Ledger) -> str:
    """Non-string keys are stored as JSON keys, and the checksum survives the database's round
    trip (PostgreSQL's jsonb reorders keys): verify finds nothing wrong with the message."""
    service = ledger.service
    message = service.persist_message("keys-1", QUEUE, {2: "a", 10: "b"})
    assert message.payload == {"2": "a", "10": "b"}
    assert service.persist_message("keys-1", QUEUE, {"10": "b", "2": "a"}).pk == message.pk  # idempotent
    lease = service.claim_message("keys-1")
    assert lease is not None and lease.payload == {"2": "a", "10": "b"}
    assert service.acknowledge("keys-1", lease.token)
    assert service.verify_message_integrity("keys-1").valid
    out = io.StringIO()
    with pytest.raises(CommandError) as warned:  # exit 1, a warning: the seeded stuck message s1
        call_command("zeroloss_verify", "--json", "--queue", QUEUE, stdout=out, stderr=io.StringIO())
    assert warned.value.returncode == 1
    report = json.loads(out.getvalue())
    assert report["integrity"]["checksum_mismatch"] == 0, report
    assert report["conservation"]["balanced"], report
    assert {i["check"] for i in report["issues"]} <= {"stuck"}, report["issues"]
    return "canonicalised"


def sanitised(
    call: Callable[[Ledger], Any], message_id: str, field: str, expected: str
) -> Callable[[Ledger], str]:
    """Accepted, with the text made storable: ``field`` of the message and the new audit row
    hold ``expected``; only that message changed, with exactly one new audit row."""

    def run(ledger: Ledger) -> str:
        before = snapshot()
        result = error_of(lambda: call(ledger))
        if result != "accepted":
            return result
        after = snapshot()
        row = Message.objects.get(message_id=message_id)
        assert getattr(row, field) == expected, getattr(row, field)
        assert MessageEvent.objects.for_message(message_id).last().detail == expected  # type: ignore[union-attr]
        changed = [r["message_id"] for r in after["Message"] if r not in before["Message"]]
        assert changed == [message_id], changed
        assert len(after["MessageEvent"]) == len(before["MessageEvent"]) + 1
        assert after["MessageEvent"][: len(before["MessageEvent"])] == before["MessageEvent"]
        return "sanitised"

    return run


# -- the admin -------------------------------------------------------------------------------


def user(kind: str) -> User | None:
    if kind == "anonymous":
        return None
    if kind == "superuser":
        return User.objects.create_superuser("root", "root@example.com", "pw")
    account = User.objects.create_user(kind, password="pw", is_staff=True)
    if kind != "staff":
        account.user_permissions.add(
            Permission.objects.get(content_type__app_label="zeroloss", codename=kind)
        )
    return account


def admin_post(
    kind: str, url: str | Callable[[], str], data: dict[str, Any], *, csrf: bool = False
) -> Callable[[Ledger], str]:
    """A POST from a user of ``kind`` (``enforce_csrf_checks`` and no token with ``csrf``).
    ``{pk:ID}`` in a value stands for the primary key of message ``ID``."""

    def run(ledger: Ledger) -> str:
        client = Client(enforce_csrf_checks=csrf)
        account = user(kind)
        if account is not None:
            client.force_login(account)
        form: dict[str, Any] = {}
        for key, value in data.items():
            values = value if isinstance(value, list) else [value]
            form[key] = [
                str(Message.objects.get(message_id=v[4:-1]).pk)
                if isinstance(v, str) and v.startswith("{pk:")
                else v
                for v in values
            ]
        try:
            with transaction.atomic():
                response = client.post(url() if callable(url) else url, form)
        except Exception as exc:
            return f"untyped {type(exc).__module__}.{type(exc).__name__}: {exc}"[:300]
        if response.status_code == 302 and "/login/" in response["Location"]:
            return "HTTP 302 to login"
        if response.status_code == 200 and b"errorlist" in response.content:
            return "HTTP 200 form error"
        return f"HTTP {response.status_code}"

    return run


def admin_get(kind: str, url: Callable[[], str], query: dict[str, str]) -> Callable[[Ledger], str]:
    """A GET from a user of ``kind``: reads must answer too (a filter finds nothing, or 4xx)."""

    def run(ledger: Ledger) -> str:
        client = Client()
        account = user(kind)
        if account is not None:
            client.force_login(account)
        try:
            with transaction.atomic():
                return f"HTTP {client.get(url(), query).status_code}"
        except Exception as exc:
            return f"untyped {type(exc).__module__}.{type(exc).__name__}: {exc}"[:300]

    return run


CHANGELIST = lambda: reverse("admin:zeroloss_message_changelist")  # noqa: E731


def action(name: str, *ids: str, **extra: str) -> dict[str, Any]:
    return {"action": name, "_selected_action": [f"{{pk:{i}}}" for i in ids], "index": "0", **extra}


# -- the cases -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hostile:
    id: str
    surface: str  # api, command, admin, settings
    input: str  # what is thrown, for the docs table
    answer: str  # what must come back
    run: Callable[[Ledger], str]
    #: Needs committed data: a separate process (``manage.py``) reads the ledger.
    committed: bool = False


def nested(depth: int, kind: str = "list") -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


def cyclic() -> dict[str, Any]:
    value: dict[str, Any] = {"n": 1}
    value["self"] = value
    return value


def persist(
    mid: str = "x1", queue: str = QUEUE, data: Any = None, *args: Any, **kwargs: Any
) -> Callable[[Ledger], Any]:
    return lambda ledger: ledger.service.persist_message(
        mid, queue, {"n": 0} if data is None else data, *args, **kwargs
    )


NUL = "\x00"
SURROGATE = "\ud800"

# ``cast(Any, ...)`` marks an input of the wrong type on purpose: the check under test is the
# one made at run time.
CASES: list[Hostile] = [
    # -- send / send_many / persist_message(s) ----------------------------------------------
    Hostile(
        "queue-trailing-newline",
        "api",
        "`persist_message(..., queue_name='hostile\\n')`",
        "InvalidMessage",
        api(persist(queue=QUEUE + "\n")),
    ),
    Hostile(
        "validate-queue-trailing-newline",
        "api",
        "`validate_queue_name('hostile\\n')` (the regex is a full match)",
        "InvalidMessage",
        api(lambda _: validate_queue_name(QUEUE + "\n")),
    ),
    Hostile(
        "send-queue-trailing-newline",
        "api",
        "`send('hostile\\n', ...)`",
        "UnknownQueue",
        api(lambda _: zeroloss.send(QUEUE + "\n", {"n": 0})),
    ),
    Hostile(
        "send-unknown-queue",
        "api",
        "`send('no-such-queue', ...)`",
        "UnknownQueue",
        api(lambda _: zeroloss.send("no-such-queue", {"n": 0})),
    ),
    Hostile("queue-with-space", "api", "queue name `'a b'`", "InvalidMessage", api(persist(queue="a b"))),
    Hostile(
        "queue-101-chars",
        "api",
        "queue name of 101 characters",
        "InvalidMessage",
        api(persist(queue="q" * 101)),
    ),
    Hostile(
        "id-lone-surrogate",
        "api",
        "message id `'m\\ud800'` (a lone surrogate)",
        "InvalidMessage",
        api(persist(mid="m" + SURROGATE)),
    ),
    Hostile("id-nul", "api", "message id `'m\\x00'`", "InvalidMessage", api(persist(mid="m" + NUL))),
    Hostile("id-blank", "api", "message id `'   '`", "InvalidMessage", api(persist(mid="   "))),
    Hostile(
        "id-256-chars", "api", "message id of 256 characters", "InvalidMessage", api(persist(mid="m" * 256))
    ),
    Hostile(
        "id-not-a-string", "api", "message id `5` (an int)", "InvalidMessage", api(persist(mid=cast(Any, 5)))
    ),
    Hostile(
        "payload-lone-surrogate",
        "api",
        "payload `{'t': '\\ud800'}`",
        "InvalidPayload",
        api(persist(data={"t": SURROGATE})),
    ),
    Hostile(
        "payload-key-lone-surrogate",
        "api",
        "payload `{'\\udc00': 1}` (surrogate in a key)",
        "InvalidPayload",
        api(persist(data={"\udc00": 1})),
    ),
    Hostile(
        "payload-nul",
        "api",
        "payload `{'t': 'a\\x00b'}`",
        "InvalidPayload",
        api(persist(data={"t": "a" + NUL + "b"})),
    ),
    Hostile(
        "payload-nested-1200-lists",
        "api",
        f"payload nested {DEEP} lists deep",
        "InvalidPayload",
        api(persist(data=nested(DEEP))),
    ),
    Hostile(
        "payload-nested-1200-objects",
        "api",
        f"payload nested {DEEP} objects deep",
        "InvalidPayload",
        api(persist(data=nested(DEEP, "dict"))),
    ),
    Hostile(
        "payload-holds-itself",
        "api",
        "payload `d` where `d['self'] is d` (a cycle)",
        "InvalidPayload",
        api(persist(data=cyclic())),
    ),
    Hostile(
        "payload-nan", "api", "payload `{'x': nan}`", "InvalidPayload", api(persist(data={"x": math.nan}))
    ),
    Hostile(
        "payload-inf", "api", "payload `{'x': inf}`", "InvalidPayload", api(persist(data={"x": math.inf}))
    ),
    Hostile("payload-set", "api", "payload `{1, 2}` (a set)", "InvalidPayload", api(persist(data={1, 2}))),
    Hostile(
        "payload-colliding-keys",
        "api",
        "payload `{1: 'a', '1': 'b'}` (two keys, one JSON key)",
        "InvalidPayload",
        api(persist(data={1: "a", "1": "b"})),
    ),
    Hostile(
        "payload-too-large",
        "api",
        "payload of 300 KiB (above `MAX_PAYLOAD_BYTES`)",
        "PayloadTooLarge",
        api(persist(data={"x": "a" * 300 * 1024})),
    ),
    Hostile(
        "payload-non-string-keys",
        "api",
        "payload `{2: 'a', 10: 'b'}`, then `zeroloss_verify`",
        "canonicalised",
        canonicalised,
    ),
    Hostile(
        "conflicting-payload",
        "api",
        "id `p1` again with another payload",
        "MessageConflict",
        api(persist(mid="p1", data={"n": 2})),
    ),
    Hostile(
        "conflicting-queue",
        "api",
        "id `p1` again in another queue",
        "MessageConflict",
        api(persist(mid="p1", queue="other", data={"n": 1})),
    ),
    Hostile("delay-nan", "api", "`delay=nan`", "InvalidMessage", api(persist(delay=math.nan))),
    Hostile("delay-inf", "api", "`delay=inf`", "InvalidMessage", api(persist(delay=math.inf))),
    Hostile("delay-1e15", "api", "`delay=1e15`", "InvalidMessage", api(persist(delay=1e15))),
    Hostile(
        "delay-timedelta-max",
        "api",
        "`delay=timedelta.max`",
        "InvalidMessage",
        api(persist(delay=dt.timedelta.max)),
    ),
    Hostile("delay-negative", "api", "`delay=-1`", "InvalidMessage", api(persist(delay=-1))),
    Hostile("delay-string", "api", "`delay='5'`", "InvalidMessage", api(persist(delay="5"))),
    Hostile(
        "max-attempts-2-31", "api", "`max_attempts=2**31`", "InvalidMessage", api(persist(max_attempts=2**31))
    ),
    Hostile("max-attempts-zero", "api", "`max_attempts=0`", "InvalidMessage", api(persist(max_attempts=0))),
    Hostile(
        "max-attempts-bool", "api", "`max_attempts=True`", "InvalidMessage", api(persist(max_attempts=True))
    ),
    Hostile("priority-2-31", "api", "`priority=2**31`", "InvalidMessage", api(persist(priority=2**31))),
    Hostile(
        "ordering-key-newline",
        "api",
        "`ordering_key='k\\n'`",
        "InvalidMessage",
        api(persist(ordering_key="k\n")),
    ),
    Hostile(
        "ordered-and-delayed",
        "api",
        "`ordering_key='k', delay=5`",
        "InvalidMessage",
        api(persist(ordering_key="k", delay=5)),
    ),
    Hostile(
        "dedup-window-nan",
        "api",
        "`dedup_key='d', dedup_window=nan`",
        "InvalidMessage",
        api(persist(dedup_key="d", dedup_window=math.nan)),
    ),
    Hostile(
        "dedup-window-zero",
        "api",
        "`dedup_key='d', dedup_window=0`",
        "InvalidMessage",
        api(persist(dedup_key="d", dedup_window=0)),
    ),
    Hostile(
        "dedup-key-surrogate",
        "api",
        "`dedup_key='d\\ud800'`",
        "InvalidMessage",
        api(persist(dedup_key="d" + SURROGATE)),
    ),
    Hostile(
        "batch-one-bad-item",
        "api",
        "`persist_messages([good, {'x': nan}])`",
        "InvalidPayload",
        api(lambda s: s.service.persist_messages([("b1", QUEUE, {"n": 1}), ("b2", QUEUE, {"x": math.nan})])),
    ),
    Hostile(
        "batch-duplicate-id",
        "api",
        "`persist_messages` with one id twice",
        "InvalidMessage",
        api(lambda s: s.service.persist_messages([("b1", QUEUE, {"n": 1}), ("b1", QUEUE, {"n": 1})])),
    ),
    Hostile(
        "batch-item-not-a-tuple",
        "api",
        "`persist_messages(['b1'])`",
        "InvalidMessage",
        api(lambda s: s.service.persist_messages([cast(Any, "b1")])),
    ),
    Hostile(
        "send-many-ids-mismatch",
        "api",
        "`send_many` with 2 payloads and 1 id",
        "InvalidMessage",
        api(lambda _: zeroloss.send_many(QUEUE, [{"n": 1}, {"n": 2}], message_ids=["b1"])),
    ),
    Hostile(
        "send-many-nested-payload",
        "api",
        f"`send_many` with one payload nested {DEEP} deep",
        "InvalidPayload",
        api(lambda _: zeroloss.send_many(QUEUE, [{"n": 1}, nested(DEEP)])),
    ),
    Hostile(
        "send-many-payload-holds-itself",
        "api",
        "`send_many` with one payload that holds itself",
        "InvalidPayload",
        api(lambda _: zeroloss.send_many(QUEUE, [{"n": 1}, cyclic()])),
    ),
    # -- leases -----------------------------------------------------------------------------
    Hostile(
        "claim-limit-zero",
        "api",
        "`claim(queue, limit=0)`",
        "InvalidMessage",
        api(lambda s: s.service.claim(QUEUE, 0)),
    ),
    Hostile(
        "claim-queue-newline",
        "api",
        "`claim('hostile\\n')`",
        "InvalidMessage",
        api(lambda s: s.service.claim(QUEUE + "\n")),
    ),
    Hostile(
        "renew-token-not-a-uuid",
        "api",
        "`renew_lease('l1', 'not-a-uuid')`",
        "InvalidLeaseToken",
        api(lambda s: s.service.renew_lease("l1", "not-a-uuid")),
    ),
    Hostile(
        "ack-token-not-a-uuid",
        "api",
        "`acknowledge('l1', 12)`",
        "InvalidLeaseToken",
        api(lambda s: s.service.acknowledge("l1", cast(Any, 12))),
    ),
    Hostile(
        "ack-result-nan",
        "api",
        "`acknowledge(l1, token, result={'x': nan})`",
        "InvalidPayload",
        api(lambda s: s.service.acknowledge("l1", s.live.token, result={"x": math.nan})),
    ),
    Hostile(
        "complete-result-not-json",
        "api",
        "`record_outcomes([Completion(l1, ACKNOWLEDGE, result=object())])`",
        "InvalidPayload",
        api(lambda s: s.service.record_outcomes([Completion(s.live, Verdict.ACKNOWLEDGE, result=object())])),
    ),
    Hostile(
        "fail-error-nul",
        "api",
        "`fail(l1, token, 'boom\\x00')`",
        "sanitised",
        sanitised(
            lambda s: s.service.fail("l1", s.live.token, "boom" + NUL), "l1", "last_error", "boom\\x00"
        ),
    ),
    Hostile(
        "fail-error-surrogate",
        "api",
        "`fail(l1, token, 'boom\\ud800')`",
        "sanitised",
        sanitised(
            lambda s: s.service.fail("l1", s.live.token, "boom" + SURROGATE),
            "l1",
            "last_error",
            "boom\\ud800",
        ),
    ),
    Hostile(
        "complete-error-nul",
        "api",
        "`record_outcomes([Completion(l1, FAIL, error='x\\x00')])`",
        "sanitised",
        sanitised(
            lambda s: s.service.record_outcomes([Completion(s.live, Verdict.FAIL, error="x" + NUL)]),
            "l1",
            "last_error",
            "x\\x00",
        ),
    ),
    # -- operator methods, purge, sweep -----------------------------------------------------
    Hostile(
        "dead-letter-reason-nul",
        "api",
        "`dead_letter_messages(['p1'], reason='bad\\x00')`",
        "sanitised",
        sanitised(
            lambda s: s.service.dead_letter_messages(["p1"], reason="bad" + NUL),
            "p1",
            "last_error",
            "bad\\x00",
        ),
    ),
    Hostile(
        "dead-letter-reason-blank",
        "api",
        "`dead_letter_messages(['p1'], reason='  ')`",
        "InvalidMessage",
        api(lambda s: s.service.dead_letter_messages(["p1"], reason="  ")),
    ),
    Hostile(
        "dead-letter-ids-as-string",
        "api",
        "`dead_letter_messages('p1', reason='x')`",
        "InvalidMessage",
        api(lambda s: s.service.dead_letter_messages("p1", reason="x")),
    ),
    Hostile(
        "requeue-unknown-id",
        "api",
        "`requeue_messages(['s1', 'nope'])`",
        "MessageNotFound",
        api(lambda s: s.service.requeue_messages(["s1", "nope"])),
    ),
    Hostile(
        "redrive-unknown-id",
        "api",
        "`redrive_messages(['d1', 'nope'])`",
        "MessageNotFound",
        api(lambda s: s.service.redrive_messages(["d1", "nope"])),
    ),
    Hostile(
        "redrive-id-surrogate",
        "api",
        "`redrive_messages(['d\\ud800'])`",
        "InvalidMessage",
        api(lambda s: s.service.redrive_messages(["d" + SURROGATE])),
    ),
    Hostile(
        "purge-older-than-nan",
        "api",
        "`purge_messages(older_than=nan)`",
        "InvalidMessage",
        api(lambda s: s.service.purge_messages(older_than=math.nan)),
    ),
    Hostile(
        "purge-older-than-inf",
        "api",
        "`purge_messages(older_than=inf)`",
        "InvalidMessage",
        api(lambda s: s.service.purge_messages(older_than=math.inf)),
    ),
    Hostile(
        "purge-older-than-1e15",
        "api",
        "`purge_messages(older_than=1e15)`",
        "InvalidMessage",
        api(lambda s: s.service.purge_messages(older_than=1e15)),
    ),
    Hostile(
        "purge-older-than-timedelta-max",
        "api",
        "`purge_messages(older_than=timedelta.max)`",
        "InvalidMessage",
        api(lambda s: s.service.purge_messages(older_than=dt.timedelta.max)),
    ),
    Hostile(
        "purge-older-than-negative",
        "api",
        "`purge_messages(older_than=-1)`",
        "InvalidMessage",
        api(lambda s: s.service.purge_messages(older_than=-1)),
    ),
    Hostile(
        "purge-status-pending",
        "api",
        "`purge_messages(status='pending', older_than=0)`",
        "InvalidMessage",
        api(lambda s: s.service.purge_messages(status="pending", older_than=0)),
    ),
    Hostile(
        "purge-batch-size-zero",
        "api",
        "`purge_messages(older_than=0, batch_size=0)`",
        "InvalidMessage",
        api(lambda s: s.service.purge_messages(older_than=0, batch_size=0)),
    ),
    Hostile(
        "purge-queue-newline",
        "api",
        "`purge_messages(older_than=0, queue_name='hostile\\n')`",
        "InvalidMessage",
        api(lambda s: s.service.purge_messages(older_than=0, queue_name=QUEUE + "\n")),
    ),
    Hostile(
        "sweep-batch-size-negative",
        "api",
        "`sweep(batch_size=-1)`",
        "InvalidMessage",
        api(lambda s: s.service.sweep(batch_size=-1)),
    ),
    Hostile(
        "sweep-batch-size-zero",
        "api",
        "`sweep(batch_size=0)`",
        "InvalidMessage",
        api(lambda s: s.service.sweep(batch_size=0)),
    ),
    Hostile(
        "sweep-limit-zero",
        "api",
        "`sweep(limit=0)`",
        "InvalidMessage",
        api(lambda s: s.service.sweep(limit=0)),
    ),
    Hostile(
        "claim-limit-2-63",
        "api",
        "`claim(queue, limit=2**63)`",
        "InvalidMessage",
        api(lambda s: s.service.claim(QUEUE, 2**63)),
    ),
    Hostile(
        "purge-batch-size-2-63",
        "api",
        "`purge_messages(older_than=0, batch_size=2**63)`",
        "InvalidMessage",
        api(lambda s: s.service.purge_messages(older_than=0, batch_size=2**63)),
    ),
    Hostile(
        "sweep-limit-2-63",
        "api",
        "`sweep(limit=2**63)`",
        "InvalidMessage",
        api(lambda s: s.service.sweep(limit=2**63)),
    ),
    Hostile(
        "persist-actor-nul",
        "api",
        "`persist_message(..., actor='op\\x00')`",
        "InvalidMessage",
        api(persist(actor="op" + NUL)),
    ),
    Hostile(
        "requeue-actor-300-chars",
        "api",
        "`requeue_messages(['s1'], actor='x' * 300)`",
        "InvalidMessage",
        api(lambda s: s.service.requeue_messages(["s1"], actor="x" * 300)),
    ),
    Hostile(
        "service-instance-id-nul",
        "api",
        "`ZeroLossMessageService(instance_id='i\\x00')`, then a persist",
        "InvalidMessage",
        api(lambda _: ZeroLossMessageService(instance_id="i" + NUL).persist_message("x1", QUEUE, {})),
    ),
    Hostile(
        "service-unknown-database",
        "api",
        "`ZeroLossMessageService(using='nope')`, then a persist",
        "InvalidMessage",
        api(lambda _: ZeroLossMessageService(using="nope").persist_message("x1", QUEUE, {})),
    ),
    Hostile(
        "complete-unknown-verdict",
        "api",
        "`record_outcomes([Completion(l1, 'bogus')])`",
        "InvalidMessage",
        api(lambda s: s.service.record_outcomes([Completion(s.live, cast(Any, "bogus"))])),
    ),
    # -- node registration ------------------------------------------------------------------
    Hostile(
        "node-metadata-nan",
        "api",
        "`register_replication_node('n1', metadata={'zone': nan})`",
        "InvalidPayload",
        api(lambda s: s.service.register_replication_node("n1", metadata={"zone": math.nan})),
    ),
    Hostile(
        "node-metadata-nul",
        "api",
        "`register_replication_node('n1', metadata={'zone': '\\x00'})`",
        "InvalidPayload",
        api(lambda s: s.service.register_replication_node("n1", metadata={"zone": NUL})),
    ),
    Hostile(
        "node-metadata-surrogate",
        "api",
        "`register_replication_node('n1', metadata={'zone': '\\ud800'})`",
        "InvalidPayload",
        api(lambda s: s.service.register_replication_node("n1", metadata={"zone": SURROGATE})),
    ),
    Hostile(
        "node-metadata-list",
        "api",
        "`register_replication_node('n1', metadata=[1])`",
        "InvalidMessage",
        api(lambda s: s.service.register_replication_node("n1", metadata=cast(Any, [1]))),
    ),
    Hostile(
        "node-id-nul",
        "api",
        "`register_replication_node('n\\x00')`",
        "InvalidMessage",
        api(lambda s: s.service.register_replication_node("n" + NUL)),
    ),
    Hostile(
        "node-address-nul",
        "api",
        "`register_replication_node('n1', 'host\\x00')`",
        "InvalidMessage",
        api(lambda s: s.service.register_replication_node("n1", "host" + NUL)),
    ),
    Hostile(
        "node-role-unknown",
        "api",
        "`register_replication_node('n1', role='king')`",
        "InvalidMessage",
        api(lambda s: s.service.register_replication_node("n1", role="king")),
    ),
    # -- management commands ----------------------------------------------------------------
    Hostile(
        "cmd-nodes-metadata-nan",
        "command",
        "`zeroloss_nodes register n1 --metadata '{\"zone\": NaN}'`",
        "exit 2",
        command_line_case("zeroloss_nodes", "register", "n1", "--metadata", '{"zone": NaN}'),
    ),
    Hostile(
        "cmd-nodes-metadata-not-json",
        "command",
        "`zeroloss_nodes register n1 --metadata '{zone'`",
        "exit 2",
        command("zeroloss_nodes", "register", "n1", "--metadata", "{zone"),
    ),
    Hostile(
        "cmd-nodes-metadata-list",
        "command",
        "`zeroloss_nodes register n1 --metadata '[1]'`",
        "exit 2",
        command("zeroloss_nodes", "register", "n1", "--metadata", "[1]"),
    ),
    Hostile(
        "cmd-nodes-unknown-action",
        "command",
        "`zeroloss_nodes explode`",
        "exit 2",
        command("zeroloss_nodes", "explode"),
    ),
    Hostile(
        "cmd-nodes-register-no-id",
        "command",
        "`zeroloss_nodes register`",
        "exit 2",
        command("zeroloss_nodes", "register"),
    ),
    Hostile(
        "cmd-purge-older-than-999999d",
        "command",
        "`zeroloss_purge --older-than 999999d --yes`",
        "exit 2",
        command_line_case("zeroloss_purge", "--older-than", "999999d", "--yes"),
    ),
    Hostile(
        "cmd-purge-older-than-nan",
        "command",
        "`zeroloss_purge --older-than nan`",
        "exit 2",
        command("zeroloss_purge", "--older-than", "nan"),
    ),
    Hostile(
        "cmd-purge-older-than-negative",
        "command",
        "`zeroloss_purge --older-than -5d`",
        "exit 2",
        command("zeroloss_purge", "--older-than=-5d"),
    ),
    Hostile(
        "cmd-purge-batch-size-zero",
        "command",
        "`zeroloss_purge --older-than 1d --batch-size 0`",
        "exit 2",
        command("zeroloss_purge", "--older-than", "1d", "--batch-size", "0"),
    ),
    Hostile(
        "cmd-purge-unknown-queue",
        "command",
        "`zeroloss_purge --older-than 1d --queue nope --yes`",
        "exit 2",
        command("zeroloss_purge", "--older-than", "1d", "--queue", "nope", "--yes"),
    ),
    Hostile(
        "cmd-purge-status-pending",
        "command",
        "`zeroloss_purge --older-than 1d --status pending`",
        "exit 2",
        command("zeroloss_purge", "--older-than", "1d", "--status", "pending"),
    ),
    Hostile(
        "cmd-requeue-unknown-id",
        "command",
        "`zeroloss_requeue nope --yes`",
        "exit 2",
        command("zeroloss_requeue", "nope", "--yes"),
    ),
    Hostile(
        "cmd-requeue-id-surrogate",
        "command",
        "`zeroloss_requeue 'd\\ud800' --yes`",
        "exit 2",
        command("zeroloss_requeue", "d" + SURROGATE, "--yes"),
    ),
    Hostile(
        "cmd-requeue-older-than-999999d",
        "command",
        "`zeroloss_requeue --queue hostile --state dead --older-than 999999d --yes`",
        "exit 2",
        command_line_case(
            "zeroloss_requeue", "--queue", QUEUE, "--state", "dead", "--older-than", "999999d", "--yes"
        ),
    ),
    Hostile(
        "cmd-requeue-limit-negative",
        "command",
        "`zeroloss_requeue --queue hostile --state dead --limit -1`",
        "exit 2",
        command("zeroloss_requeue", "--queue", QUEUE, "--state", "dead", "--limit=-1"),
    ),
    Hostile(
        "cmd-requeue-ids-and-selection",
        "command",
        "`zeroloss_requeue d1 --queue hostile --state dead`",
        "exit 2",
        command("zeroloss_requeue", "d1", "--queue", QUEUE, "--state", "dead"),
    ),
    Hostile(
        "cmd-status-unknown-queue",
        "command",
        "`zeroloss_status --queue nope`",
        "exit 2",
        command("zeroloss_status", "--queue", "nope"),
    ),
    Hostile(
        "cmd-status-watch-nan",
        "command",
        "`zeroloss_status --watch nan --count 1`",
        "exit 2",
        command("zeroloss_status", "--watch", "nan", "--count", "1"),
    ),
    Hostile(
        "cmd-status-watch-inf",
        "command",
        "`zeroloss_status --watch inf --count 2`",
        "exit 2",
        manage("zeroloss_status", "--watch", "inf", "--count", "2"),
        committed=True,
    ),
    Hostile(
        "cmd-status-unknown-database",
        "command",
        "`zeroloss_status --database nope`",
        "exit 2",
        command("zeroloss_status", "--database", "nope"),
    ),
    Hostile(
        "cmd-status-bad-flag",
        "command",
        "`zeroloss_status --bogus`",
        "exit 2",
        command("zeroloss_status", "--bogus"),
    ),
    Hostile(
        "cmd-verify-sample-zero",
        "command",
        "`zeroloss_verify --sample 0`",
        "exit 2",
        command("zeroloss_verify", "--sample", "0"),
    ),
    Hostile(
        "cmd-verify-max-issues-huge",
        "command",
        "`zeroloss_verify --max-issues 1e99`",
        "exit 2",
        command("zeroloss_verify", "--max-issues", "1e99"),
    ),
    Hostile(
        "cmd-verify-unknown-queue",
        "command",
        "`zeroloss_verify --queue nope`",
        "exit 2",
        command("zeroloss_verify", "--queue", "nope"),
    ),
    Hostile(
        "cmd-sweep-batch-size-zero",
        "command",
        "`zeroloss_sweep --batch-size 0`",
        "exit 2",
        command("zeroloss_sweep", "--batch-size", "0"),
    ),
    Hostile(
        "cmd-sweep-interval-nan",
        "command",
        "`zeroloss_sweep --loop --interval nan`",
        "exit 2",
        command("zeroloss_sweep", "--loop", "--interval", "nan"),
    ),
    Hostile(
        "cmd-sweep-interval-inf",
        "command",
        "`zeroloss_sweep --loop --interval inf --max-runs 2`",
        "exit 2",
        manage("zeroloss_sweep", "--loop", "--interval", "inf", "--max-runs", "2"),
        committed=True,
    ),
    Hostile(
        "cmd-worker-unknown-queue",
        "command",
        "`zeroloss_worker --queue nope --burst`",
        "exit 2",
        command("zeroloss_worker", "--queue", "nope", "--burst"),
    ),
    Hostile(
        "cmd-worker-concurrency-zero",
        "command",
        "`zeroloss_worker --concurrency 0 --burst`",
        "exit 2",
        command("zeroloss_worker", "--concurrency", "0", "--burst"),
    ),
    Hostile(
        "cmd-worker-poll-interval-inf",
        "command",
        "`zeroloss_worker --poll-interval inf --burst`",
        "exit 2",
        command("zeroloss_worker", "--poll-interval", "inf", "--burst"),
    ),
    Hostile(
        "cmd-status-queue-not-utf8",
        "command",
        "`zeroloss_status --queue $'\\xff'` (bytes that are not UTF-8)",
        "exit 2",
        command_line_case("zeroloss_status", "--queue", "\udcff"),
    ),
    Hostile(
        "cmd-purge-queue-not-utf8",
        "command",
        "`zeroloss_purge --older-than 1d --queue $'\\xff' --yes`",
        "exit 2",
        command_line_case("zeroloss_purge", "--older-than", "1d", "--queue", "\udcff", "--yes"),
    ),
    Hostile(
        "cmd-nodes-register-not-utf8",
        "command",
        "`zeroloss_nodes register $'n\\xff'`",
        "exit 2",
        command_line_case("zeroloss_nodes", "register", "n\udcff"),
    ),
    Hostile(
        "cmd-nodes-unregister-not-utf8",
        "command",
        "`zeroloss_nodes unregister $'n\\xff'`",
        "exit 2",
        command_line_case("zeroloss_nodes", "unregister", "n\udcff"),
    ),
    Hostile(
        "cmd-purge-batch-size-2-63",
        "command",
        "`zeroloss_purge --older-than 0s --batch-size 9223372036854775808 --yes`",
        "exit 2",
        command_line_case("zeroloss_purge", "--older-than", "0s", "--batch-size", str(2**63), "--yes"),
    ),
    Hostile(
        "cmd-sweep-batch-size-2-63",
        "command",
        "`zeroloss_sweep --batch-size 9223372036854775808`",
        "exit 2",
        command("zeroloss_sweep", "--batch-size", str(2**63)),
    ),
    # -- the admin --------------------------------------------------------------------------
    Hostile(
        "admin-action-anonymous",
        "admin",
        "redrive action POSTed without a session",
        "HTTP 302 to login",
        admin_post("anonymous", CHANGELIST, action("redrive", "d1")),
    ),
    Hostile(
        "admin-action-staff-without-permission",
        "admin",
        "redrive action from staff without zeroloss permissions",
        "HTTP 403",
        admin_post("staff", CHANGELIST, action("redrive", "d1")),
    ),
    Hostile(
        "admin-action-other-permission",
        "admin",
        "purge action (confirmed) from a user who may only requeue",
        "HTTP 403",
        admin_post("requeue_message", CHANGELIST, action("purge_completed", "c1", post="yes")),
    ),
    Hostile(
        "admin-action-unknown-name",
        "admin",
        "action `drop_everything` from a superuser",
        "HTTP 400",
        admin_post("superuser", CHANGELIST, action("drop_everything", "p1")),
    ),
    Hostile(
        "admin-action-non-numeric-id",
        "admin",
        "redrive action with `_selected_action=abc`",
        "HTTP 400",
        admin_post("superuser", CHANGELIST, {"action": "redrive", "_selected_action": ["abc"], "index": "0"}),
    ),
    Hostile(
        "admin-action-csrf-missing",
        "admin",
        "redrive action without a CSRF token",
        "HTTP 403",
        admin_post("superuser", CHANGELIST, action("redrive", "d1"), csrf=True),
    ),
    Hostile(
        "admin-purge-page-csrf-missing",
        "admin",
        "purge page POST without a CSRF token",
        "HTTP 403",
        admin_post("superuser", lambda: reverse("admin:zeroloss_message_purge"), {}, csrf=True),
    ),
    Hostile(
        "admin-purge-page-without-permission",
        "admin",
        "purge page POST from a user who may only requeue",
        "HTTP 403",
        admin_post("requeue_message", lambda: reverse("admin:zeroloss_message_purge"), {}),
    ),
    Hostile(
        "admin-edit-forged",
        "admin",
        "change-form POST setting `status=completed`",
        "HTTP 403",
        admin_post(
            "superuser",
            lambda: reverse("admin:zeroloss_message_change", args=[Message.objects.get(message_id="p1").pk]),
            {"status": "completed"},
        ),
    ),
    Hostile(
        "admin-delete-forged",
        "admin",
        "delete-page POST `post=yes`",
        "HTTP 403",
        admin_post(
            "superuser",
            lambda: reverse("admin:zeroloss_message_delete", args=[Message.objects.get(message_id="p1").pk]),
            {"post": "yes"},
        ),
    ),
    Hostile(
        "admin-dead-letter-reason-nul",
        "admin",
        "dead-letter action with reason `'x\\x00y'`",
        "HTTP 200 form error",
        admin_post("superuser", CHANGELIST, action("dead_letter", "p1", post="yes", reason="x\x00y")),
    ),
    Hostile(
        "admin-queue-filter-nul",
        "admin",
        "changelist GET `?queue=%00` (NUL in the queue filter)",
        "HTTP 200",
        admin_get("superuser", CHANGELIST, {"queue": NUL}),
    ),
    # -- settings ---------------------------------------------------------------------------
    Hostile(
        "setting-ack-timeout-nan",
        "settings",
        "`ACK_TIMEOUT = nan`",
        "SettingError",
        setting(ACK_TIMEOUT=math.nan),
    ),
    Hostile(
        "setting-ack-timeout-inf",
        "settings",
        "`ACK_TIMEOUT = inf`",
        "SettingError",
        setting(ACK_TIMEOUT=math.inf),
    ),
    Hostile(
        "setting-ack-timeout-1e10",
        "settings",
        "`ACK_TIMEOUT = 1e10`",
        "SettingError",
        setting(ACK_TIMEOUT=1e10),
    ),
    Hostile(
        "setting-ack-timeout-negative",
        "settings",
        "`ACK_TIMEOUT = -1`",
        "SettingError",
        setting(ACK_TIMEOUT=-1),
    ),
    Hostile(
        "setting-ack-timeout-string",
        "settings",
        "`ACK_TIMEOUT = '5'`",
        "SettingError",
        setting(ACK_TIMEOUT="5"),
    ),
    Hostile(
        "setting-max-attempts-10-10",
        "settings",
        "`MAX_ATTEMPTS = 10**10`",
        "SettingError",
        setting(MAX_ATTEMPTS=10**10),
    ),
    Hostile(
        "setting-max-attempts-float",
        "settings",
        "`MAX_ATTEMPTS = 5.0`",
        "SettingError",
        setting(MAX_ATTEMPTS=5.0),
    ),
    Hostile(
        "setting-sweep-batch-2-31",
        "settings",
        "`SWEEP_BATCH_SIZE = 2**31`",
        "SettingError",
        setting(SWEEP_BATCH_SIZE=2**31),
    ),
    Hostile(
        "setting-heartbeat-inf",
        "settings",
        "`HEARTBEAT_INTERVAL = inf`",
        "SettingError",
        setting(HEARTBEAT_INTERVAL=math.inf),
    ),
    Hostile(
        "setting-backoff-base-nan",
        "settings",
        "`RETRY_BACKOFF = {'BASE': nan}`",
        "SettingError",
        setting(RETRY_BACKOFF={"BASE": math.nan}),
    ),
    Hostile(
        "setting-payload-bytes-zero",
        "settings",
        "`MAX_PAYLOAD_BYTES = 0`",
        "SettingError",
        setting(MAX_PAYLOAD_BYTES=0),
    ),
    Hostile(
        "setting-transport-unknown",
        "settings",
        "`TRANSPORT = 'kafka'`",
        "SettingError",
        setting(TRANSPORT="kafka"),
    ),
    Hostile(
        "setting-ledger-databases-empty",
        "settings",
        "`LEDGER_DATABASES = []`",
        "SettingError",
        setting(LEDGER_DATABASES=[]),
    ),
    Hostile(
        "setting-unknown-key",
        "settings",
        "`ACK_TIMEOUTS = 5` (a typo)",
        "SettingError",
        setting(ACK_TIMEOUTS=5),
    ),
    Hostile(
        "setting-sweep-queue-newline",
        "settings",
        "`SWEEP_QUEUE = 'zeroloss.sweep\\n'`",
        "SettingError",
        setting(SWEEP_QUEUE="zeroloss.sweep\n"),
    ),
    Hostile(
        "setting-ledger-databases-unknown-alias",
        "settings",
        "`LEDGER_DATABASES = ['default', 'nope']`",
        "SettingError",
        setting(LEDGER_DATABASES=["default", "nope"]),
    ),
    Hostile(
        "setting-not-a-dict",
        "settings",
        "`ZEROLOSS = ['ACK_TIMEOUT', 5]`",
        "SettingError",
        whole_setting(["ACK_TIMEOUT", 5]),
    ),
    Hostile(
        "service-override-max-attempts-10-10",
        "settings",
        "`ZeroLossMessageService(max_attempts=10**10)`",
        "SettingError",
        api(lambda _: ZeroLossMessageService(max_attempts=10**10)),
    ),
]


@pytest.fixture(autouse=True)
def _hostile_handler():
    """A handler for the queue (``send`` refuses queues without one), removed afterwards."""
    registry = dict(handlers._registry)
    zeroloss.handler(QUEUE)(lambda delivery: None)
    yield
    handlers._registry.clear()
    handlers._registry.update(registry)


def throw(case: Hostile) -> None:
    ledger = seed()
    before = snapshot()
    answer = case.run(ledger)
    assert answer == case.answer, f"{case.id}: {case.input} was answered {answer!r}, expected {case.answer!r}"
    if case.answer not in ("sanitised", "canonicalised"):  # they check what they changed
        assert snapshot() == before, f"{case.id}: {case.input} changed the database"


IN_PROCESS = [c for c in CASES if not c.committed]
COMMITTED = [c for c in CASES if c.committed]


@pytest.mark.timeout(120)
@pytest.mark.django_db
@pytest.mark.parametrize("case", IN_PROCESS, ids=[c.id for c in IN_PROCESS])
def test_hostile_input(case: Hostile) -> None:
    throw(case)


@pytest.mark.timeout(120)
@pytest.mark.process
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("case", COMMITTED, ids=[c.id for c in COMMITTED])
def test_hostile_input_on_the_command_line(case: Hostile) -> None:
    """Cases a separate ``manage.py`` process reads the ledger for: the data is committed."""
    throw(case)


def test_at_least_forty_hostile_inputs_with_unique_ids() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
    assert len(ids) >= 40


def _documented() -> dict[str, str]:
    """The rows of the table in docs/guarantees.md, section "Hostile input": id -> answer."""
    text = (ROOT / "docs" / "guarantees.md").read_text(encoding="utf-8")
    section = text.split("\n## Hostile input\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) == 4 and (m := re.fullmatch(r"`([a-z0-9-]+)`", cells[0])):
            rows[m[1]] = cells[3]
    return rows


def test_the_docs_table_lists_every_hostile_input_with_its_answer() -> None:
    documented = _documented()
    expected = {c.id: c.answer for c in CASES}
    assert sorted(set(expected) - set(documented)) == [], "cases missing from docs/guarantees.md"
    assert sorted(set(documented) - set(expected)) == [], "documented cases that no test throws"
    wrong = {k: (documented[k], v) for k, v in expected.items() if documented[k] != v}
    assert wrong == {}, "answers in docs/guarantees.md differ from the tests"


def test_random_token_is_refused_not_an_error(db: None) -> None:
    """A well-formed but wrong token is not hostile: it is refused with False, nothing written."""
    ledger = seed()
    before = snapshot()
    assert ledger.service.acknowledge("l1", uuid.uuid4()) is False
    assert snapshot() == before
