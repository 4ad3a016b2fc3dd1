"""somnus.streams.app's distiller batch without a broker: no record stops it (a decode boundary, then one record
at a time when the batch's work raises), a record is one dead letter however many of its events are
bad, and a partition's stream time survives batches of undecodable records."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from faust.types import TP

import somnus.streams.app as app_mod
from somnus.config import Settings
from somnus.streams.metrics import WorkerCounters
from somnus.streams.ordering import decode_clock, encode_position, position_key
from tests.factories import T0, session_bundle, trace_event


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send(self, topic: str, key: Any, value: bytes, partition: Any, timestamp: Any, headers: Any) -> Any:
        self.sent.append({"topic": topic, "key": key, "value": value, "headers": dict(headers or [])})
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut


class FakeTable(dict):
    """What the distiller uses of a ``BatchedTable``: get, and write with positions and stream times."""

    def __init__(self) -> None:
        super().__init__()
        self.pending_changelog: list[Any] = []
        self.key_partitions: dict[Any, int] = {}
        self.writes: list[dict[str, Any]] = []

    async def write(self, producer: Any, items: Any, positions: Any = None, clocks: Any = None) -> None:
        for key, _partition, value in items:
            self[key] = value
        for tp, offset in (positions or {}).items():
            self[position_key(tp.topic, tp.partition)] = encode_position(offset, (clocks or {}).get(tp.partition))
        self.writes.append({"positions": dict(positions or {}), "clocks": dict(clocks or {})})


def _app() -> Any:
    return SimpleNamespace(in_recovery=False, consumer_generation_id=1, producer=FakeProducer())


def _settings(tmp_path: Any) -> Settings:
    return dataclasses.replace(Settings.resolve(env={}, home=tmp_path), topic_prefix="t.")


def _record(topic: str, value: bytes, offset: int, partition: int = 0, at: datetime = T0) -> Any:
    tp = TP(topic, partition)
    msg = SimpleNamespace(
        topic=topic,
        partition=partition,
        offset=offset,
        key=b"k",
        value=value,
        timestamp=at.timestamp(),
        tp=(topic, partition),
    )
    return SimpleNamespace(message=msg, tp=tp)


def _run(app: Any, settings: Settings, records: list[Any], table: FakeTable, counters: WorkerCounters) -> Any:
    return asyncio.run(app_mod.Distiller(app, settings, table, counters).handle_traces(records, 1))


def _dead(app: Any, settings: Settings) -> list[dict[str, Any]]:
    return [m for m in app.producer.sent if m["topic"] == settings.dead_letter_topic]


POISON = {
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "deep args": orjson.dumps(trace_event("x", 1, "tool_call", tool="t", call_id="c")).replace(
        b'"call_id":"c"', b'"call_id":"c","args":{"a":' + b"[" * 900 + b"]" * 900 + b"}"
    ),
    "invalid utf-8": orjson.dumps(trace_event("x", 0, "agent_message")).replace(b'"hi"', b'"h\xff\xfei"'),
    "invalid utf-8 key": b'{"\xff": 1}',
    "lone surrogate": orjson.dumps(trace_event("x", 0, "agent_message")).replace(b'"hi"', b'"\\ud800"'),
    "float seq and deep args": orjson.dumps(trace_event("x", 1, "tool_call", tool="t", call_id="c"))
    .replace(b'"seq":1', b'"seq":1.0')
    .replace(b'"call_id":"c"', b'"call_id":"c","args":{"a":' + b"[" * 900 + b"]" * 900 + b"}"),
    "huge seq": orjson.dumps(trace_event("x", 0, "agent_message")).replace(b'"seq":0', b'"seq":' + b"9" * 40),
    "nan": orjson.dumps(trace_event("x", 0, "agent_message")).replace(b'"seq":0', b'"seq":NaN'),
    "scalars bundle": b"[" + b",".join([b"1"] * 2000) + b"]",
}


def test_no_record_stops_the_distiller_and_a_record_is_one_dead_letter(tmp_path):
    app, settings, table, counters = _app(), _settings(tmp_path), FakeTable(), WorkerCounters()
    topic = settings.traces_topic
    records = [_record(topic, session_bundle("good-1"), 0)]
    records += [_record(topic, value, i + 1) for i, value in enumerate(POISON.values())]
    records.append(_record(topic, session_bundle("good-2"), len(records)))
    acks = _run(app, settings, records, table, counters)
    assert len(acks) == len(records)
    dead = _dead(app, settings)
    assert [int(d["headers"]["somnus-source-offset"]) for d in dead] == list(range(1, len(POISON) + 1))
    reasons = dict(zip(POISON, (d["headers"]["somnus-reason"].decode() for d in dead)))
    assert reasons["deep"].startswith("oversized: JSON nested 100000 deep > limit 65 (64 for an event")
    assert reasons["invalid utf-8"].startswith("undecodable: invalid UTF-8")
    assert reasons["lone surrogate"].startswith("undecodable: a lone UTF-16 surrogate")
    assert reasons["float seq and deep args"].startswith("oversized: JSON nested")
    assert reasons["huge seq"].startswith("schema: ") and "`$.seq`" in reasons["huge seq"]
    assert reasons["scalars bundle"].startswith("schema: 2000 of 2000 events of the bundle rejected: #0-#1999 ")
    episodes = [m for m in app.producer.sent if m["topic"] == settings.episodes_topic]
    assert sorted(orjson.loads(e["value"])["session_id"] for e in episodes) == ["good-1", "good-2"]
    assert counters.dead_letters == len(POISON) and counters.poison == 0


def test_a_bundle_with_bad_events_is_one_dead_letter_and_its_good_events_are_applied(tmp_path):
    app, settings, table, counters = _app(), _settings(tmp_path), FakeTable(), WorkerCounters()
    events = orjson.loads(session_bundle("mixed"))
    bundle = orjson.dumps([events[0], 42, events[1], {"type": "nope"}, events[2]])
    _run(app, settings, [_record(settings.traces_topic, bundle, 0)], table, counters)
    (dead,) = _dead(app, settings)
    reason = dead["headers"]["somnus-reason"].decode()
    assert reason.startswith("schema: 2 of 5 events of the bundle rejected: #1 schema: ")
    assert "; #3 schema: " in reason and dead["headers"]["somnus-source-index"] == b"1"
    assert dead["value"] == bundle  # the record's bytes
    (episode,) = [m for m in app.producer.sent if m["topic"] == settings.episodes_topic]
    assert orjson.loads(episode["value"])["event_count"] == 3


def test_a_record_whose_distillation_raises_is_dead_lettered_as_poison_and_the_others_are_distilled(
    tmp_path, monkeypatch
):
    app, settings, table, counters = _app(), _settings(tmp_path), FakeTable(), WorkerCounters()
    real = app_mod.distill_rounds

    def fragile(prior, wm_prior, sifted, *args, **kwargs):
        if any(ev.session_id == "cursed" for ev in sifted.admitted):
            raise RecursionError("maximum recursion depth exceeded")
        return real(prior, wm_prior, sifted, *args, **kwargs)

    monkeypatch.setattr(app_mod, "distill_rounds", fragile)
    topic = settings.traces_topic
    records = [_record(topic, session_bundle(s), i) for i, s in enumerate(["a", "cursed", "b"])]
    acks = _run(app, settings, records, table, counters)
    assert len(acks) == 3
    (dead,) = _dead(app, settings)
    assert dead["headers"]["somnus-reason"].decode() == (
        "poison: RecursionError while distilling the record: maximum recursion depth exceeded"
    )
    assert dead["headers"]["somnus-source-offset"] == b"1" and dead["value"] == records[1].message.value
    episodes = [
        orjson.loads(m["value"])["session_id"] for m in app.producer.sent if m["topic"] == settings.episodes_topic
    ]
    assert sorted(episodes) == ["a", "b"] and counters.poison == 1


def test_a_batch_of_undecodable_records_keeps_its_partitions_stream_time(tmp_path):
    # A position written without the partition's stream time forgot it: late events of forgotten sessions
    # were then taken for new sessions after a run of undecodable records.
    app, settings, table, counters = _app(), _settings(tmp_path), FakeTable(), WorkerCounters()
    topic = settings.traces_topic
    clock = int((T0 + timedelta(days=10)).timestamp() * 1_000_000)
    table[position_key(topic, 0)] = encode_position(5, clock)
    guard = SimpleNamespace()

    async def admit(batch):
        return app_mod.Admitted(handle=list(batch), positions={batch[0].tp: batch[-1].message.offset + 1})

    guard.admit = admit
    records = [_record(topic, b"{not json", 5 + i) for i in range(1000)]
    distiller = app_mod.Distiller(app, settings, table, counters, sessions_guard=guard)
    asyncio.run(distiller.handle_traces(records, 1))
    assert table.writes[-1]["clocks"] == {0: clock}
    assert decode_clock(table[position_key(topic, 0)]) == clock
    # then a late event of a session older than the retention: a dead letter, not a new session
    late = orjson.dumps(trace_event("old", 3, "agent_message", T0))
    asyncio.run(distiller.handle_traces([_record(topic, late, 1005)], 1))
    reason = _dead(app, settings)[-1]["headers"]["somnus-reason"].decode()
    assert reason.startswith("late: ") and "may belong to a session already forgotten" in reason


@pytest.mark.parametrize("year", [2999, 2027])
def test_an_event_far_ahead_of_its_records_broker_time_is_a_future_dead_letter(tmp_path, year):
    app, settings, table, counters = _app(), _settings(tmp_path), FakeTable(), WorkerCounters()
    ahead = orjson.dumps(
        [
            trace_event("f", 0, "session_start", T0.replace(year=year)),
            trace_event("f", 1, "session_end", T0.replace(year=year)),
        ]
    )
    _run(app, settings, [_record(settings.traces_topic, ahead, 0, at=T0)], table, counters)
    dead = _dead(app, settings)
    assert [d["headers"]["somnus-reason"].decode().split(":")[0] for d in dead] == ["future", "future"]
    assert counters.future == 2 and not [m for m in app.producer.sent if m["topic"] == settings.episodes_topic]


def _sealed_sample(topic: str, seed: int) -> tuple[list[Any], list[Any]]:
    """The sample generator's sessions as the publisher sends them: session bundles, each sealed with its
    session's key (every fifth session in plaintext), on 3 partitions; and the keys."""
    from somnus.client import session_bundles
    from somnus.sample import generate
    from somnus.schemas.sealed import new_key, seal

    payloads = [orjson.dumps(e) for e in generate(events=1500, seed=seed)]
    keys: dict[Any, Any] = {}
    records, offsets = [], [0, 0, 0]
    for i, (key, session, _, value) in enumerate(session_bundles(payloads, 16)):
        if session not in keys:
            keys[session] = new_key(*session) if len(keys) % 5 else None
        p = i % 3
        sealed_value = seal(keys[session], value) if keys[session] is not None else value
        records.append(_record(topic, sealed_value, offsets[p], partition=p))
        offsets[p] += 1
    return records, [k for k in keys.values() if k is not None]


