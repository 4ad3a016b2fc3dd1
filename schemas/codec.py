"""Bytes <-> typed events. Bad input becomes a ``Rejection`` naming what is wrong, never an exception.

>>> decode_trace(b'{"nope', max_bytes=100).reason.split(':')[0]
'undecodable'
>>> decode_trace(b'x' * 200, max_bytes=100).reason
'oversized: 200 bytes > limit 100'
>>> r = decode_trace(b'{"type":"tool_call","seq":"1"}', max_bytes=1000)
>>> r.reason.startswith('schema:')
True
"""

from __future__ import annotations

from typing import Any

import msgspec

from schemas.episodes import EpisodeDistilled
from schemas.events import TraceEvent


class Rejection(msgspec.Struct, frozen=True):
    """Why an input could not be accepted: ``oversized``, ``undecodable`` or ``schema``."""

    reason: str
    original: bytes | None = None  # the bytes of the rejected element, when it came in a bundle

    @property
    def kind(self) -> str:
        return self.reason.split(":", 1)[0]


_trace_decoder = msgspec.json.Decoder(TraceEvent)
_episode_decoder = msgspec.json.Decoder(EpisodeDistilled)
_encoder = msgspec.json.Encoder()


def decode_trace(raw: bytes | None, max_bytes: int) -> TraceEvent | Rejection:
    """Decode and validate one trace event."""
    if raw is None:
        return Rejection("undecodable: empty message (no value)")
    if len(raw) > max_bytes:
        return Rejection(f"oversized: {len(raw)} bytes > limit {max_bytes}")
    try:
        return _trace_decoder.decode(raw)
    except msgspec.ValidationError as exc:
        if "Expected `int`, got `float`" in str(exc):
            return _decode_integral_floats(raw, exc)
        return Rejection(f"schema: {exc}")
    except msgspec.DecodeError as exc:
        return Rejection(f"undecodable: {exc}")


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
    Only this error takes the slower path; a fraction (1.5) is still rejected, by the same rule."""
    try:
        return _trace_decoder.decode(_encoder.encode(_integral(msgspec.json.decode(raw))))
    except msgspec.ValidationError as again:
        return Rejection(f"schema: {again}")
    except msgspec.DecodeError:
        return Rejection(f"schema: {exc}")


_bundle_decoder = msgspec.json.Decoder(list[msgspec.Raw])
_events_decoder = msgspec.json.Decoder(list[TraceEvent])


def decode_record(raw: bytes | None, max_bytes: int) -> list[TraceEvent | Rejection]:
    """Decode one Kafka record of the traces topic: one event, or a bundle (JSON array) of events.

    Runtimes that publish at high rates send bundles: one record for several consecutive events of
    one session, which amortises the per-record cost of the stream processor. Each element is
    validated on its own, so one bad event in a bundle rejects only that event.

    >>> [type(x).__name__ for x in decode_record(b'[1, {"a": 2}]', 100)]
    ['Rejection', 'Rejection']
    >>> decode_record(b'[]', 100)[0].reason
    'schema: an empty bundle (a record must hold at least one event)'
    """
    if raw is None or not raw.lstrip()[:1] == b"[":
        return [decode_trace(raw, max_bytes)]
    if len(raw) <= max_bytes:  # then so is each element: when all are valid, one decode does it
        try:
            events: list[TraceEvent | Rejection] = _events_decoder.decode(raw)
        except msgspec.DecodeError:  # ValidationError included
            pass  # some element is not valid (or an integral float needs its slower path): one by one
        else:
            if events:
                return events
    return _decode_elements(raw, max_bytes)


def _decode_elements(raw: bytes, max_bytes: int) -> list[TraceEvent | Rejection]:
    """A bundle's elements decoded one by one (what ``decode_record`` returns for any bundle)."""
    try:
        elements = _bundle_decoder.decode(raw)
    except msgspec.DecodeError as exc:
        return [Rejection(f"undecodable: {exc}")]
    if not elements:
        return [Rejection("schema: an empty bundle (a record must hold at least one event)")]
    out: list[TraceEvent | Rejection] = []
    for element in elements:
        item = decode_trace(bytes(element), max_bytes)
        out.append(Rejection(item.reason, bytes(element)) if isinstance(item, Rejection) else item)
    return out


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
