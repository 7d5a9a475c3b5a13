"""Input checks and canonical forms. Everything here raises before anything is written.

Each check refuses what the database would otherwise reject half-way (``DataError``), store
differently from what was hashed, or accept and then never serve (a queue no worker can name).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import re
import secrets
import socket
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from ..core.names import MAX_QUEUE_NAME_LENGTH as MAX_QUEUE_NAME_LENGTH
from ..core.names import QUEUE_NAME_RE as QUEUE_NAME_RE
from ..core.names import validate_queue_name as validate_queue_name
from ..core.setting_values import MAX_SECONDS as MAX_SECONDS  # the longest delay, window or age
from ..core.settings import json_default
from ..exceptions import HeadersTooLarge, InvalidHeaders, InvalidMessage, InvalidPayload

MAX_MESSAGE_ID_LENGTH = 255
MAX_ERROR_LENGTH = 10_000
#: Attempts fit the database's 32-bit column with room for the counter to move.
MAX_ATTEMPTS_LIMIT = 1_000_000
PRIORITY_RANGE = (-100, 100)
#: Deepest payload nesting accepted (PostgreSQL's jsonb and Python's json both stop near here).
MAX_DEPTH = 500

_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
# A JSON number with a fraction or exponent (a string that merely looks like one costs only a
# second, normalising encode).
_FLOAT_RE = re.compile(r"\d[.eE]")


def default_instance_id() -> str:
    """``host:pid:random``: unique per process, recorded as the actor of its transitions."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def _encodable(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def validate_message_id(message_id: Any, what: str = "message_id") -> str:
    """``message_id`` if it is a valid message id (also used for keys); else :class:`InvalidMessage`."""
    if not isinstance(message_id, str) or not message_id.strip():
        raise InvalidMessage(f"{what} must be a non-empty string, got {message_id!r}.")
    if len(message_id) > MAX_MESSAGE_ID_LENGTH:
        raise InvalidMessage(f"{what} is {len(message_id)} characters; the limit is {MAX_MESSAGE_ID_LENGTH}.")
    if _CONTROL_RE.search(message_id):
        raise InvalidMessage(f"{what} must not contain control characters, got {message_id!r}.")
    try:  # _encodable, inline: this runs for every message stored
        message_id.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidMessage(
            f"{what} is not valid Unicode text (a lone surrogate?), got {message_id!r}."
        ) from None
    return message_id


def validate_key(key: Any, what: str) -> str:
    """An ordering or deduplication key: ``""`` means none."""
    if key is None or key == "":
        return ""
    return validate_message_id(key, what)


def validate_attempts(value: Any, what: str = "max_attempts") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ATTEMPTS_LIMIT:
        raise InvalidMessage(f"{what} must be an integer from 1 to {MAX_ATTEMPTS_LIMIT}, got {value!r}.")
    return value


def validate_priority(value: Any) -> int:
    low, high = PRIORITY_RANGE
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidMessage(f"priority must be an integer from {low} to {high}, got {value!r}.")
    return value


#: Largest batch size or limit accepted: a 32-bit integer, which both databases take as a
#: ``LIMIT`` (a larger one is a ``DataError`` on PostgreSQL and an ``OverflowError`` on SQLite).
MAX_COUNT = 2**31 - 1