@pytest.mark.parametrize("seed", [3, 11])
def test_records_the_sequencer_opened_distil_as_records_their_batch_opens(tmp_path, seed):
    """The plaintexts the sequencer opened for the records' stream time (``OpenedOnce``) are what the
    batch distils: every output and table write is byte for byte what it is when the batch opens every
    record itself; a key forgotten in between makes its record forgotten on both paths."""
    from somnus.processors.knowledge.extraction import TraceExtractor
    from somnus.processors.working.session_buffer import WorkingMemorySettings
    from somnus.schemas.sealed import encode_key, open_value
    from somnus.streams.keys import KeyFollower

    settings = _settings(tmp_path)
    records, keys = _sealed_sample(settings.traces_topic, seed)
    every_key = {k.key_id: k.key for k in keys}
    forgotten = keys[len(keys) // 2]

    def run(through_sequencer: bool) -> Any:
        app, sessions, working, counters = _app(), FakeTable(), FakeTable(), WorkerCounters()
        follower = KeyFollower("", "")
        for k in keys:
            follower.ring.apply(k.key_id.encode(), encode_key(k))
        d = app_mod.Distiller(
            app,
            settings,
            sessions,
            counters,
            working=working,
            extractor=TraceExtractor(),
            wm_settings=WorkingMemorySettings(max_tokens=-1, model_context_tokens=200_000),
            keys=follower,
        )
        if through_sequencer:
            ordered = d.ordered()
            for r in records:
                ordered.add(1, r)
            assert len(d.opened.held) == sum(1 for r in records if r.message.value[:1] == b"\x00")
        follower.ring.apply(forgotten.key_id.encode(), None)  # a forget read before the batches
        for i in range(0, len(records), 40):
            asyncio.run(d.handle_traces(records[i : i + 40], 1))
        assert not d.opened.held
        sent = [
            (m["topic"], m["key"], sorted(m["headers"].items()), open_value(m["value"], every_key))
            for m in app.producer.sent
        ]
        return sent, dict(sessions), dict(working), counters

    new, old = run(through_sequencer=True), run(through_sequencer=False)
    assert new == old
    assert new[3].shredded > 0 and new[3].episodes > 10 and new[3].facts > 0 and new[3].poison == 0


def test_the_sequencer_reads_a_sealed_records_stream_time_after_fetching_its_key(tmp_path):
    """A sealed record whose key the worker had not read yet gave the sequencer no stream time, so the
    records went on in fetch order, and two live runs' memory orders parted (at unit 331 of 1500).
    ``Ordered.prepare`` reads the key topic first; a key still missing after a read (a forgotten
    session's) is not asked for again."""
    from somnus.processors.knowledge.extraction import TraceExtractor
    from somnus.processors.working.session_buffer import WorkingMemorySettings
    from somnus.schemas.sealed import encode_key, sealed_key_id
    from somnus.streams.keys import KeyFollower

    settings = _settings(tmp_path)
    records, keys = _sealed_sample(settings.traces_topic, 3)
    gone = keys[len(keys) // 2]  # a forgotten session's key: its record comes twice (a redelivery)
    records = [*records, next(r for r in records if sealed_key_id(r.message.value) == gone.key_id)]
    kids = [sealed_key_id(r.message.value) for r in records]

    class Follower(KeyFollower):  # the key topic: every key but the forgotten one, read on catch_up
        reads = 0

        async def catch_up(self) -> None:
            self.reads += 1
            for k in keys:
                if k is not gone:
                    self.ring.apply(k.key_id.encode(), encode_key(k))

    def timed(prepare: bool) -> tuple[list[Any], int]:
        follower = Follower("", "")
        d = app_mod.Distiller(
            _app(),
            settings,
            FakeTable(),
            WorkerCounters(),
            working=FakeTable(),
            extractor=TraceExtractor(),
            wm_settings=WorkingMemorySettings(max_tokens=-1, model_context_tokens=200_000),
            keys=follower,
        )
        ordered = d.ordered()

        async def feed() -> list[Any]:
            out = []
            batcher = app_mod.Batcher(d.app, SimpleNamespace(), 10_000, 60.0, None, ordered)
            for r in records:
                if prepare:  # as the worker's Batcher adds it: the key first
                    await batcher.add(r)
                out.append(ordered.time_of(r.message))
            return out

        return asyncio.run(feed()), follower.reads

    before, _ = timed(prepare=False)
    after, reads = timed(prepare=True)
    sealed = [r.message.value[:1] == b"\x00" for r in records]
    of_gone = [kid == gone.key_id for kid in kids]
    assert all(t is None for t, s in zip(before, sealed, strict=True) if s)  # the old way: no time at all
    assert all(t is not None for t, s, g in zip(after, sealed, of_gone, strict=True) if s and not g)
    assert sum(of_gone) == 2 and reads == 2  # one read for every key, one for the gone key: not one per record


def test_a_batch_that_fails_when_the_ticker_flushes_it_is_reported(tmp_path):
    """The ticker flushes a batch no later event fills; an exception there ended its task unseen, and the
    worker held the batch's records for ever (a stall with nothing in the log)."""
    settings = dataclasses.replace(_settings(tmp_path), batch_size=100, batch_within_s=0.05)
    failures: list[BaseException] = []

    class Stream:
        def noack(self) -> Stream:
            return self

        async def events(self) -> Any:
            yield _record(settings.traces_topic, session_bundle("s"), 0)
            await asyncio.sleep(3600)  # nothing more: only the ticker can flush the batch

        async def ack(self, event: Any) -> None:
            raise AssertionError("a failed batch is not acknowledged")

    async def handle(batch: Any, generation: int) -> Any:
        raise RuntimeError("the producer refused a record")

    async def run() -> None:
        body = asyncio.ensure_future(
            app_mod.run_batched(_app(), settings, Stream(), handle, on_failure=failures.append)
        )
        for _ in range(500):
            if failures:
                break
            await asyncio.sleep(0.01)
        body.cancel()

    asyncio.run(run())
    assert [str(f) for f in failures] == ["the producer refused a record"]


def test_a_partition_is_passed_over_as_quiet_only_once_the_broker_said_it_is_at_its_end():
    """``Ordered.confirm_quiet`` asks the consumer for the broker's end offsets of the partitions that
    look quiet by their last fetch; a partition the broker holds more of is waited for."""
    topic = "t.traces"
    fetched = {0: 1, 1: 0}  # partition 1's last fetch found it empty; the broker has 2 records of it
    asked: list[list[int]] = []

    class Consumer:
        def assignment(self) -> set[TP]:
            return {TP(topic, 0), TP(topic, 1)}

        def highwater(self, tp: TP) -> int:
            return fetched[tp.partition]

        async def highwaters(self, *tps: TP) -> dict[TP, int]:
            asked.append(sorted(tp.partition for tp in tps))
            return {tp: {0: 1, 1: 2}[tp.partition] for tp in tps}

    app = SimpleNamespace(consumer=Consumer(), consumer_generation_id=1)
    times = {(0, 0): 100, (1, 0): 50, (1, 1): 150}
    ordered = app_mod.Ordered(app, topic, FakeTable(), lambda msg: times[msg.partition, msg.offset])
    ordered.sequencer.quiet_s = 0.0

    def add(p: int, offset: int) -> list[tuple[int, int]]:
        return [(e.message.partition, e.message.offset) for _, e in ordered.add(1, _record(topic, b"", offset, p))]

    assert add(0, 0) == []
    asyncio.run(ordered.confirm_quiet())
    assert asked == [[1]] and ordered.ready() == []  # by its fetch partition 1 is at its end; not by the broker
    fetched[1] = 2
    assert add(1, 0) == [(1, 0)]  # 50 before 100; 100 waits for what partition 1 shows next
    assert add(1, 1) == [(0, 0)]  # 150 after 100, and it waits: partition 0 is not confirmed at its end yet
    asyncio.run(ordered.confirm_quiet())
    assert asked[-1] == [0] and [(e.message.partition, e.message.offset) for _, e in ordered.ready()] == [(1, 1)]
