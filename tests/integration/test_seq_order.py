"""A session's events published out of seq order, end to end (real broker, Faust worker, projector):
within one record they are applied in seq order; an event whose seq was skipped by an earlier record
goes to the dead-letter topic (kind ``order``), never silently dropped, so where the worker's batches
end never decides its fate."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

import pytest

from tests.factories import trace_event
from tests.pipeline import Pipeline

pytestmark = pytest.mark.integration

T0 = datetime(2026, 2, 2, 9, 0, tzinfo=timezone.utc)


def _event(sid: str, seq: int, type_: str, payload: dict) -> dict:
    return trace_event(sid, seq, type_, T0 + timedelta(seconds=seq), payload)


def test_a_records_events_are_applied_in_seq_order_and_one_skipped_by_an_earlier_record_is_a_dead_letter(
    pipeline_settings,
):
    s = dataclasses.replace(pipeline_settings, partitions=1)
    start = _event("x", 0, "session_start", {"task": "rebook flight"})
    ask = _event("x", 1, "user_message", {"text": "I need an aisle seat"})
    reply = _event("x", 2, "agent_message", {"text": "done"})
    end = _event("x", 3, "session_end", {"outcome": "success"})
    p = Pipeline(s)
    try:
        p.start_all()
        p.publish([ask, start])  # one record, in the wrong order: sorted by seq, both applied
        p.wait_idle()
        p.publish([end])  # skips seq 2
        p.wait_idle()
        p.publish([reply])  # arrives after seq 3: out of order
        p.wait_idle()
        p.stop_all()
        assert p.query("SELECT session_id, outcome, event_count FROM episodes") == [("x", "success", 3)]
        dead = p.query("SELECT kind, reason FROM dead_letters")
        assert [k for k, _ in dead] == ["order"], dead
        assert "had applied seq 3 when this agent_message event with seq 2, skipped earlier, arrived" in dead[0][1]
        assert p.query("SELECT count(*) FROM events")[0][0] == 4  # every event is in the raw projection
    finally:
        p.stop_all()
