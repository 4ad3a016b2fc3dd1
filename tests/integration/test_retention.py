"""Closed sessions forgotten after the retention (somnus.processors.sessions.session_retention), end to end: real broker,
Faust worker and projector. Late events go to the dead-letter topic with their reason."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import datetime, timedelta, timezone

import pytest

from somnus.client import bundles, make_producer, to_bytes
from tests.factories import trace_event
from tests.pipeline import Pipeline

pytestmark = pytest.mark.integration

T0 = datetime(2026, 2, 2, 9, 0, tzinfo=timezone.utc)


def _session(sid: str, at: datetime, tag: str = "") -> list[dict]:
    return [
        trace_event(sid, 0, "session_start", at, {"task": f"answer ticket {sid}"}, tag=tag),
        trace_event(sid, 1, "user_message", at + timedelta(seconds=5), {"text": "my order is late"}, tag=tag),
        trace_event(sid, 2, "session_end", at + timedelta(seconds=30), {"outcome": "success"}, tag=tag),
    ]


def test_a_closed_session_is_forgotten_after_the_retention_and_late_events_are_dead_letters(pipeline_settings):
    s = dataclasses.replace(pipeline_settings, partitions=1, session_retention_s=3600.0)
    p = Pipeline(s)
    try:
        p.start_all()
        p.publish(_session("a", T0))
        p.wait_idle()
        # within the retention: a republished event is dropped, a new one after the end is late
        late = trace_event("a", 3, "agent_message", T0 + timedelta(minutes=2), {"text": "one more thing"})
        p.publish([_session("a", T0)[1], late])
        p.wait_idle()
        # three hours of stream time later, a's marker has expired and is removed
        p.publish(_session("b", T0 + timedelta(hours=3)))
        p.wait_idle()
        # an old event of the forgotten session cannot be told from a late one: dead letter
        stale = trace_event("a", 4, "agent_message", T0 + timedelta(minutes=3), {"text": "and another"})
        p.publish([stale])
        p.wait_idle()
        p.stop_all()
        dead = p.query("SELECT kind, reason FROM dead_letters ORDER BY src_offset")
        assert [k for k, _ in dead] == ["late", "late"], dead
        assert "'a' of agent 'support' had ended (seq 2); this agent_message event has seq 3" in dead[0][1]
        assert "older than the partition's stream time by more than the retention (3600 s)" in dead[1][1]
        assert p.query("SELECT session_id FROM working_memory ORDER BY 1") == [("b",)]
        assert p.query("SELECT session_id, outcome FROM episodes ORDER BY 1") == [("a", "success"), ("b", "success")]
        # every event is still in the raw projection, late ones included, each event_id once: the
        # republished copy is counted, not projected again
        assert p.query("SELECT count(*) FROM events")[0][0] == 3 + 1 + 3 + 1
        assert p.query("SELECT session_id, seq FROM duplicate_events") == [("a", 1)]
    finally:
        p.stop_all()


def test_a_backfill_of_old_sessions_is_accepted_and_a_session_id_can_start_again(pipeline_settings):
    s = dataclasses.replace(pipeline_settings, partitions=1, session_retention_s=3600.0)
    p = Pipeline(s)
    try:
        p.start_all()
        p.publish(_session("live", T0 + timedelta(days=30)))
        p.publish(_session("old", T0))  # 30 days behind the stream: each session begins with its start
        p.publish(_session("live", T0 + timedelta(days=31), tag="again"))  # the marker of "live" expired
        p.wait_idle()
        p.stop_all()
        assert p.query("SELECT count(*) FROM dead_letters")[0][0] == 0
        assert p.query("SELECT session_id FROM episodes ORDER BY 1") == [("live",), ("old",)]  # one episode id
        assert p.query("SELECT count(*) FROM events")[0][0] == 9
        # the second "live" session was distilled: its working memory is the newest state of that id
        assert p.query("SELECT session_id, closed FROM working_memory ORDER BY 1") == [("live", True)]
    finally:
        p.stop_all()


def test_a_session_that_never_ends_is_closed_as_abandoned_after_the_idle_time_also_after_a_restart(pipeline_settings):
    s = dataclasses.replace(pipeline_settings, partitions=1, session_retention_s=86400.0, session_idle_s=3600.0)
    never = _session("gone", T0)[:2]  # its runtime died before the end
    p = Pipeline(s)
    try:
        p.start_all()
        p.publish(never)
        p.publish(_session("soon", T0 + timedelta(minutes=30)))  # 30 min of stream time later: "gone" stays open
        p.wait_idle()
        assert p.status()["counts"]["episodes"] == 1  # "soon" only
        # the worker restarts (SIGKILL): its heap of open sessions is rebuilt from the restored table
        p.kill("worker")
        p.start("worker")
        p.publish(_session("later", T0 + timedelta(hours=2)))  # stream time moves 2 h on
        p.wait_idle()
        assert p.status()["counts"]["episodes"] == 3  # "gone" was closed with no event of its own
        late = trace_event("gone", 2, "agent_message", T0 + timedelta(hours=2, minutes=1), {"text": "back"})
        p.publish([late])
        # and with no restart: a session the worker saw open in an earlier batch
        p.publish(_session("gone2", T0 + timedelta(hours=2, minutes=5))[:2])
        p.wait_idle()
        p.publish(_session("final", T0 + timedelta(hours=4)))
        p.wait_idle()
        p.stop_all()
        rows = p.query("SELECT session_id, outcome, event_count, ended_at FROM episodes ORDER BY 1")
        assert [(r[0], r[1], r[2]) for r in rows] == [
            ("final", "success", 3),
            ("gone", "failure", 2),
            ("gone2", "failure", 2),
            ("later", "success", 3),
            ("soon", "success", 3),
        ]
        assert rows[1][3] == T0 + timedelta(seconds=5)  # the episode ends at its last event
        lessons = p.query("SELECT text FROM lessons WHERE session_id = 'gone'")
        assert any("abandoned: no event for 3600 s of stream time" in t for (t,) in lessons), lessons
        dead = p.query("SELECT kind, reason FROM dead_letters")
        assert [k for k, _ in dead] == ["late"] and "'gone' of agent 'support' had ended (seq 1)" in dead[0][1]
        assert p.query("SELECT session_id, closed FROM working_memory WHERE session_id LIKE 'gone%' ORDER BY 1") == [
            ("gone", True),
            ("gone2", True),
        ]
    finally:
        p.stop_all()


def _publish_stamped(p: Pipeline, events: list[dict], at: datetime) -> None:
    """Publish with the records' own timestamps set to ``at``: a runtime whose clock is that far ahead."""

    async def run() -> None:
        producer = make_producer(p.boot)
        await producer.start()
        try:
            for key, value in bundles([to_bytes(e) for e in events], 1):
                await (await producer.send(p.s.traces_topic, value, key=key, timestamp_ms=int(at.timestamp() * 1000)))
        finally:
            await producer.stop()

    asyncio.run(run())


