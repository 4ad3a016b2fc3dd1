"""The projector's read models held in memory beside their tables, and the keys already projected.

Loaded once from the database when the projector starts (``ReadModels(con, ...)``), then kept in step
by the topic sinks (``projections/sinks.py``): updated after their batch commits, reloaded from the
tables after it rolls back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import duckdb

from somnus.processors.sleep.config import SleepConfig
from somnus.projections.briefings import BriefingCache
from somnus.projections.causal import CausalProjection
from somnus.projections.forget import Forgetting
from somnus.projections.knowledge import KnowledgeProjection
from somnus.projections.knowledge_store import TopFacts
from somnus.projections.memory import MemoryProjection
from somnus.projections.semantic import SemanticProjection
from somnus.projections.sleep import SleepJob
from somnus.projections.utilisation import UtilisationFold
from somnus.schemas.sealed import KeyRing

DeadLetterKey = tuple[str, int, int, int, str]  # source topic, partition, offset, index in the record, kind


class ReadModels:
    """Every in-memory read model of the projector, and the keys where the same content may arrive twice.

    - ``episodes``: the episode ids projected (a re-emitted episode is skipped: first one wins);
    - ``dead_letters``: the dead letters' source coordinates and kinds (each is written once);
    - the folds: ``knowledge``, ``causal``, ``memory`` (with the sleep job), ``semantic``,
      ``utilisation``, ``forget``; the caches read by the API: ``top_facts``, ``briefings``;
    - ``keys``: the data keys that open sealed records (``somnus.schemas.sealed.KeyRing``).
    """

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        agents: Mapping[str, Any] | None = None,
        sleep_config: Any = None,
        oscillators: Any = None,
    ) -> None:
        self.agents = dict(agents or {})
        self.episodes: set[str] = {str(r[0]) for r in con.execute("SELECT episode_id FROM episodes").fetchall()}
        self.dead_letters: set[DeadLetterKey] = set(
            con.execute("SELECT src_topic, src_partition, src_offset, src_index, kind FROM dead_letters").fetchall()
        )
        self.knowledge = KnowledgeProjection(con)
        self.causal = CausalProjection(con)
        self.memory = MemoryProjection(
            con,
            SleepJob(con, {a: s.max_episodes for a, s in self.agents.items()}, sleep_config or SleepConfig()),
            oscillators,
            self.agents,
        )
        self.semantic = SemanticProjection(con)
        self.top_facts = TopFacts()
        self.top_facts.refresh(con)
        self.briefings = BriefingCache(con, self.agents, self.top_facts, self.semantic)
        self.utilisation = UtilisationFold(con)
        self.forget = Forgetting(con)  # forgotten subjects: purged, and kept out (projections/forget.py)
        self.keys = KeyRing()  # the data keys that open sealed records (the projector follows the key topic)
