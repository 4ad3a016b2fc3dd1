"""Goals: the ``GoalSet`` / ``GoalClosed`` records of the memory topic, folded into ``goals``.

``goals`` is append-only: one row when a goal is set, one each time its forward prediction error
changes (measured after every batch of memory units captured, over the memories its agent and user
may read: ``somnus.processors.episodic.goals.forward_pe``), one when it is closed. A goal's current
state is its latest row. The fold runs inside the memory fold (``projections/memory.py``), in the
topic's order, so a replay measures every goal against the same memories at the same place.

The open goals are held in memory, reloaded from the table at start and after a rolled-back batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import duckdb
import msgspec
import pyarrow as pa

from somnus.processors.episodic.capture import MemoryState
from somnus.processors.episodic.goals import ForwardPE, Goal, closer, forward_pe, measured
from somnus.projections.frames import registered
from somnus.schemas.memory import MemoryUnit
from somnus.schemas.goals import KIND_GOAL_CLOSED, KIND_GOAL_SET, GoalClosed, GoalSet, GoalStatus

KINDS = (KIND_GOAL_SET, KIND_GOAL_CLOSED)

_set_decoder = msgspec.json.Decoder(GoalSet)
_closed_decoder = msgspec.json.Decoder(GoalClosed)


class GoalsProjection:
    """The open goals (goal id -> (goal, its forward PE)) and the rows of this batch."""

    def __init__(self, con: duckdb.DuckDBPyConnection, agents: Mapping[str, Any] | None = None) -> None:
        self.agents = dict(agents or {})
        self.open: dict[str, tuple[Goal, ForwardPE]] = {}
        self.rows: list[dict[str, Any]] = []
        self.next_ord = 0
        self.reload(con)

    def reload(self, con: duckdb.DuckDBPyConnection) -> None:
        self.rows.clear()
        self.open, self.next_ord = {}, 0
        try:
            con.execute("SELECT 1 FROM goals LIMIT 0")
        except duckdb.CatalogException:  # a file made before goals, opened read-only: it has none
            return
        self.next_ord = con.execute("SELECT coalesce(max(ord) + 1, 0) FROM goals").fetchone()[0]  # type: ignore[index]
        latest = con.execute(
            "SELECT goal_id, agent, text, user_id, status, forward_pe, nearest_id FROM goals "
            "QUALIFY row_number() OVER (PARTITION BY goal_id ORDER BY ord DESC) = 1"
        ).fetchall()
        self.open = {
            g: (Goal(g, a, t, u), measured(g, near, 1.0 - pe))
            for g, a, t, u, st, pe, near in latest
            if st == GoalStatus.OPEN.value
        }

    def fold(self, state: MemoryState, kind: bytes | None, raw: bytes, offset: int) -> None:
        """Apply one goal record (``kind`` one of ``KINDS``) at its place in the memory topic."""
        if kind == KIND_GOAL_SET:
            req = _set_decoder.decode(raw)
            if req.goal_id in self.open:  # a copy, or a goal id reused while open: the first one holds
                return
            goal = Goal(req.goal_id, req.agent, req.text, req.user_id)
            got = forward_pe(state.index, goal, now=req.at, agents=self.agents)
            self.open[goal.goal_id] = (goal, got)
            self._row(goal, GoalStatus.OPEN, got, req.at, offset, req.set_by)
            return
        done = _closed_decoder.decode(raw)
        held = self.open.get(done.goal_id)
        if held is not None and held[0].agent == done.agent:  # another agent's goal of that id stays open
            del self.open[done.goal_id]
            self._row(held[0], done.status, held[1], done.at, offset, "")

    def remeasure(self, state: MemoryState, stored: Sequence[MemoryUnit], now: datetime, offset: int) -> None:
        """New memories were stored: each open goal they bring closer gets a row (``closer``). A goal
        whose nearest memory is gone (slept away, forgotten) is measured again in full."""
        ix = state.index
        for goal_id, (goal, pe) in sorted(self.open.items()):
            near = pe.nearest_id
            if near is not None and (near not in ix.pos or not ix.alive.data[ix.pos[near]]):
                got = forward_pe(ix, goal, now=now, agents=self.agents)
            elif stored:
                got = closer(ix, goal, pe, stored, self.agents)
            else:
                continue
            if got != pe:
                self.open[goal_id] = (goal, got)
                self._row(goal, GoalStatus.OPEN, got, now, offset, "")

    def _row(self, goal: Goal, status: GoalStatus, pe: ForwardPE, at: datetime, offset: int, set_by: str) -> None:
        self.rows.append(
            {
                "ord": self.next_ord,
                "goal_id": goal.goal_id,
                "agent": goal.agent,
                "text": goal.text,
                "user_id": goal.user_id,
                "status": status.value,
                "forward_pe": pe.forward_pe,
                "nearest_id": pe.nearest_id,
                "changed_at": at,
                "set_by": set_by,
                "src_offset": offset,
            }
        )
        self.next_ord += 1

    def write(self, con: duckdb.DuckDBPyConnection) -> int:
        n = len(self.rows)
        if n:
            with registered(con, frame=pa.Table.from_pylist(self.rows)):
                con.execute(
                    "INSERT INTO goals SELECT ord, goal_id, agent, text, user_id, status, forward_pe, "
                    "nearest_id, changed_at, set_by, src_offset FROM frame"
                )
            self.rows.clear()
        return n

    def pull(self, agent: str, user_id: str | None) -> tuple[list[Goal], float]:
        """The open goals of ``agent`` a reader acting for ``user_id`` may see (its own and user-less
        ones), and their highest forward PE: how hard they pull recall."""
        mine = [(g, pe.forward_pe) for g, pe in self.open.values() if g.agent == agent and g.user_id in (None, user_id)]
        return [g for g, _ in sorted(mine, key=lambda x: x[0].goal_id)], max((pe for _, pe in mine), default=0.0)


# ---- reads (GET /agents/{agent}/goals, /agents/{agent}/wander) --------------------------------------

WANDER_POOL = 2000  # the newest readable memories wander may visit, besides the goal-adjacent ones


def goals_of(
    con: duckdb.DuckDBPyConnection, agent: str, user_id: str | None, include_closed: bool
) -> list[dict[str, Any]]:
    """The agent's goals (a reader acting for ``user_id`` sees that user's and user-less ones; without
    a user, user-less ones only), newest first: each one's latest state, when it was set, and how its
    forward PE moved (``trend``: the values, oldest first)."""
    rows = con.execute(
        "SELECT goal_id, arg_max(text, ord), arg_max(user_id, ord), arg_max(status, ord), arg_max(forward_pe, ord), "
        "arg_max(nearest_id, ord), min(changed_at), max(changed_at), arg_min(set_by, ord), "
        "list(forward_pe ORDER BY ord) FROM goals WHERE agent = ? AND (user_id IS NULL OR user_id = ?) "
        "GROUP BY goal_id ORDER BY min(ord) DESC",
        [agent, user_id],
    ).fetchall()
    keys = (
        "goal_id",
        "text",
        "user_id",
        "status",
        "forward_pe",
        "nearest_id",
        "set_at",
        "changed_at",
        "set_by",
        "trend",
    )
    out = [dict(zip(keys, r)) for r in rows]
    return [g for g in out if include_closed or g["status"] == GoalStatus.OPEN.value]


def wander_pool(
    state: MemoryState,
    agent: str,
    scopes: list[str],
    user_id: str | None,
    adjacency: Mapping[str, float],
    now: datetime,
    start: str | None = None,
) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
    """The memories the reader may visit (``WanderNode`` by id) and the graph between them: the newest
    ``WANDER_POOL`` readable ones, the goal-adjacent ones, ``start``, and their neighbours."""
    import numpy as np

    from somnus.processors.episodic.goals import WanderNode

    ix = state.index
    n = len(ix.ids)
    codes = np.array(sorted(ix.scopes[s] for s in scopes if s in ix.scopes), dtype=np.int32)
    readable = ix.alive.data[:n] & np.isin(ix.scope_code.data[:n], codes) & ix.user_mask(user_id)
    rows = set(np.flatnonzero(readable)[-WANDER_POOL:].tolist())
    near = {ix.pos[m] for m in (*adjacency, *([start] if start else [])) if m in ix.pos}
    rows |= near | {j for i in near for j in ix.graph.get(i, {})}
    rows = {i for i in rows if readable[i]}

    def node(i: int) -> WanderNode:
        seen = max(float(ix.last_access.data[i]), float(ix.occurred.data[i]))
        merged = ix.merged[i]
        return WanderNode(
            ix.ids[i], int(ix.access_count.data[i]), merged / (merged + 1), datetime.fromtimestamp(seen, tz=now.tzinfo)
        )

    nodes = {ix.ids[i]: node(i) for i in sorted(rows)}
    graph = {ix.ids[i]: {ix.ids[j]: w for j, w in ix.graph.get(i, {}).items() if j in rows} for i in sorted(rows)}
    return nodes, graph
