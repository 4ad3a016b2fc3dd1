"""Dreaming on a conversation (issue 29): chat messages, not tool traces. A small LoCoMo-shaped
conversation, imported as ``somnus import --format locomo`` does, captured by the memory fold and
slept on: every dream phase does work, with the merge threshold adapted to the agent's own
geometry (``dreaming.agent_merge_pe``), not to a constant tuned for tool traces."""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone

import orjson
import pytest

from somnus.importers import locomo
from somnus.processors.episodic.capture import MemoryState, capture, message_units
from somnus.processors.episodic.index import IndexConfig
from somnus.processors.sleep import dreaming
from somnus.processors.sleep.config import SleepConfig
from somnus.processors.sleep.plan import plan_sleep
from somnus.projections.memory import stemmer
from somnus.projections.sleep import dream_inputs, memory_columns
from somnus.schemas.codec import decode_trace

# Two friends over six sessions: a few topics that come back, each turn a new sentence about one.
TOPICS = {
    "pottery": ["pottery", "class", "clay", "bowl", "glaze", "kiln", "wheel", "mug"],
    "hiking": ["hike", "trail", "lake", "mountain", "boots", "summit", "camping", "forest"],
    "dog": ["dog", "puppy", "walk", "park", "leash", "vet", "fetch", "treats"],
    "work": ["job", "office", "boss", "project", "deadline", "meeting", "promotion", "team"],
    "music": ["guitar", "song", "concert", "band", "lessons", "practice", "album", "violin"],
}
FILLER = [
    "really",
    "today",
    "weekend",
    "finally",
    "again",
    "love",
    "think",
    "great",
    "fun",
    "tired",
    "yesterday",
    "friends",
    "family",
    "excited",
    "busy",
    "new",
    "started",
    "went",
    "tried",
    "felt",
]


def _conversation(seed: int, sessions: int = 6, turns: int = 24) -> dict:
    rng = random.Random(seed)
    conv: dict = {"speaker_a": "Mira", "speaker_b": "Theo"}
    start = datetime(2023, 5, 8, 13, 0, tzinfo=timezone.utc)
    for s in range(1, sessions + 1):
        when = start + timedelta(days=4 * s, hours=s)
        conv[f"session_{s}_date_time"] = (
            f"{when.hour % 12 or 12}:{when.minute:02d} {'pm' if when.hour >= 12 else 'am'} "
            f"on {when.day} {when.strftime('%B')}, {when.year}"
        )
        turns_of = []
        for t in range(turns):
            topic = TOPICS[rng.choice(sorted(TOPICS))]
            words = rng.sample(topic, 4) + rng.sample(FILLER, 4)
            rng.shuffle(words)
            turns_of.append(
                {
                    "speaker": "Mira" if t % 2 == 0 else "Theo",
                    "dia_id": f"D{s}:{t + 1}",
                    "text": " ".join(words).capitalize() + ".",
                }
            )
        conv[f"session_{s}"] = turns_of
    return {"sample_id": f"conv-{seed}", "conversation": conv, "qa": []}


@pytest.fixture(scope="module", params=[1, 2])
def conversation(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("locomo") / "conv.json"
    path.write_text(json.dumps([_conversation(request.param)]))
    events = [decode_trace(orjson.dumps(e), 1 << 20) for e in locomo(path)]
    return message_units(events)


def test_every_dream_phase_works_on_a_conversation(conversation):
    units = conversation
    assert units and {u.mode for u in units} == {"conversation"}
    state = MemoryState.empty(IndexConfig(stem=stemmer()))
    capture(state, units, max(u.occurred_at for u in units))
    frame, edges = memory_columns(state)
    config = SleepConfig()
    inputs = dream_inputs(state, frame, edges, None, config)
    assert inputs.observations.height > 0
    plan = plan_sleep(inputs, now=max(u.occurred_at for u in units) + timedelta(hours=1), config=config)
    assert plan is not None
    counts = plan.counts
    for phase in ("clustered", "created", "refined", "connected", "abstracted"):
        assert counts.get(phase, 0) > 0, (phase, counts)
    assert counts["clustered"] + counts["held"] + counts["created"] == inputs.observations.height
    assert plan.report.reviewed > 0, counts
    assert plan.report.per_layer["hippocampus"]["before"] > 0
    # a conversation's patterns are topics that come back across sessions
    patterns = [ev for ev in plan.events() if type(ev).__name__ == "PatternAbstracted"]
    assert all(len(ev.domains) >= 2 and ev.support >= 3 for ev in patterns)
    assert {ev.key for ev in patterns} & {w for words in TOPICS.values() for w in words}


def test_a_conversation_would_not_cluster_with_the_tool_trace_constant(conversation):
    # The reason for the adaptive merge PE: with the fixed 0.15, chat messages (whose nearest
    # neighbours share a few words, PE 0.3 or more) are never the same thing.
    state = MemoryState.empty(IndexConfig(stem=stemmer()))
    capture(state, conversation, max(u.occurred_at for u in conversation))
    frame, edges = memory_columns(state)
    inputs = dream_inputs(state, frame, edges, None, SleepConfig())
    ids = frame["memory_id"].to_list()
    obs = inputs.observations["observation_id"].to_list()
    pool = [m for m in ids if m not in set(obs)]
    vectors = inputs.embed(pool)
    sims = vectors @ vectors.T
    sims[range(len(pool)), range(len(pool))] = -1.0
    nearest_pe = 1.0 - sims.max(axis=1)
    assert nearest_pe.min() > dreaming.MERGE_PE * 1.5  # above any fixed-constant threshold
    assert dreaming.agent_merge_pe(nearest_pe) > dreaming.MERGE_PE
