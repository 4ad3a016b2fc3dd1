"""Bytes <-> typed events. Bad input becomes a ``Rejection`` naming what is wrong, never an exception.

Every record is checked before a parser sees it (``check_json``): its size, its JSON nesting depth
and its number of JSON values are bounded, and invalid UTF-8 or a lone UTF-16 surrogate escape is a
decode error. msgspec recurses into nested arrays and objects, and a record nested ~1,000 deep made
it raise ``RecursionError``; invalid UTF-8 in a string raised ``UnicodeDecodeError``. Anything a
decoder still raises is caught and becomes a ``poison`` rejection naming the exception, so a
consumer that decodes through here never stops on a record.

>>> decode_trace(b'{"nope', max_bytes=100).reason.split(':')[0]
'undecodable'
>>> decode_trace(b'x' * 200, max_bytes=100).reason
'oversized: 200 bytes > limit 100'
>>> decode_trace(b'[' * 1000 + b']' * 1000, max_bytes=10_000).reason
'oversized: JSON nested 1000 deep > limit 64'
>>> decode_trace(b'{"type": "\\xff"}', max_bytes=100).reason
'undecodable: invalid UTF-8 at byte 10'
>>> r = decode_trace(b'{"type":"tool_call","seq":"1"}', max_bytes=1000)
>>> r.reason.startswith('schema:')
True
"""

from __future__ import annotations

import ast
import re
import warnings
from collections.abc import Sequence
from datetime import timezone
from typing import Any, cast

import msgspec
import numpy as np
import orjson

from somnus.schemas.episodes import EpisodeDistilled
from somnus.schemas.events import TraceEvent

MAX_DEPTH = 64  # JSON nesting (arrays and objects) of one record: SOMNUS_MAX_JSON_DEPTH
MAX_VALUES = 100_000  # JSON values in one trace record (an upper bound: commas and containers)
MAX_BUNDLE_EVENTS = 10_000  # events in one bundle record (the client sends at most 64)
MAX_ORIGINAL = 512 * 1024  # bytes of a rejected record a dead letter keeps (under the broker's default limit)
MAX_REASON = 3_000  # characters of a dead letter's reason (a Kafka header)
# The value of the record a consumer reads in place of a record batch it could not decompress
# (streams/kafka_compat/decompression.py), followed by why: every check_json rejects it with that reason.
UNREADABLE_MAGIC = b"\x00somnus-unreadable/1\x00"


class Rejection(msgspec.Struct, frozen=True):
    """Why an input could not be accepted; its kind is the reason's prefix: ``oversized``,
    ``undecodable``, ``schema``, ``poison`` (a decoder raised), or a judgement of the worker or the
    projector (``late``, ``order``, ``future``, ``duplicate``)."""

    reason: str
    original: bytes | None = None  # the bytes of the rejected element, when it came in a bundle

    @property
    def kind(self) -> str:
        return self.reason.split(":", 1)[0]


def poison_reason(exc: BaseException, where: str = "") -> str:
    """The reason of a record that made a decoder (or a fold) raise: the exception's class and message.

    >>> poison_reason(RecursionError("maximum recursion depth exceeded"), "while folding facts")
    'poison: RecursionError while folding facts: maximum recursion depth exceeded'
    """
    text = f"poison: {type(exc).__name__}{' ' + where if where else ''}: {exc}"
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"


# ---- the checks before any parser ------------------------------------------------------------

_NOT_STRUCTURE = bytes(range(256)).translate(None, b'[]{}",')  # every byte but brackets, quotes, commas
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_PAIR = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}")


def json_shape(raw: bytes) -> tuple[int, int]:
    """``(depth, values)``: an upper bound of the nesting depth a JSON parser reaches on ``raw`` and
    of the number of values it holds, without parsing it (C-speed byte operations and one numpy pass).

    Escaped backslashes and escaped quotes are removed first, then every byte but brackets, quotes
    and commas; what is between a pair of quotes is a string's content and is dropped. On any valid
    prefix of ``raw`` this splits strings exactly as a parser does, and a parser stops at the first
    invalid byte, so the depth it reaches is never above the one returned.

    >>> json_shape(b'{"a": [1, 2, {"b": "]]]"}], "c": "\\\\"[["}')
    (3, 7)
    >>> json_shape(b'[' * 5000)
    (5000, 5001)
    """
    s = raw
    if b"\\" in s:
        s = s.replace(b"\\\\", b"").replace(b'\\"', b"")
    codes = np.frombuffer(s.translate(None, _NOT_STRUCTURE), np.uint8)
    quotes = codes == 34
    outside = ~quotes & ((np.cumsum(quotes, dtype=np.int64) & 1) == 0)  # not between a pair of quotes
    codes = codes[outside]
    commas = codes == 44
    brackets = codes[~commas]
    if not brackets.size:
        return 0, int(commas.sum()) + 1
    # '[' 0x5B and '{' 0x7B have bit 1 set, ']' 0x5D and '}' 0x7D do not: +1 / -1
    steps = ((brackets >> 1) & 1).astype(np.int64) * 2 - 1
    depth = int(np.cumsum(steps).max(initial=0))
    return max(depth, 0), int(commas.sum()) + int((steps > 0).sum()) + 1


