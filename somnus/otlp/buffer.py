"""Spans held until their trace is complete, in a journal that survives a SIGKILL.

A trace's children are exported before its root (a span is exported when it ends, the root ends
last), but a session's events must reach the pipeline in ``seq`` order, ``session_start`` first
(``somnus.processors.sessions.distiller``: a lower seq after a higher one is a dead letter). So the
receiver holds a trace's spans until its root span (no parent) arrives, then maps the whole trace.

Held spans are appended to ``<SOMNUS_HOME>/otlp/spans.journal`` (one JSON record a line) and
fsynced before the request is answered: a receiver killed at any moment loses no span it
acknowledged. A trace whose events the broker acknowledged is marked ``done`` in the journal (with
its span ids, so a span the exporter sends again is known as a duplicate, not a new span). A
receiver started again reads the journal and publishes what was complete and not yet ``done``;
the events' ids and seqs are deterministic, so a trace published twice (killed between the
broker's ack and the ``done`` record) is applied once.

A journal ends with a partial line after a kill in the middle of a write: that line was never
acknowledged, so it is dropped (and logged). Records are compacted on start and when the journal
grows past ``COMPACT_BYTES``: the spans still held, and the ``done`` records of the last
``KEEP_DONE`` traces.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any, Union

import msgspec

from somnus.otlp.spans import Span

log = logging.getLogger("somnus.otlp")

KEEP_DONE = 20_000  # traces whose span ids are remembered after they were published
COMPACT_BYTES = 64 << 20


class Held(msgspec.Struct, frozen=True, tag="span"):
    span: Span
    received_ns: int  # the receiver's clock when it arrived (for the timeout of a trace without root)
    owner: str | None = None  # the agent of the token that sent it (None: an operator token)


class Done(msgspec.Struct, frozen=True, tag="done"):
    trace_id: str
    span_ids: list[str]


Record = Union[Held, Done]
_decoder = msgspec.json.Decoder(Record)
_encoder = msgspec.json.Encoder()


class TraceBuffer:
    """The held spans by trace, the ``done`` traces, and the journal behind them (one writer: the receiver)."""

    def __init__(self, path: Path, keep_done: int = KEEP_DONE, compact_bytes: int = COMPACT_BYTES) -> None:
        self.path, self.keep_done, self.compact_bytes = Path(path), keep_done, compact_bytes
        self.held: dict[str, dict[str, Held]] = {}
        self.done: OrderedDict[str, frozenset[str]] = OrderedDict()
        self._file: Any = None
        self._load()

    # -- the journal -------------------------------------------------------------------------------
    def _load(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.path.exists():
            lines = self.path.read_bytes().split(b"\n")
            for n, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    self._apply(_decoder.decode(line))
                except msgspec.DecodeError as exc:
                    log.warning("%s line %d: dropped (%s): a write cut short, never acknowledged", self.path, n, exc)
        self._compact()

    def _apply(self, record: Record) -> None:
        if isinstance(record, Held):
            if record.span.trace_id not in self.done:
                self.held.setdefault(record.span.trace_id, {})[record.span.span_id] = record
        else:
            self.held.pop(record.trace_id, None)
            self.done[record.trace_id] = frozenset(record.span_ids)
            self.done.move_to_end(record.trace_id)
            while len(self.done) > self.keep_done:
                self.done.popitem(last=False)

    def _compact(self) -> None:
        """Rewrite the journal with what is still needed (atomically: a kill leaves the old or the new)."""
        if self._file is not None:
            self._file.close()
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            for trace_id, ids in self.done.items():
                f.write(_encoder.encode(Done(trace_id, sorted(ids))) + b"\n")
            for spans in self.held.values():
                for held in spans.values():
                    f.write(_encoder.encode(held) + b"\n")
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.path)
        self._file = open(self.path, "ab")  # noqa: SIM115 - held open: one append and fsync per request

    def _write(self, records: list[Record]) -> None:
        if not records:
            return
        assert self._file is not None
        self._file.write(b"".join(_encoder.encode(r) + b"\n" for r in records))
        self._file.flush()
        os.fsync(self._file.fileno())
        if self._file.tell() > self.compact_bytes:
            self._compact()

    # -- what the receiver calls ----------------------------------------------------------------------
    def add(self, spans: list[Span], received_ns: int, owner: str | None = None) -> tuple[int, int, list[str]]:
        """Hold new spans (written and fsynced before it returns): ``(new, duplicates, rejections)``.

        A span of a trace already published is a duplicate when it was part of it, else rejected
        (its trace's sessions have ended)."""
        new: list[Record] = []
        dups, rejected = 0, []
        for span in spans:
            if span.trace_id in self.done:
                if span.span_id in self.done[span.trace_id]:
                    dups += 1
                else:
                    rejected.append(
                        f"span {span.span_id} of trace {span.trace_id}: the trace was mapped when its "
                        "root span arrived; a span arriving after it is not mapped"
                    )
                continue
            if span.span_id in self.held.get(span.trace_id, {}):
                dups += 1
                continue
            held = Held(span, received_ns, owner)
            self.held.setdefault(span.trace_id, {})[span.span_id] = held
            new.append(held)
        self._write(new)
        return len(new), dups, rejected

    def complete(self) -> list[str]:
        """Held traces whose root span (a span without parent) has arrived."""
        return [t for t, spans in self.held.items() if any(not h.span.parent_span_id for h in spans.values())]

    def stale(self, now_ns: int, timeout_s: float) -> list[str]:
        """Held traces without a root whose newest span arrived more than ``timeout_s`` ago."""
        limit = now_ns - int(timeout_s * 1e9)
        return [t for t, spans in self.held.items() if max(h.received_ns for h in spans.values()) < limit]

    def spans(self, trace_id: str) -> list[Span]:
        return [h.span for h in self.held.get(trace_id, {}).values()]

    def owners(self, trace_id: str) -> set[str | None]:
        """The owners of a held trace's spans (``None``: an operator token); empty when none is held."""
        return {h.owner for h in self.held.get(trace_id, {}).values()}

    def owner(self, trace_id: str) -> str | None:
        return next((h.owner for h in self.held.get(trace_id, {}).values() if h.owner), None)

    def mark_done(self, trace_ids: list[str]) -> None:
        """Record that the broker acknowledged these traces' events (written and fsynced)."""
        records: list[Record] = [Done(t, sorted(self.held.get(t, {}))) for t in trace_ids]
        for r in records:
            self._apply(r)
        self._write(records)

    def held_spans(self) -> int:
        return sum(len(s) for s in self.held.values())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
