"""The distiller's Faust wiring (``somnus.streams.app.Distiller``) through Faust's own ``agent.test_context()``:
records put on an agent's local channel go through ``run_batched``, the batch handler, the tables and
the producer (one fake, recording what is sent to each outbound topic), with no broker."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
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
def distiller(tmp_path: Any) -> Iterator[Distiller]:
    settings = dataclasses.replace(Settings.resolve(env={}, home=tmp_path), topic_prefix="t.", batch_size=1)
    d = Distiller.create(settings, "127.0.0.1:1", worker_name="w")
    d.app.producer = Sent()
    for guard in d.guards.values():  # no broker to ask where a partition starts: at 0
        guard.earliest = _zero
    d.app.finalize()
    d.app.flow_control.resume()
    yield d


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
