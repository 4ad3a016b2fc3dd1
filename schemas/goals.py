"""Goals: a desired future state an agent (or a person for it) sets, and its closing (memory topic).

The cortex-engine ``goal_set`` tool, without a model: a goal is a line of text. The projector folds
both records in the memory topic's order (``projections/goals.py``) and measures each open goal's
*forward prediction error*, ``1 - nearest belief score``: how far the agent's memories are from it
(``somnus.processors.episodic.goals``). A goal is closed by ``GoalClosed`` (done or dropped).

>>> from datetime import datetime, timezone
>>> from somnus.schemas.codec import encode
>>> g = GoalSet(goal_id="g1", agent="scraper", text="scrape pricing without 429s",
...             at=datetime(2024, 5, 1, tzinfo=timezone.utc))
>>> msgspec.json.decode(encode(g), type=GoalSet) == g
True
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Annotated

import msgspec
from msgspec import Meta

KIND_GOAL_SET = b"goal-set"  # header somnus-kind on the memory topic: a GoalSet
KIND_GOAL_CLOSED = b"goal-closed"  # header somnus-kind on the memory topic: a GoalClosed

MAX_GOAL_TEXT = 500  # characters: a goal is a sentence, not a document


class GoalStatus(str, Enum):
    OPEN = "open"
    DONE = "done"  # achieved
    DROPPED = "dropped"  # abandoned


class GoalSet(msgspec.Struct, frozen=True, kw_only=True):
    goal_id: Annotated[str, Meta(min_length=1, max_length=200)]
    agent: Annotated[str, Meta(min_length=1)]
    text: Annotated[str, Meta(min_length=1, max_length=MAX_GOAL_TEXT)]
    at: datetime  # event time the goal is set at
    user_id: str | None = None  # the user it is set for (their memories then count towards it)
    set_by: str = ""  # who set it: an agent, a person, "somnus goal"


class GoalClosed(msgspec.Struct, frozen=True, kw_only=True):
    goal_id: Annotated[str, Meta(min_length=1, max_length=200)]
    agent: Annotated[str, Meta(min_length=1)]
    at: datetime
    status: GoalStatus = GoalStatus.DONE
