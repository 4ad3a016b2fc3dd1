"""Memory rows, edge lists and runs for the sleep tests (one builder, shared by the test modules)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import polars as pl

from somnus.processors.sleep.config import (
    SleepConfig,
)
from somnus.processors.sleep.plan import SleepInputs, SleepPlan, plan_sleep
from somnus.processors.sleep.scoring import memory_frame
from somnus.schemas.lifecycle import (
    SleepCompleted,
    SleepPhaseCompleted,
    SleepStarted,
)

NOW = datetime(2024, 6, 5, 3, 0, tzinfo=timezone.utc)  # a Wednesday, 03:00
DAY = timedelta(days=1)
STRUCTURAL = (SleepStarted, SleepPhaseCompleted, SleepCompleted)


def mem(
    mid: str,
    *,
    agent: str = "a",
    layer: str = "hippocampus",
    created: datetime | None = None,
    idle: float | None = 1.0,
    access: int = 0,
    importance: float = 0.5,
    outcome: str = "failure",
    user: bool = False,
    edges: int = 0,
    size: int = 2500,
    long_term: bool = False,
    compressed: bool = False,
    retention: float | None = None,
    keys: Sequence[str] = ("tool:x",),
    domain: str = "",
) -> dict[str, Any]:
    """One memory row; ``idle`` days since its last access (None: never accessed, idle since creation)."""
    created = created or NOW - timedelta(days=max(idle or 0.0, 0.0) + 1)
    return {
        "memory_id": mid,
        "agent": agent,
        "layer": layer,
        "created_at": created,
        "last_access": None if idle is None else NOW - timedelta(days=idle),
        "access_count": access,
        "importance": importance,
        "outcome": outcome,
        "is_user_interaction": user,
        "edge_count": edges,
        "size_bytes": size,
        "long_term": long_term,
        "compressed": compressed,
        "retention": retention,
        "index_keys": list(keys),
        "domain": domain,
    }


def frame(rows: Sequence[dict[str, Any]]) -> pl.DataFrame:
    return memory_frame(
        pl.DataFrame(
            list(rows),
            schema_overrides={
                "created_at": pl.Datetime("us", "UTC"),
                "last_access": pl.Datetime("us", "UTC"),
                "retention": pl.Float64,
                "index_keys": pl.List(pl.String),
            },
        )
    )


def edge_list(pairs: Sequence[tuple[str, str]]) -> pl.DataFrame:
    return pl.DataFrame(
        {"src": [a for a, _ in pairs], "dst": [b for _, b in pairs], "weight": [1.0] * len(pairs)},
        schema={"src": pl.String, "dst": pl.String, "weight": pl.Float64},
    )


def run(
    rows: Sequence[dict[str, Any]],
    pairs: Sequence[tuple[str, str]] = (),
    *,
    config: SleepConfig = SleepConfig(),
    **kw: Any,
) -> SleepPlan:
    plan = plan_sleep(
        SleepInputs(frame(rows), edge_list(pairs), **kw.pop("inputs", {})), now=kw.pop("now", NOW), config=config, **kw
    )
    assert plan is not None
    return plan


def of(plan: SleepPlan, kind: type) -> list[Any]:
    return [e for e in plan.events() if isinstance(e, kind)]


def ids(events: Sequence[Any]) -> list[str]:
    return [e.memory_id for e in events]
