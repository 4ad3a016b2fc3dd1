"""The distiller's Faust wiring (``somnus.streams.app.Distiller``) through Faust's own ``agent.test_context()``:
records put on an agent's local channel go through ``run_batched``, the batch handler, the tables and
the producer (one fake, recording what is sent to each outbound topic), with no broker."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import msgspec
import orjson
import pytest

from somnus.config import Settings
from somnus.schemas.causal import OutcomeObserved
from somnus.schemas.episodes import EpisodeDistilled
from somnus.streams.app import Distiller
from somnus.streams.ordering import decode_position, position_key
from tests.factories import T0, trace_event


class Sent:
    """A producer that records each send by topic (Faust's ``app.producer`` in the agents' batches)."""

    def __init__(self) -> None:
        self.by_topic: dict[str, list[dict[str, Any]]] = {}

    async def send(self, topic: str, key: Any, value: Any, partition: Any, timestamp: Any, headers: Any) -> Any:
        self.by_topic.setdefault(topic, []).append({"key": key, "value": value, "headers": dict(headers or [])})
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


@pytest.fixture
def distiller(tmp_path: Any, monkeypatch: Any) -> Iterator[Distiller]:
    settings = dataclasses.replace(Settings.resolve(env={}, home=tmp_path), topic_prefix="t.", batch_size=1)
    # no consumer to ask which partitions are this worker's: the one test_context puts records on
    monkeypatch.setattr("somnus.streams.app._owned", lambda app, topic: frozenset({0}))
    d = Distiller.create(settings, "127.0.0.1:1", worker_name="w")
    failures: list[BaseException] = []
    d.on_failure = failures.append  # not the worker's exit: a batch that raised fails the test below
    d.app.producer = Sent()
    for guard in d.guards.values():  # no broker to ask where a partition starts: at 0
        guard.earliest = _zero
    d.app.finalize()
    d.app.flow_control.resume()
    yield d
    assert not failures, failures


async def _zero(tp: Any) -> int:
    return 0


def _agent(d: Distiller, name: str) -> Any:
    return d.app.agents[f"somnus.streams.app.{name}"]


def _session(session: str) -> bytes:
    events = [
        ("session_start", {"task": "refund"}),
        ("tool_call", {"tool": "lookup", "call_id": "c1"}),
        ("tool_result", {"call_id": "c1", "ok": False, "error": "Error: order 7 not found"}),
        ("session_end", {"outcome": "failure"}),
    ]
    return orjson.dumps([trace_event(session, seq, kind, T0, payload) for seq, (kind, payload) in enumerate(events)])


def test_the_agents_are_wired_to_their_topics(distiller):
    s = distiller.settings
    topics = {name.rsplit(".", 1)[1]: set(agent.channel.topics) for name, agent in distiller.app.agents.items()}
    assert topics == {"distill_sessions": {s.traces_topic}, "learn_links": {s.observations_topic}}
    assert {t.name for t in distiller.app.tables.values()} == {"sessions", "links", "working_memory"}
    assert distiller.app.somnus_counters is distiller.counters


def test_a_session_through_the_distill_agent_is_an_episode_its_facts_and_its_state(distiller):
    s, sent = distiller.settings, distiller.app.producer

    async def run() -> None:
        async with _agent(distiller, "distill_sessions").test_context() as agent:
            await agent.put(_session("s1"), key=b"support/s1")
            await _until(lambda: position_key(s.traces_topic, 0) in distiller.sessions)  # the batch's last write

    asyncio.run(run())
    (episode,) = sent.by_topic[s.episodes_topic]
    ep = msgspec.json.decode(episode["value"], type=EpisodeDistilled)
    assert (ep.agent, ep.session_id, ep.outcome.value, ep.event_count) == ("support", "s1", "failure", 4)
    assert len(sent.by_topic[s.facts_topic]) == 1 and s.observations_topic in sent.by_topic
    assert distiller.counters.events == 4 and distiller.counters.episodes == 1
    assert s.dead_letter_topic not in sent.by_topic
    # the session's marker and the partition's position, written by the batch through the table
    assert b'"closed":true' in distiller.sessions[b"support\x1fs1"]
    assert decode_position(distiller.sessions[position_key(s.traces_topic, 0)]) == 1


def test_an_undecodable_record_through_the_distill_agent_is_one_dead_letter(distiller):
    s, sent = distiller.settings, distiller.app.producer

    async def run() -> None:
        async with _agent(distiller, "distill_sessions").test_context() as agent:
            await agent.put(b"{not json", key=b"k")
            await _until(lambda: s.dead_letter_topic in sent.by_topic)

    asyncio.run(run())
    (dead,) = sent.by_topic[s.dead_letter_topic]
    assert dead["value"] == b"{not json" and dead["headers"]["somnus-reason"].startswith(b"undecodable: ")
    assert dead["headers"]["somnus-source-offset"] == b"0"
    assert distiller.counters.dead_letters == 1 and s.episodes_topic not in sent.by_topic


def test_the_observations_a_session_makes_teach_the_links_agent(distiller):
    s, sent = distiller.settings, distiller.app.producer

    async def run() -> None:
        async with _agent(distiller, "distill_sessions").test_context() as agent:
            await agent.put(_session("s2"), key=b"support/s2")
            await _until(lambda: position_key(s.traces_topic, 0) in distiller.sessions)
        async with _agent(distiller, "learn_links").test_context() as agent:
            for m in sent.by_topic[s.observations_topic]:
                await agent.put(m["value"])
            await _until(lambda: position_key(s.observations_topic, 0) in distiller.links)

    asyncio.run(run())
    observed = [
        o
        for m in sent.by_topic[s.observations_topic]
        for o in msgspec.json.decode(m["value"], type=list[OutcomeObserved])
    ]
    assert observed and distiller.counters.observations == len(observed)
    # each signature observed has its link state in the table, and its updates went to the link-updates topic
    assert {o.event_signature.encode() for o in observed} <= set(distiller.links.keys())
    assert distiller.counters.link_updates > 0 and s.link_updates_topic in sent.by_topic
    assert s.dead_letter_topic not in sent.by_topic


async def _until(done: Any, timeout_s: float = 10.0) -> None:
    """Wait for the agent's batch (flushed by the Batcher's ticker or at ``batch_size``) to be handled."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not done():
        assert asyncio.get_running_loop().time() < deadline, "the agent handled nothing"
        await asyncio.sleep(0.01)


