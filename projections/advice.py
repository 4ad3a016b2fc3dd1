"""What ``advise`` reads from the projections: an agent's past episodes (with the entities its
facts name and the memories of its sessions) and the NAc's tool-level links.

Scoping: the episodes are the agent's own (``agent:<name>``, the route's agent); the tool links are
the fleet's, as ``/predict`` reads them (a tool fails for every caller alike).
"""

from __future__ import annotations

from typing import Any

import duckdb
import msgspec

from somnus.processors.prediction.advise import AdviceInputs, PastEpisode, ToolRisk, words_of

_calls = msgspec.json.Decoder(list[dict[str, Any]])

# One row per episode: its calls, the entities of the facts it changed, and its session's memories.
_EPISODES_SQL = """
    WITH ep AS (SELECT episode_id, session_id, task, outcome, calls FROM episodes WHERE agent = ?),
    ents AS (SELECT h.episode_id, list(DISTINCT e ORDER BY e) AS entities
             FROM triple_history h JOIN triples t USING (triple_id), unnest([t.source, t.target]) AS u(e)
             WHERE h.episode_id IN (SELECT episode_id FROM ep) GROUP BY 1),
    mems AS (SELECT run_id, list(memory_id ORDER BY position, memory_id) AS memory_ids
             FROM memories WHERE agent = ? AND kind = 'episode' GROUP BY 1)
    SELECT ep.episode_id::VARCHAR, ep.session_id, ep.task, ep.outcome, ep.calls::VARCHAR,
           coalesce(ents.entities, []), coalesce(mems.memory_ids, [])
    FROM ep LEFT JOIN ents USING (episode_id) LEFT JOIN mems ON mems.run_id = ep.session_id
    ORDER BY ep.episode_id"""

_TOOLS_SQL = """
    SELECT tool, outcome, valence, strength, observations, event_observations
    FROM causal_links WHERE level = 'tool' ORDER BY tool, outcome"""

_SUCCESS = {"success": True, "failure": False}


def past_episode(
    episode_id: str,
    session_id: str,
    task: str | None,
    outcome: str,
    calls: str | None,
    entities: list[str],
    memory_ids: list[str],
) -> PastEpisode:
    tools: dict[str, None] = {}
    failed: dict[str, None] = {}
    for call in _calls.decode(calls) if calls else []:
        tool = call.get("tool")
        if not isinstance(tool, str):
            continue
        tools.setdefault(tool)
        if call.get("ok") is False:
            failed.setdefault(tool)
    return PastEpisode(
        episode_id=episode_id,
        session_id=session_id,
        task=task,
        success=_SUCCESS.get(outcome),
        tools=list(tools),
        failed_tools=list(failed),
        entities=list(entities),
        memory_ids=list(memory_ids),
        words=words_of(task),
    )


def tool_risks(rows: list[tuple[Any, ...]]) -> dict[str, ToolRisk]:
    by_tool: dict[str, list[tuple[Any, ...]]] = {}
    for row in rows:
        by_tool.setdefault(row[0], []).append(row)
    out = {}
    for tool, links in by_tool.items():
        calls = max(int(r[5]) for r in links)
        ok = sum(int(r[4]) for r in links if r[1] == "ok")
        out[tool] = ToolRisk(
            tool=tool,
            calls=calls,
            errors=calls - ok,
            outcomes={r[1]: float(r[3]) for r in links},
            negative={r[1] for r in links if r[2] == "negative"},
        )
    return out


def advice_inputs(con: duckdb.DuckDBPyConnection, agent: str) -> AdviceInputs:
    """The inputs of ``somnus.processors.prediction.advise.advise`` for ``agent``."""
    episodes = [past_episode(*row) for row in con.execute(_EPISODES_SQL, [agent, agent]).fetchall()]
    return AdviceInputs(episodes=episodes, tools=tool_risks(con.execute(_TOOLS_SQL).fetchall()))


# Every projected write (episodes, facts, link updates, forgets) moves a projected offset forward, so
# their sum grows with every batch.
_VERSION_SQL = "SELECT count(*), sum(next_offset) FROM projection_offsets"


class AdviceCache:
    """The inputs of each agent asked about, kept while the store is unchanged: the projected offsets
    are its version, so any batch (new episodes, links, facts, a forget) empties the cache."""

    MAX_AGENTS = 1024  # agents kept between two batches (beyond: emptied, then refilled as asked)

    def __init__(self) -> None:
        self.version: Any = None
        self.inputs: dict[str, AdviceInputs] = {}

    def inputs_for(self, con: duckdb.DuckDBPyConnection, agent: str, version: Any = None) -> AdviceInputs:
        """``version``: the store's version when the caller knows it (the projector's offsets after
        its last commit), else read from ``projection_offsets``."""
        if version is None:
            version = con.execute(_VERSION_SQL).fetchone()
        if version != self.version or len(self.inputs) >= self.MAX_AGENTS:
            self.version, self.inputs = version, {}
        got = self.inputs.get(agent)
        if got is None:
            got = self.inputs[agent] = advice_inputs(con, agent)
        return got