def test_a_runtime_whose_clock_runs_ahead_is_dead_lettered_and_neither_expires_markers_nor_abandons_others(
    pipeline_settings,
):
    s = dataclasses.replace(pipeline_settings, partitions=1, session_retention_s=3600.0, session_idle_s=600.0)
    now = datetime.now(timezone.utc).replace(microsecond=0)  # the broker's clock, near enough (5 min skew allowed)
    done = _session("a", now - timedelta(minutes=2))
    p = Pipeline(s)
    try:
        p.start_all()
        p.publish(done + _session("o", now - timedelta(minutes=1))[:2])  # "a" ended, "o" open
        p.wait_idle()
        # a runtime 30 days ahead: its event and its record's own timestamp (the broker's append time replaces it)
        ahead = now + timedelta(days=30)
        _publish_stamped(p, [trace_event("skewed", 0, "session_start", ahead, {"task": "from the future"})], ahead)
        p.publish([done[2]])  # a's end, republished: still a duplicate, as a's marker still counts
        p.wait_idle()
        log = p.log("worker")
        p.stop_all()
        # unbounded, stream time would be 30 days on: "a" forgotten (its end a late dead letter), "o" abandoned;
        # the event 30 days ahead is a dead letter of kind future, and nothing else
        assert [k for k, _ in p.query("SELECT kind, reason FROM dead_letters")] == ["future"]
        assert p.query("SELECT session_id FROM episodes") == [("a",)]
        assert p.query("SELECT session_id FROM working_memory WHERE NOT closed ORDER BY 1") == [("o",)]
        assert p.query("SELECT count(*) FROM events WHERE session_id = 'skewed'") == [(0,)]
        assert "1 event(s) stamped more than 300 s ahead of their records' broker time were dead-lettered" in log, log[
            -3000:
        ]
    finally:
        p.stop_all()