def _observation(episode: Any, signature: str, index: int) -> OutcomeObserved:
    return OutcomeObserved(
        event_signature=signature,
        level="call",
        tool="lookup",
        outcome_signature="error:Timeout",
        outcome="error:Timeout",
        valence="negative",
        agent="support",
        observed_at=T0,
        episode_id=episode,
        src_partition=0,
        src_offset=index,
        index=0,
    )


def test_several_sessions_observations_share_a_record_per_partition_and_keep_their_keys(distiller):
    """Observations of two sealed sessions and a plaintext one: with ``multipart_records``, one multi-part
    record per partition (each session's part under its key, order kept); the links agent seals every
    update with its episode's key, and a forgotten session's part is skipped while the others are learnt."""

    from somnus.schemas.causal import CausalLinkUpdated
    from somnus.schemas.causal import OutcomeObserved as Observed
    from somnus.schemas.sealed import encode_key, new_key, open_value, parts_of, sealed_key_id
    from somnus.streams.app import _send_bundles
    from somnus.streams.topics import signature_partition

    distiller.settings = dataclasses.replace(distiller.settings, multipart_records=True)
    s, sent = distiller.settings, distiller.app.producer
    distiller.keys.bootstrap = ""  # offline: its ring is every key there is (a forgotten one is not asked for)
    ring = distiller.keys.ring
    keys = {name: new_key("support", name) for name in ("s1", "s2")}
    for k in keys.values():
        ring.apply(k.key_id.encode(), encode_key(k))
    episodes = {name: uuid.uuid4() for name in ("s1", "s2", "s3")}
    key_of_episode = {episodes[n]: k for n, k in keys.items()}  # s3: plaintext
    sigs = [f"{i:08x}{i:056x}" for i in range(12)]  # hex digests, over every partition
    items = [_observation(episodes[n], sig, i) for i, (n, sig) in enumerate((n, g) for g in sigs for n in episodes)]

    async def send(joined: bool) -> list[dict[str, Any]]:
        await _send_bundles(
            distiller.app,
            s.observations_topic,
            s.partitions,
            items,
            lambda o: o.event_signature,
            lambda o: key_of_episode.get(o.episode_id),
            joined,
        )
        return sent.by_topic.pop(s.observations_topic)

    async def run() -> None:
        separate = await send(False)  # the default layout: a record per session
        assert [sealed_key_id(m["value"]) for m in separate].count(keys["s1"].key_id) == len(separate) // 3
        records = await send(True)
        sent.by_topic[s.observations_topic] = records
        partitions = {signature_partition(g, s.partitions) for g in sigs}
        assert len(records) == len(partitions) > 1  # not one per partition and session
        for m in records:
            parts = parts_of(m["value"])
            assert [sealed_key_id(p) for p in parts] == [keys["s1"].key_id, keys["s2"].key_id, None]
        got = [o for m in records for o in msgspec.json.decode(open_value(m["value"], ring.keys), type=list[Observed])]
        assert sorted(got, key=lambda o: o.src_offset) == items

        assert len(separate) == 3 * len(records)
        ring.apply(keys["s2"].key_id.encode(), None)  # forget s2 before the links agent reads them
        async with _agent(distiller, "learn_links").test_context() as agent:
            for m in records:
                await agent.put(m["value"])
            await _until(lambda: distiller.counters.link_updates >= 24)

    asyncio.run(run())
    records = sent.by_topic[s.observations_topic]
    assert distiller.counters.link_updates == 24 and distiller.counters.shredded == len(records)
    updates = []
    for m in sent.by_topic[s.link_updates_topic]:
        for part in parts_of(m["value"]):
            kid = sealed_key_id(part)
            for u in msgspec.json.decode(open_value(part, ring.keys), type=list[CausalLinkUpdated]):
                updates.append(u)
                expected = key_of_episode.get(u.episode_id)
                assert kid == (expected.key_id if expected is not None else None)
    assert {u.episode_id for u in updates} == {episodes["s1"], episodes["s3"]}
    assert all(len(parts_of(m["value"])) == 2 for m in sent.by_topic[s.link_updates_topic])  # s1's and s3's
    assert s.dead_letter_topic not in sent.by_topic


