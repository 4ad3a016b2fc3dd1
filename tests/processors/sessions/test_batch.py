"""somnus.processors.sessions.batch: the distiller's batch logic without I/O (``distill_rounds`` after ``sift``), as the
worker runs it batch after batch, with closed sessions forgotten after the retention."""

from __future__ import annotations

import random
import zlib
from datetime import datetime, timedelta

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from somnus.processors.sessions.batch import distill_rounds
from somnus.processors.sessions.distiller import SessionState, decode_state, encode_state, session_key
from somnus.processors.sessions.session_retention import MarkerHeap, micros, sift
from somnus.processors.working.session_buffer import DEFAULT_SETTINGS
from somnus.processors.working.session_buffer import encode_state as encode_wm
from somnus.sample import generate
from somnus.schemas.codec import decode_trace, encode

HOUR_US = 3600 * 1_000_000


def _fleet(seed: int, unended: int = 0) -> tuple[list, list[int]]:
    """Sample sessions on 3 partitions, with stream-time jumps, republished and late events, a
    backfilled session and a session id used again (and ``unended`` sessions whose end never comes);
    the events in arrival order and their partitions."""
    rng = random.Random(seed)
    raw = list(generate(sessions=40, seed=seed))
    if unended:
        ids = sorted({e["session_id"] for e in raw[1:]} - {raw[0]["session_id"]})
        gone = set(rng.sample(ids, unended))
        raw = [e for e in raw if not (e["session_id"] in gone and e["type"] == "session_end")]
    shift = timedelta(0)
    events: list[dict] = []
    for i, e in enumerate(raw):
        if i and i % 97 == 0:
            shift += timedelta(hours=rng.choice([1, 3, 8]))  # the fleet goes quiet, then resumes
        events.append({**e, "ts": (datetime.fromisoformat(e["ts"]) + shift).isoformat()})
    ends = [i for i, e in enumerate(events) if e["type"] == "session_end"]
    for n, i in enumerate(sorted(rng.sample(ends, 8), reverse=True)):
        e = events[i]
        late = {
            **e,
            "seq": e["seq"] + 1,
            "type": "agent_message",
            "payload": {"text": "one more thing"},
            "event_id": f"00000000-0000-4000-8000-{n:012d}",
        }
        events.insert(rng.randrange(i + 1, len(events) + 1), late)
        events.insert(rng.randrange(i + 1, len(events) + 1), dict(e))  # the end, republished later
    # a session's events published out of seq order: two of its middle events arrive swapped
    swapped = 0
    while swapped < 4:
        i = rng.randrange(1, len(events) - 1)
        j = next(
            (k for k in range(i + 1, min(i + 40, len(events))) if events[k]["session_id"] == events[i]["session_id"]),
            None,
        )
        if j is not None and "session_" not in events[i]["type"] + events[j]["type"]:
            events[i], events[j] = events[j], events[i]
            swapped += 1
    first = raw[0]["session_id"]
    back = [
        dict(e, session_id="backfill", ts=(datetime.fromisoformat(e["ts"]) - timedelta(days=90)).isoformat())
        for e in raw
        if e["session_id"] == first
    ]
    events[len(events) // 2 : len(events) // 2] = back
    # the first session's id again, at the end (its marker has expired by then)
    again = (max(datetime.fromisoformat(e["ts"]) for e in events) + timedelta(hours=3)).isoformat()
    events += [dict(e, ts=again) for e in raw if e["session_id"] == first]
    parsed = [decode_trace(orjson.dumps(e), 1 << 20) for e in events]
    parts = [zlib.crc32(e["session_id"].encode()) % 3 for e in events]
    return parsed, parts


def _run(
    events: list,
    parts: list[int],
    cuts: list[int],
    retention_us: int,
    idle_us: int = 0,
    caps: list[int | None] | None = None,
) -> dict:
    """The worker's loop minus the I/O: sift, distill in rounds, remove the markers that expired. With
    ``idle_us``, every open session of the batch's partitions is at hand (the worker loads those its
    stream time can make idle); ``caps`` bound each event's move of stream time (its record's time
    plus the skew allowed)."""
    table: dict[str, SessionState] = {}
    working: dict[str, object] = {}
    clocks: dict[int, int] = {}
    heap = MarkerHeap()
    late, episodes, units = [], [], []
    future = 0
    bounds = [0, *sorted(set(cuts)), len(events)]
    for lo, hi in zip(bounds, bounds[1:]):
        batch, bparts = events[lo:hi], parts[lo:hi]
        bcaps = caps[lo:hi] if caps is not None else None
        if not batch:
            continue
        partition_of = {session_key(e.agent, e.session_id): p for e, p in zip(batch, bparts)}
        if idle_us:
            partition_of.update(
                {
                    k: st.partition
                    for k, st in table.items()
                    if not st.closed and st.partition in set(bparts) and k not in partition_of
                }
            )
        prior = {k: table[k] for k in partition_of if k in table}
        wm_prior = {k: working[k] for k in partition_of if k in working}
        sifted = sift(
            batch,
            bparts,
            clocks,
            prior,
            retention_us,
            idle_us,
            {k: partition_of[k] for k, st in prior.items() if not st.closed},
            bcaps,
        )
        future += sifted.future
        out = distill_rounds(prior, wm_prior, sifted, partition_of, frozenset(), DEFAULT_SETTINGS)
        where = {id(e): i for i, e in enumerate(batch)}
        late += [(lo + i, reason) for i, reason in sifted.late]
        late += [(lo + where[id(e)], reason) for e, reason in out.late_events]
        episodes += [encode(ep) for ep in out.episodes]
        units += [encode(u) for u in out.units]
        table.update(out.states)
        working.update(out.wm_states)
        clocks = sifted.clocks
        for k, s in out.states.items():
            if s.closed:
                heap.push(s.partition, s.closed_clock, k.encode())
        for p in set(bparts):
            for clock, k in heap.due(p, clocks.get(p), retention_us):
                if k.decode() in table and table[k.decode()].closed_clock == clock:
                    del table[k.decode()]
                    working.pop(k.decode(), None)
    # in the order emitted: the worker writes them in that order onto one-partition topics whose folds
    # (capture, knowledge, Rescorla-Wagner) depend on it (docs/design/scale-out.md)
    return {
        "late": sorted(late),
        "episodes": episodes,
        "units": units,
        "table": {k: encode_state(v) for k, v in sorted(table.items())},
        "working": {k: encode_wm(v) for k, v in sorted(working.items())},
        "clocks": clocks,
        "future": future,
    }


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), cuts=st.lists(st.integers(1, 3000), max_size=12))
def test_outputs_and_the_state_left_do_not_depend_on_batch_boundaries(seed, cuts):
    events, parts = _fleet(seed)
    whole = _run(events, parts, [], 2 * HOUR_US)
    split = _run(events, parts, [c % len(events) for c in cuts], 2 * HOUR_US)
    assert whole == split
    # it exercised what it claims: late and out-of-order events dead-lettered, markers removed, the
    # reused id distilled twice
    assert len(whole["late"]) >= 8 and any(reason.startswith("order: ") for _, reason in whole["late"])
    n_sessions = len({(e.agent, e.session_id) for e in events})
    assert len(whole["table"]) < n_sessions
    assert len(whole["episodes"]) == n_sessions + 1


