"""A table recovery that lost changelog records in flight completes (somnus.streams.liveness.RecoveryWatchdog):
real broker, real Faust worker and projector, one fault injected into the worker (tests/faults)."""

from __future__ import annotations

import dataclasses
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.factories import trace_event
from tests.pipeline import Pipeline

pytestmark = pytest.mark.integration

T0 = datetime(2026, 3, 3, 9, 0, tzinfo=timezone.utc)
FAULTS = Path(__file__).resolve().parent.parent / "faults"
SESSIONS = 40
ENDED = 20  # sessions that end after the restart


def _session(sid: str, at: datetime) -> list[dict]:
    return [
        trace_event(sid, 0, "session_start", at, {"task": f"answer ticket {sid}"}),
        trace_event(sid, 1, "user_message", at + timedelta(seconds=5), {"text": f"my order {sid} is late"}),
        trace_event(sid, 2, "agent_message", at + timedelta(seconds=20), {"text": "it ships tomorrow"}),
        trace_event(sid, 3, "session_end", at + timedelta(seconds=30), {"outcome": "success"}),
    ]


def test_a_recovery_whose_changelog_records_were_fetched_and_lost_is_sought_back_and_completes(
    pipeline_settings, monkeypatch
):
    s = dataclasses.replace(pipeline_settings, partitions=2)
    sessions = [_session(f"s{i:02}", T0 + timedelta(minutes=i)) for i in range(SESSIONS)]
    p = Pipeline(s)
    try:
        p.start_all()
        p.publish([e for events in sessions for e in events[:2]])  # every session open, two events in
        p.wait_idle()
        p.kill("worker")
        # the restarted worker restores the sessions and working-memory tables from their changelogs;
        # the records of its first fetch of each partition of those are lost in flight
        path = os.environ.get("PYTHONPATH")
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAULTS), *([path] if path else [])]))
        monkeypatch.setenv("SOMNUS_FAULT_LOSE_RESTORE", "sessions-changelog,working_memory-changelog")
        p.start("worker")
        # half the sessions end, the other half stay open (a closed working memory keeps no messages)
        p.publish([e for i, events in enumerate(sessions) for e in events[2 : (None if i < ENDED else 3)]])
        p.wait_idle(timeout_s=180)  # without the watchdog the worker stays in recovery for good
        log = p.log("worker")
        assert "FAULT: dropped" in log and "working_memory-changelog" in log, log[-3000:]
        assert "stalled (restored up to offset -1" in log, log[-3000:]
        p.stop_all()
        # both tables were restored whole: each episode has all 4 events, each open session's working
        # memory both its messages, the one from before the restart first
        assert p.query("SELECT session_id, outcome, event_count FROM episodes ORDER BY 1") == [
            (f"s{i:02}", "success", 4) for i in range(ENDED)
        ]
        rows = p.query("SELECT session_id, CAST(state->'$.messages' AS VARCHAR) FROM working_memory WHERE NOT closed")
        states = dict(rows)
        assert sorted(states) == [f"s{i:02}" for i in range(ENDED, SESSIONS)]
        assert [
            sid
            for sid, messages in states.items()
            if not 0 <= messages.find(f"my order {sid} is late") < messages.find("it ships tomorrow")
        ] == []
    finally:
        p.stop_all()


def test_a_topic_missing_from_the_metadata_when_the_group_was_assigned_is_taken_up_when_it_appears(
    pipeline_settings, monkeypatch
):
    # Just after a broker restart its metadata can lack the topics: the worker's assignment then leaves
    # the traces out, and aiokafka rejoins only once a metadata refresh shows them (Faust's default: 5 min).
    s = dataclasses.replace(pipeline_settings, partitions=2)
    p = Pipeline(s)
    try:
        p.start("projector")
        path = os.environ.get("PYTHONPATH")
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAULTS), *([path] if path else [])]))
        monkeypatch.setenv("SOMNUS_FAULT_HIDE_TOPIC", f"{s.traces_topic}:12")
        p.start("worker")
        p.publish([e for i in range(10) for e in _session(f"h{i}", T0 + timedelta(minutes=i))])
        p.wait_idle(timeout_s=60)
        log = p.log("worker")
        assert "FAULT: hiding" in log and "Ignoring missing topic" in log, log[-3000:]
        assert p.status()["counts"]["episodes"] == 10
    finally:
        p.stop_all()