def _changelog(table: Any, key: Any, value: Any, offset: int) -> Any:
    """A changelog record of ``table`` as Faust's recovery hands it to ``apply_changelog_batch``."""
    msg = SimpleNamespace(
        topic=table.changelog_topic.get_topic_name(), partition=0, offset=offset, key=key, value=value, headers=[]
    )
    return SimpleNamespace(key=key, value=value, message=msg)


# values another producer (or damage) could leave on a changelog topic, under a session's key
UNREADABLE = {
    "not JSON": b"{not json",
    "a closed marker, truncated": b'{"closed":true,"partit',
    "wrong types": b'{"closed":"yes","partition":"p"}',
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "invalid utf-8": b'{"\xff":1}',
}


def test_a_changelog_value_the_agent_cannot_read_is_restored_as_absent_and_dead_lettered(distiller):
    s, sent, sessions = distiller.settings, distiller.app.producer, distiller.sessions
    key = b"support\x1fs3"
    good_position = (position_key(s.traces_topic, 1), b"7 1700000000000000")
    batch = [_changelog(sessions, key, value, i) for i, value in enumerate(UNREADABLE.values())]
    batch += [
        _changelog(sessions, position_key(s.traces_topic, 0), b"seven", 10),  # a position that is not one
        _changelog(sessions, position_key(s.traces_topic, 2), b"-3", 11),
        _changelog(sessions, None, b"{}", 12),  # no key
        _changelog(sessions, *good_position, 13),
        _changelog(sessions, b"support\x1fgone", None, 14),  # a tombstone
    ]
    sessions.apply_changelog_batch(batch)
    assert sessions[key] is None and sessions[position_key(s.traces_topic, 0)] is None
    assert sessions[good_position[0]] == good_position[1]  # a readable value is restored as it was
    assert [m.offset for m, _ in sessions.unreadable] == [0, 1, 2, 3, 4, 10, 11, 12]

    async def run() -> None:
        # the session whose state was unreadable distils from scratch: its episode is made
        async with _agent(distiller, "distill_sessions").test_context() as agent:
            await agent.put(_session("s3"), key=b"support/s3")
            await _until(lambda: position_key(s.traces_topic, 0) in distiller.sessions)

    asyncio.run(run())
    (episode,) = sent.by_topic[s.episodes_topic]
    assert msgspec.json.decode(episode["value"], type=EpisodeDistilled).session_id == "s3"
    dead = sent.by_topic[s.dead_letter_topic]
    assert [d["headers"]["somnus-source-offset"] for d in dead] == [b"0", b"1", b"2", b"3", b"4", b"10", b"11", b"12"]
    changelog = sessions.changelog_topic.get_topic_name().encode()
    assert {d["headers"]["somnus-source-topic"] for d in dead} == {changelog}
    reason = dead[0]["headers"]["somnus-reason"].decode()
    assert (
        reason.startswith("poison: ")
        and "while restoring the table 'sessions' (the key is restored as absent)" in reason
    )
    for (what, value), d in zip(UNREADABLE.items(), dead):  # the value itself (the deep one: its head)
        assert value.startswith(d["value"]) and (what == "deep" or d["value"] == value), what
    assert not sessions.unreadable and distiller.counters.poison == 8