def test_with_no_retention_every_marker_is_kept_and_late_events_are_still_dead_letters():
    events, parts = _fleet(3)
    got = _run(events, parts, [100, 300], 0)
    assert len(got["table"]) == len({(e.agent, e.session_id) for e in events})
    assert len(got["late"]) >= 8


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), cuts=st.lists(st.integers(1, 3000), max_size=12))
def test_sessions_abandoned_for_idleness_do_not_depend_on_batch_boundaries(seed, cuts):
    events, parts = _fleet(seed, unended=4)
    whole = _run(events, parts, [], 2 * HOUR_US, HOUR_US)
    split = _run(events, parts, [c % len(events) for c in cuts], 2 * HOUR_US, HOUR_US)
    assert whole == split
    # every session got its episode, the unended ones too (abandoned: a failure that says so; a session
    # the fleet's quiet hours split is abandoned too, and its later events are late or start it again)
    episodes = [orjson.loads(ep) for ep in whole["episodes"]]
    abandoned = [
        ep
        for ep in episodes
        if any("abandoned: no event for 3600 s of stream time" in lesson["text"] for lesson in ep["lessons"])
    ]
    assert len(abandoned) >= 4 and all(ep["outcome"] == "failure" for ep in abandoned)
    # the sessions left open (no episode) are those with an event within the idle time of the end
    left_open = {k: decode_state(v) for k, v in whole["table"].items() if b'"closed":true' not in v}
    assert all(micros(st.ended_at) + HOUR_US >= whole["clocks"][st.partition] for st in left_open.values())
    assert {(ep["agent"], ep["session_id"]) for ep in episodes} | {
        (st.agent, st.session_id) for st in left_open.values()
    } == {(e.agent, e.session_id) for e in events}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), cuts=st.lists(st.integers(1, 3000), max_size=12))