def validate_count(value: Any, what: str) -> int:
    """A positive whole number (batch sizes, limits), at most :data:`MAX_COUNT`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
        raise InvalidMessage(f"{what} must be an integer from 1 to {MAX_COUNT}, got {value!r}.")
    return value


def seconds(value: float | dt.timedelta | None, what: str) -> float:
    """A non-negative, finite duration of at most 100 years, in seconds (``None`` is 0)."""
    if value is None:
        return 0.0
    try:
        total = value.total_seconds() if isinstance(value, dt.timedelta) else value
    except OverflowError:  # pragma: no cover - timedelta.total_seconds() does not overflow today
        total = math.inf
    if isinstance(total, bool) or not isinstance(total, int | float) or not math.isfinite(total) or total < 0:
        raise InvalidMessage(
            f"{what} must be a non-negative number of seconds or a timedelta, got {value!r}."
        )
    if total > MAX_SECONDS:
        raise InvalidMessage(f"{what} of {total:g}s is more than 100 years; nothing could wait that long.")
    return float(total)


def clean_text(text: Any, limit: int = MAX_ERROR_LENGTH) -> str:
    """Any text made storable: NUL and lone surrogates escaped (PostgreSQL and UTF-8 refuse
    them), then cut to ``limit`` characters. Used for error texts and reasons, which must be
    recorded whatever a handler raised."""
    value = str(text)
    if "\x00" in value:
        value = value.replace("\x00", "\\x00")
    if not _encodable(value):
        value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value[:limit]


def _canonical(value: Any, depth: int = 0, integral: bool = True) -> Any:
    """The value as it is hashed: object keys as strings, integral floats as integers (with
    ``integral=False``, as it is stored: the keys only)."""
    if depth > MAX_DEPTH:
        raise InvalidPayload(f"Payload is nested more than {MAX_DEPTH} levels deep.")
    if isinstance(value, float):
        # jsonb normalises numbers (1e16 -> 10000000000000000, -0.0 -> -0); hashing integral
        # floats as the integers they equal keeps checksums stable across the round trip.
        return int(Decimal(repr(value))) if integral and value.is_integer() else value
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if isinstance(k, str):
                key = k
            elif isinstance(k, bool | int | float) or k is None:
                key = json.dumps(k, allow_nan=False)  # what json.dumps does: 1 -> "1", True -> "true"
            else:
                raise InvalidPayload(f"Payload object keys must be strings, got {k!r}.")
            if key in out:
                raise InvalidPayload(f"Payload object has two keys that both become {key!r} in JSON.")
            out[key] = _canonical(v, depth + 1, integral)
        return out
    if isinstance(value, list | tuple):
        return [_canonical(v, depth + 1, integral) for v in value]
    return value


_CONTAINERS = (dict, list, tuple)


def _needs_canonical(value: Any) -> bool:
    """Cheap pre-check: does the payload hold a non-string key? (the common case has none)

    Plain loops that descend into containers only: this runs for every message sent.
    """
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str) or (isinstance(v, _CONTAINERS) and _needs_canonical(v)):
                return True
    elif isinstance(value, list | tuple):
        for v in value:
            if isinstance(v, _CONTAINERS) and _needs_canonical(v):
                return True
    return False


def _default(value: Any) -> Any:
    """What ``ZEROLOSS["JSON_ENCODER"]`` makes of a value JSON has no type for (``datetime``,
    ``Decimal``, ``UUID`` with Django's ``DjangoJSONEncoder``); ``TypeError`` without one. Called
    by the encoder only for such values: a payload of plain JSON types never gets here."""
    custom = json_default()
    if custom is None:
        raise TypeError(
            f"Object of type {type(value).__name__} is not JSON serializable: convert it before sending, "
            "or set ZEROLOSS['JSON_ENCODER'] to an encoder that handles it (for datetime, Decimal and "
            "UUID: 'django.core.serializers.json.DjangoJSONEncoder')"
        )
    try:
        return custom(value)
    except TypeError as exc:
        raise TypeError(f"{exc} (ZEROLOSS['JSON_ENCODER'] does not handle it either)") from None


# One encoder for every call: json.dumps with options builds a new one each time.
_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_default
)
# CPython's C encoder, made once (JSONEncoder.encode makes one for every call), without the
# circular-reference markers: a cycle recurses until RecursionError, refused below as too deep
# (a markers dict shared between calls could keep stale entries after an error).
_make_c_encoder: Any = json.encoder.c_make_encoder  # type: ignore[attr-defined]
_c_encoder: Any = (
    None
    if _make_c_encoder is None
    else _make_c_encoder(
        None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",", True, False, False
    )
)


def _encode(data: Any) -> str:
    if _c_encoder is None or isinstance(data, str):
        return _ENCODER.encode(data)
    return "".join(_c_encoder(data, 0))


def _floatstr(value: float) -> str:
    """A float as JSON that both databases give back as a float: ``1e+16`` (which jsonb stores
    as the integer 10000000000000000) as ``10000000000000000.0``."""
    if value != value or value in (math.inf, -math.inf):
        raise ValueError(f"Out of range float values are not JSON compliant: {value!r}")
    text = float.__repr__(value)
    return f"{int(value)}.0" if "e+" in text else text


# The pure-Python encoder with that float spelling: used only for a payload whose text has an
# exponent (an integral float of 1e16 or more; or a string holding "e+").
_iterencode_floats: Any = json.encoder._make_iterencode(  # type: ignore[attr-defined]
    None, _default, json.encoder.encode_basestring, None, _floatstr, ":", ",", True, False, True
)


def _with_floats(data: Any) -> str:
    return "".join(_iterencode_floats(data, 0))


def canonical_json(data: Any) -> str:
    """The JSON text that is stored: keys sorted, no whitespace, ``ensure_ascii`` off, and floats
    kept floats (``1.0`` is read back as ``1.0``). Its checksum is :func:`payload_checksum`'s.
    Values JSON has no type for go through ``ZEROLOSS["JSON_ENCODER"]``. Raises
    :class:`InvalidPayload`."""
    try:
        if _needs_canonical(data):
            data = _canonical(data, integral=False)
        encoded = _encode(data)
        if "e+" in encoded:
            encoded = _with_floats(data)
    except RecursionError:
        raise InvalidPayload(
            f"Payload is nested more than {MAX_DEPTH} levels deep (or holds itself)."
        ) from None
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"Payload is not JSON-serialisable: {exc}.") from exc
    if encoded.count("[") + encoded.count("{") > MAX_DEPTH and _depth(encoded) > MAX_DEPTH:
        raise InvalidPayload(f"Payload is nested more than {MAX_DEPTH} levels deep.")
    if "\\u0000" in encoded and _has_nul(data):
        raise InvalidPayload("Payload contains a NUL character (\\u0000), which PostgreSQL cannot store.")
    try:  # _encodable, inline
        encoded.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidPayload("Payload holds text that is not valid Unicode (a lone surrogate?).") from None
    return encoded


#: ``json.loads`` of a :func:`canonical_json` text (no whitespace around it) without its two
#: Python-level layers, for what is stored with every message: ``scan_json(text, 0)[0]``.
scan_json: Callable[[str, int], tuple[Any, int]] = json.decoder.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _depth(encoded: str) -> int:
    depth = deepest = 0
    in_string = escaped = False
    for ch in encoded:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_has_nul(v) for v in value)
    return False


def checksum_text(encoded: str) -> str:
    """The text a payload is hashed as: its :func:`canonical_json` text, with every integral float
    written as the integer it equals (``{"a": 1.0}`` as ``{"a":1}``). Numbers count by value, as
    JSON has one number type: ``1.0`` and ``1`` hash the same, and so a resend of either is the
    same message; the checksum of a stored payload is the same whichever database read it back
    (and the same as zeroloss 0.2 computed, when every payload was stored that way)."""
    if _FLOAT_RE.search(encoded):
        return _encode(_canonical(scan_json(encoded, 0)[0]))
    return encoded


#: Longest header name accepted.
MAX_HEADER_NAME_LENGTH = 255


def encode_headers(headers: Any, limit: int) -> str | None:
    """A message's headers as the JSON text stored, or None for none (``None`` or ``{}``).

    A dict of names to JSON values: each name a non-empty string of at most 255 characters
    without control characters; the values as payloads are (:func:`canonical_json`, so
    ``JSON_ENCODER`` applies); at most ``limit`` bytes of JSON. Raises :class:`InvalidHeaders`
    (:class:`HeadersTooLarge`)."""
    if headers is None:
        return None
    if not isinstance(headers, dict):
        raise InvalidHeaders(f"headers must be a dict of names to JSON values, got {type(headers).__name__}.")
    if not headers:
        return None
    for name in headers:
        if not isinstance(name, str) or not name.strip():
            raise InvalidHeaders(f"header names must be non-empty strings, got {name!r}.")
        if len(name) > MAX_HEADER_NAME_LENGTH or _CONTROL_RE.search(name) or not _encodable(name):
            raise InvalidHeaders(
                f"header name {name[:80]!r} must be at most {MAX_HEADER_NAME_LENGTH} characters of valid "
                "text without control characters."
            )
    try:
        encoded = canonical_json(headers)
    except InvalidPayload as exc:
        raise InvalidHeaders(str(exc).replace("Payload", "Headers", 1)) from None
    if len(encoded) * 4 > limit and (size := len(encoded.encode("utf-8"))) > limit:
        raise HeadersTooLarge(
            f"Headers are {size} bytes of JSON; the limit is {limit} (ZEROLOSS['MAX_HEADERS_BYTES'])."
        )
    return encoded


def payload_checksum(encoded: str) -> str:
    """SHA-256 of :func:`checksum_text` of a :func:`canonical_json` text."""
    if _FLOAT_RE.search(encoded):  # checksum_text, inline: this runs for every message stored
        encoded = _encode(_canonical(scan_json(encoded, 0)[0]))
    return hashlib.sha256(encoded.encode("utf-8")).hexdigest()