def check_json(
    raw: bytes, max_bytes: int | None = None, max_depth: int = MAX_DEPTH, max_values: int | None = MAX_VALUES
) -> str | None:
    """Why ``raw`` must not reach a JSON parser (a rejection reason), or None when it may.

    ``oversized`` beyond ``max_bytes`` (None: no limit), nested deeper than ``max_depth``, or holding
    more than ``max_values`` values (None: no limit); ``undecodable`` when it is not UTF-8 or holds a
    lone UTF-16 surrogate escape (``"\\ud800"``: no text can hold it), or when it stands for a record
    batch the consumer could not decompress (``UNREADABLE_MAGIC``).

    >>> check_json(b'{"a": "\\\\ud83d\\\\ude00"}') is None
    True
    >>> check_json(b'{"a": "\\\\ud800"}')
    'undecodable: a lone UTF-16 surrogate escape (\\\\ud800)'
    """
    if raw.startswith(UNREADABLE_MAGIC):
        return "undecodable: " + raw[len(UNREADABLE_MAGIC) : MAX_REASON].decode(errors="replace")
    if max_bytes is not None and len(raw) > max_bytes:
        return f"oversized: {len(raw)} bytes > limit {max_bytes}"
    openers = raw.count(b"[") + raw.count(b"{")
    # a value takes a byte and all but one a separator: a short record cannot hold too many
    many = max_values is not None and len(raw) > 2 * max_values and raw.count(b",") + openers >= max_values
    if openers > max_depth or many:
        depth, values = json_shape(raw)
        if depth > max_depth:
            return f"oversized: JSON nested {depth} deep > limit {max_depth}"
        if max_values is not None and values > max_values:
            return f"oversized: {values} JSON values > limit {max_values}"
    if not raw.isascii():
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return f"undecodable: invalid UTF-8 at byte {exc.start}"
    if b"\\u" in raw:
        lone = _lone_surrogate(raw)
        if lone is not None:
            return f"undecodable: a lone UTF-16 surrogate escape ({lone})"
    return None


def _lone_surrogate(raw: bytes) -> str | None:
    s = raw.replace(b"\\\\", b"")  # what remains of "\u" is an escape
    if not _SURROGATE.search(s):
        return None
    found = _SURROGATE.search(_PAIR.sub(b"", s))
    return found.group(0).decode() if found else None


def _in_utc(ev: Any) -> str | None:
    """Why an event's time is unusable: one at the ends of the calendar that UTC cannot express."""
    if ev.ts.year not in (1, 9999):
        return None
    try:
        ev.ts.astimezone(timezone.utc)
    except (OverflowError, ValueError):
        return f"schema: ts {ev.ts.isoformat()} is out of range once in UTC - at `$.ts`"
    return None


# ---- trace events ----------------------------------------------------------------------------

_trace_decoder = msgspec.json.Decoder(TraceEvent)
_episode_decoder = msgspec.json.Decoder(EpisodeDistilled)
_encoder = msgspec.json.Encoder()


def decode_trace(raw: bytes | None, max_bytes: int, max_depth: int = MAX_DEPTH) -> TraceEvent | Rejection:
    """Decode and validate one trace event. Never raises."""
    try:
        if raw is None:
            return Rejection("undecodable: empty message (no value)")
        why = check_json(raw, max_bytes, max_depth)
        if why is not None:
            return Rejection(why)
        return _decode_checked(raw)
    except Exception as exc:  # noqa: BLE001 - the boundary: whatever a decoder raises rejects the record
        return Rejection(poison_reason(exc))


def _decode_checked(raw: bytes) -> TraceEvent | Rejection:
    """``raw`` decoded, once ``check_json`` let it through."""
    try:
        ev = _trace_decoder.decode(raw)
    except msgspec.ValidationError as exc:
        if "Expected `int`, got `float`" in str(exc):
            return _decode_integral_floats(raw, exc)
        return Rejection(f"schema: {exc}")
    except msgspec.DecodeError as exc:
        return Rejection(f"undecodable: {exc}")
    why = _in_utc(ev)
    return ev if why is None else Rejection(why)