def test_future_events_do_not_depend_on_batch_boundaries(seed, cuts):
    # one agent's runtime stamps its events a day ahead; their records' times (+ 5 min skew) make them
    # dead letters of kind future
    events, parts = _fleet(seed, unended=4)
    skewed = events[0].agent
    caps = [micros(e.ts) + HOUR_US // 12 for e in events]
    events = [msgspec.structs.replace(e, ts=e.ts + timedelta(days=1)) if e.agent == skewed else e for e in events]
    whole = _run(events, parts, [], 2 * HOUR_US, HOUR_US, caps)
    split = _run(events, parts, [c % len(events) for c in cuts], 2 * HOUR_US, HOUR_US, caps)
    assert whole == split
    n_skewed = sum(e.agent == skewed for e in events)
    assert whole["future"] == n_skewed > 0
    assert sum(reason.startswith("future: ") for _, reason in whole["late"]) == n_skewed
    assert not any(orjson.loads(ep)["agent"] == skewed for ep in whole["episodes"])
    free = _run(events, parts, [], 2 * HOUR_US, HOUR_US)  # unbounded, the skewed runtime closes others' sessions
    assert free["future"] == 0 and any(orjson.loads(ep)["agent"] == skewed for ep in free["episodes"])


def _trace(session: str, seq: int, kind: str, second: int, **payload: object) -> object:
    e = {
        "event_id": f"00000000-0000-4000-8000-{zlib.crc32(f'{session}{seq}'.encode()):012d}",
        "schema_version": 1,
        "ts": f"2026-01-05T07:00:{second:02d}Z",
        "agent": "scraper",
        "session_id": session,
        "seq": seq,
        "type": kind,
        "payload": payload,
    }
    return decode_trace(orjson.dumps(e), 1 << 20)


def _two_sessions(conversation: bool) -> list:
    """Session a starts first, session b ends first; with ``conversation``, a message of a comes after b's end."""
    meta = {"metadata": {"mode": "conversation"}} if conversation else {}
    return [
        _trace("a", 0, "session_start", 0, task="t", **meta),
        _trace("b", 0, "session_start", 1, task="u", **meta),
        _trace("a", 1, "user_message", 2, text="the first of a"),
        _trace("b", 1, "session_end", 3, outcome="success"),
        _trace("a", 2, "user_message", 4, text="the second of a"),
        _trace("a", 3, "session_end", 5, outcome="success"),
    ]


@pytest.mark.parametrize("conversation", [False, True])
def test_a_batch_emits_episodes_and_units_in_the_order_their_events_came(conversation):
    """Whole, the batch used to give a's episode first (its first event came first); cut after b's end,
    b's: the one-partition topics the worker writes then had two orders for one input."""
    events = _two_sessions(conversation)
    parts = [0] * len(events)
    whole = _run(events, parts, [], 2 * HOUR_US)
    assert [orjson.loads(ep)["session_id"] for ep in whole["episodes"]] == ["b", "a"]
    for cut in range(1, len(events)):
        assert _run(events, parts, [cut], 2 * HOUR_US) == whole, cut
    if conversation:  # a's first message, b's episode, a's second message, a's episode
        assert [(u["run_id"], u["kind"]) for u in map(orjson.loads, whole["units"])] == [
            ("a", "message"),
            ("b", "episode"),
            ("a", "message"),
            ("a", "episode"),
        ]
