"""somnus.otlp.buffer: held spans survive a restart; a cut-short last line is dropped; done traces stay done."""

from __future__ import annotations

from pathlib import Path

from somnus.otlp.buffer import TraceBuffer
from tests.somnus.otlp.spans_for_tests import span


def trace(t: str) -> list:
    return [span("1", "invoke_agent a", 0, 3, trace=t), span("2", "execute_tool x", 1, 2, parent="1", trace=t)]


def test_held_spans_survive_a_restart_and_a_partial_last_line_is_dropped(tmp_path: Path):
    path = tmp_path / "spans.journal"
    b = TraceBuffer(path)
    assert b.add(trace("ab" * 16)[1:], received_ns=5) == (1, 0, [])
    assert b.complete() == []
    b.close()
    with open(path, "ab") as f:
        f.write(b'{"type":"span","span":{"trace_id":')  # a kill in the middle of a write
    again = TraceBuffer(path)
    assert again.held_spans() == 1 and again.owner("ab" * 16) is None
    assert again.add(trace("ab" * 16), received_ns=6) == (1, 1, [])
    assert again.complete() == ["ab" * 16]
    assert sorted(s.span_id for s in again.spans("ab" * 16)) == ["0000000000000001", "0000000000000002"]


def test_a_done_trace_knows_its_spans(tmp_path: Path):
    path = tmp_path / "spans.journal"
    b = TraceBuffer(path, keep_done=1)
    b.add(trace("ab" * 16), received_ns=1, owner="a")
    b.mark_done(["ab" * 16])
    b.close()
    b = TraceBuffer(path, keep_done=1)
    new, dups, rejected = b.add(trace("ab" * 16) + [span("3", "late", 4, 5, parent="1", trace="ab" * 16)], 2)
    assert (new, dups, len(rejected)) == (0, 2, 1) and "mapped when its root span arrived" in rejected[0]
    b.add(trace("cd" * 16), received_ns=3)
    b.mark_done(["cd" * 16])  # keep_done=1: the oldest done trace is forgotten
    assert list(b.done) == ["cd" * 16] and b.held_spans() == 0


def test_stale_traces_and_compaction(tmp_path: Path):
    path = tmp_path / "spans.journal"
    b = TraceBuffer(path, compact_bytes=1)  # compacts after every write
    b.add(trace("ab" * 16)[1:], received_ns=10**9)
    b.add(trace("cd" * 16)[1:], received_ns=5 * 10**9)
    assert b.stale(now_ns=6 * 10**9, timeout_s=2.0) == ["ab" * 16]
    b.mark_done(["ab" * 16, "cd" * 16])
    assert path.read_bytes().count(b"\n") == 2  # two done records, no held span