def test_both_agents_draining_the_unreadable_values_at_once_send_each_once(distiller):
    """The traces and observations agents both drain them at the start of a batch: concurrently, each
    sent the first value and one then popped an empty list, which stopped the worker."""
    sessions, links = distiller.sessions, distiller.links
    sessions.apply_changelog_batch([_changelog(sessions, b"support\x1fs%d" % i, b"{not", i) for i in range(3)])
    links.apply_changelog_batch([_changelog(links, b"0123456789abcdef", b"[", 7)])
    sent: list[int] = []

    async def send(msg: Any, rejection: Any) -> None:
        await asyncio.sleep(0)  # a send yields to the other agent, as the producer's does
        sent.append(msg.offset)

    distiller.dead.send = send  # type: ignore[method-assign]

    async def run() -> None:
        await asyncio.gather(distiller.dead_letter_unreadable(), distiller.dead_letter_unreadable())

    asyncio.run(run())
    assert sorted(sent) == [0, 1, 2, 7] and distiller.counters.poison == 4
    assert not sessions.unreadable and not links.unreadable


def test_an_unreadable_link_state_is_restored_as_absent_and_its_signature_learns_again(distiller):
    s, sent, links = distiller.settings, distiller.app.producer, distiller.links
    sig = "0123456789abcdef"
    observed = [_observation(uuid.UUID(int=1), sig, 0)]
    links.apply_changelog_batch([_changelog(links, sig.encode(), b'{"strength":"strong"}', 0)])
    assert links[sig.encode()] is None and len(links.unreadable) == 1

    async def run() -> None:
        async with _agent(distiller, "learn_links").test_context() as agent:
            await agent.put(msgspec.json.encode(observed))
            await _until(lambda: position_key(s.observations_topic, 0) in distiller.links)

    asyncio.run(run())
    assert links[sig.encode()] is not None and distiller.counters.link_updates > 0
    (dead,) = sent.by_topic[s.dead_letter_topic]
    assert b"while restoring the table 'links'" in dead["headers"]["somnus-reason"]


def test_an_observation_whose_signature_is_not_hex_is_a_dead_letter_not_a_crash(distiller):
    """Its signature picks its partition (``signature_partition`` reads hex): the links agent crashed on it."""
    s, sent = distiller.settings, distiller.app.producer
    bad = msgspec.json.encode([_observation(uuid.UUID(int=1), "support|lookup", 0)])
    good = msgspec.json.encode([_observation(uuid.UUID(int=2), "0123456789abcdef", 0)])

    async def run() -> None:
        async with _agent(distiller, "learn_links").test_context() as agent:
            await agent.put(bad)
            await agent.put(good)
            await _until(lambda: decode_position(distiller.links.get(position_key(s.observations_topic, 0))) == 2)

    asyncio.run(run())
    (dead,) = sent.by_topic[s.dead_letter_topic]
    assert dead["value"] == bad and dead["headers"]["somnus-reason"].startswith(b"schema: invalid observations: ")
    assert b"event_signature" in dead["headers"]["somnus-reason"] and distiller.counters.link_updates == 1
