"""Forget: an operator's request to remove everything derived from a user, an agent or a session.

Published by ``somnus forget`` on the one-partition ``facts`` topic with the header
``somnus-kind: forget`` (the projector reads that topic in one total order); the projector
(``projections/forget.py``) removes the subject's rows, records the subject in ``forgotten`` and
removes every later record of it, so a replay from offset 0 keeps it forgotten whichever topic
it reads first. ``at`` is the stream time of the subject's scope (``somnus forget`` stamps it).

>>> import msgspec
>>> from datetime import datetime, timezone
>>> r = ForgetRequested(request_id="f-1", subject=ForgetSubject.USER, value="u1", reason="erasure request",
...     at=datetime(2024, 5, 15, tzinfo=timezone.utc))
>>> msgspec.json.decode(msgspec.json.encode(r), type=ForgetRequested) == r
True
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Annotated

import msgspec
from msgspec import Meta

KIND_FORGET = b"forget"  # header somnus-kind on the facts topic: a ForgetRequested


class ForgetSubject(str, Enum):
    USER = "user"  # every session whose user is this id (episodes, memories, working memory ...)
    AGENT = "agent"  # every session of this agent, and its own rows (bins, rhythms, briefing)
    SESSION = "session"  # every session with this id (whatever its agent)


class ForgetRequested(msgspec.Struct, frozen=True, kw_only=True):
    request_id: Annotated[str, Meta(min_length=1, max_length=200)]  # a copy of a request is applied once
    subject: ForgetSubject
    value: Annotated[str, Meta(min_length=1, max_length=500)]  # the user id, agent name or session id
    at: datetime  # event time: the stream time of the subject's scope when it was requested
    reason: Annotated[str, Meta(max_length=2000)] | None = None