def _integral(obj: Any) -> Any:
    if isinstance(obj, float) and obj.is_integer():
        return int(obj)
    if isinstance(obj, dict):
        return {k: _integral(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_integral(v) for v in obj]
    return obj


def _decode_integral_floats(raw: bytes, exc: msgspec.ValidationError) -> TraceEvent | Rejection:
    """JSON Schema's ``integer`` includes 1.0 (what some encoders write for a whole float), msgspec's
    ``int`` does not: an event the contract accepts is decoded with its whole floats made ints.
    Only this error takes the slower path; a fraction (1.5) is still rejected, by the same rule.
    (Its recursion is bounded by ``check_json``'s depth limit.)"""
    try:
        ev = _trace_decoder.decode(_encoder.encode(_integral(msgspec.json.decode(raw))))
    except msgspec.ValidationError as again:
        return Rejection(f"schema: {again}")
    except msgspec.DecodeError:
        return Rejection(f"schema: {exc}")
    why = _in_utc(ev)
    return ev if why is None else Rejection(why)


_bundle_decoder = msgspec.json.Decoder(list[msgspec.Raw])
_events_decoder = msgspec.json.Decoder(list[TraceEvent])


def decode_record(
    raw: bytes | None, max_bytes: int, max_depth: int = MAX_DEPTH, max_events: int = MAX_BUNDLE_EVENTS
) -> list[TraceEvent | Rejection]:
    """Decode one Kafka record of the traces topic: one event, or a bundle (JSON array) of events.
    Never raises: whatever a decoder raises is one ``poison`` rejection of the record.

    Runtimes that publish at high rates send bundles: one record for several consecutive events of
    one session, which amortises the per-record cost of the stream processor. Each element is
    validated on its own, so one bad event in a bundle rejects only that event (``record_rejection``
    makes the record's rejected elements one dead letter).

    >>> [type(x).__name__ for x in decode_record(b'[1, {"a": 2}]', 100)]
    ['Rejection', 'Rejection']
    >>> decode_record(b'[]', 100)[0].reason
    'schema: an empty bundle (a record must hold at least one event)'
    """
    try:
        if raw is None or not raw.lstrip()[:1] == b"[":
            return [decode_trace(raw, max_bytes, max_depth)]
        return _decode_bundle(raw, max_bytes, max_depth, max_events)
    except Exception as exc:  # noqa: BLE001 - the boundary (see decode_trace)
        return [Rejection(poison_reason(exc))]


def _decode_bundle(raw: bytes, max_bytes: int, max_depth: int, max_events: int) -> list[TraceEvent | Rejection]:
    # The record as a whole: its elements one level deeper than an event, UTF-8, and a bound on its
    # values (each element is then held to the limits of an event).
    why = check_json(raw, None, max_depth + 1, 4 * MAX_VALUES)
    if why is not None:
        return [
            Rejection(
                why.replace(
                    f"> limit {max_depth + 1}",
                    f"> limit {max_depth + 1} ({max_depth} for an event, one more for its bundle)",
                )
            )
        ]
    if len(raw) <= max_bytes and raw.count(b",") + raw.count(b"[") + raw.count(b"{") < MAX_VALUES:
        # then so is each element, in bytes and values: when all are valid, one decode does it
        try:
            events: list[TraceEvent] = _events_decoder.decode(raw)
        except msgspec.DecodeError:  # ValidationError included
            pass  # some element is not valid (or an integral float needs its slower path): one by one
        else:
            if events and len(events) <= max_events and all(_in_utc(ev) is None for ev in events):
                return cast("list[TraceEvent | Rejection]", events)  # a list is read, never widened
    return _decode_elements(raw, max_bytes, max_depth, max_events)


def _decode_elements(
    raw: bytes, max_bytes: int, max_depth: int = MAX_DEPTH, max_events: int = MAX_BUNDLE_EVENTS
) -> list[TraceEvent | Rejection]:
    """A bundle's elements decoded one by one (what ``decode_record`` returns for any bundle)."""
    try:
        elements = _bundle_decoder.decode(raw)
    except msgspec.DecodeError as exc:
        return [Rejection(f"undecodable: {exc}")]
    if not elements:
        return [Rejection("schema: an empty bundle (a record must hold at least one event)")]
    if len(elements) > max_events:
        return [Rejection(f"oversized: a bundle of {len(elements)} events > limit {max_events}")]
    out: list[TraceEvent | Rejection] = []
    for element in elements:
        item = decode_trace(bytes(element), max_bytes, max_depth)
        out.append(Rejection(item.reason, bytes(element)) if isinstance(item, Rejection) else item)
    return out


def record_rejection(items: Sequence[TraceEvent | Rejection]) -> tuple[int, Rejection] | None:
    """One rejection for a record's rejected elements (None when it has none), with the index of the
    first: a record is one dead letter however many of its elements are bad, and its reason lists
    each element's (runs of equal reasons as one ``#i-#j``; at most ``MAX_REASON`` characters). The
    kind is the first rejected element's. Its ``original`` is None: the record's bytes are the
    original (``dead_letter_original``).

    >>> bad = [Rejection("schema: Expected `object`, got `int`", b"1")] * 3
    >>> record_rejection(bad)[1].reason
    'schema: 3 of 3 events of the bundle rejected: #0-#2 schema: Expected `object`, got `int`'
    >>> record_rejection([Rejection("undecodable: truncated")])
    (0, Rejection(reason='undecodable: truncated', original=None))
    """
    bad = [(i, it) for i, it in enumerate(items) if isinstance(it, Rejection)]
    if not bad:
        return None
    first, rejection = bad[0]
    if len(items) == 1:
        return first, Rejection(rejection.reason)
    runs: list[list[Any]] = []  # [first index, last index, reason]
    for i, r in bad:
        if runs and runs[-1][1] == i - 1 and runs[-1][2] == r.reason:
            runs[-1][1] = i
        else:
            runs.append([i, i, r.reason])
    head = f"{rejection.kind}: {len(bad)} of {len(items)} events of the bundle rejected: "
    parts: list[str] = []
    size = len(head)
    for n, (lo, hi, reason) in enumerate(runs):
        part = (f"#{lo}" if lo == hi else f"#{lo}-#{hi}") + f" {reason}"
        if size + len(part) + 2 > MAX_REASON - 40:
            parts.append(f"... and {len(runs) - n} more")
            break
        parts.append(part)
        size += len(part) + 2
    return first, Rejection(head + "; ".join(parts))


def dead_letter_original(value: bytes | None) -> bytes:
    """The bytes a dead letter keeps of a rejected record: all of them, up to ``MAX_ORIGINAL``."""
    value = value or b""
    return value if len(value) <= MAX_ORIGINAL else value[:MAX_ORIGINAL]


def truncated_note(value: bytes | None) -> str:
    """What a dead letter's reason says when it keeps only the start of its record."""
    n = len(value or b"")
    return f" (the dead letter keeps the first {MAX_ORIGINAL} of its {n} bytes)" if n > MAX_ORIGINAL else ""


def decode_bounded(decoder: msgspec.json.Decoder, raw: bytes | None, max_depth: int = MAX_DEPTH) -> Any:
    """``decoder.decode(raw)`` behind ``check_json`` (depth and UTF-8; no size or value limit: our own
    topics carry large records): an internal topic's record, or a ``Rejection`` (never raises).

    >>> decode_bounded(msgspec.json.Decoder(list[int]), b'[1, 2]')
    [1, 2]
    >>> decode_bounded(msgspec.json.Decoder(list[int]), b'[[[1]]]', max_depth=2).kind
    'oversized'
    """
    try:
        if raw is None:
            return Rejection("undecodable: empty message (no value)")
        why = check_json(raw, None, max_depth, None)
        if why is not None:
            return Rejection(why)
        return decoder.decode(raw)
    except msgspec.ValidationError as exc:
        return Rejection(f"schema: {exc}")
    except msgspec.DecodeError as exc:
        return Rejection(f"undecodable: {exc}")
    except Exception as exc:  # noqa: BLE001 - the boundary
        return Rejection(poison_reason(exc))


def json_or_literal(text: str) -> Any:
    """``text`` read as JSON, else as a Python literal (the ``repr`` of dicts and lists that tools print
    as their responses); None when it is neither. Callers bound the text's length: it is untrusted, and
    any error either parser raises on it (deep nesting, over-long numbers, ...) is None too.

    >>> json_or_literal("{'error': 'Bad Request', 'n': [1, 2]}")
    {'error': 'Bad Request', 'n': [1, 2]}
    >>> json_or_literal("{'cut short") is None
    True
    """
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    try:
        with warnings.catch_warnings():  # "invalid escape sequence": the same result under any -W
            warnings.simplefilter("ignore")
            return ast.literal_eval(text)
    except Exception:
        return None


def encode(obj: Any) -> bytes:
    """Canonical JSON bytes of an event, episode or payload (stable field order)."""
    return _encoder.encode(obj)


_texts_decoder = msgspec.json.Decoder(list[str])


def uuid_texts(ids: list[Any]) -> list[str]:
    """``[str(u) for u in ids]`` for UUIDs, in two C calls (about 6x faster than ``str`` on each: the
    projector names every event this way).

    >>> import uuid
    >>> uuid_texts([uuid.UUID(int=1)])
    ['00000000-0000-0000-0000-000000000001']
    """
    return _texts_decoder.decode(_encoder.encode(ids))


def decode_episode(raw: bytes) -> EpisodeDistilled:
    return _episode_decoder.decode(raw)


def to_builtins(obj: Any) -> Any:
    return msgspec.to_builtins(obj)
