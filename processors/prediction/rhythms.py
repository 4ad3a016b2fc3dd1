"""The SCN: a temporal index of what happens when, per agent and per kind of event.

Every mark (an agent, a kind of event, its event time, and whether it succeeded) is counted in five
kinds of bins of its **local** time:

==================  =====  ====================================================================
bin kind            bins   bin of a local time
==================  =====  ====================================================================
``hour``            24     the hour, 0-23
``weekday``         7      Monday 0 ... Sunday 6
``week_of_month``   4      (day - 1) // 7, days 29-31 in the last bin (3)
``month``           12     January 0 ... December 11
``weekhour``        168    weekday * 24 + hour: "Monday 9 AM" is its own bin, so questions about an
                           hour *on given days* are answered exactly, not from two marginals
==================  =====  ====================================================================

Local time is the event's own UTC offset (what the runtime wrote in ``ts``) unless an IANA zone is
given (``tz="Europe/Berlin"``): then the instant is converted with ``zoneinfo``, DST included, so
9 AM is 9 AM on the wall clock in winter and in summer. A naive datetime is refused.

The index is a map (agent, kind, bin kind, bin) -> (count, successes, failures). Adding marks only
adds to counts, so updates commute: any order and any split into batches give the same index, and a
replay is trivially equal. It is not idempotent: feed each mark once (the projector does, in the
transaction that records its offsets; see ``TemporalIndex``).

Kinds of marks (``marks_of_episode``, the recommended source, and ``marks_of_event`` for raw traces):

- ``session_start`` (episode start), ``session_end`` (its end; success = outcome is success) and
  ``session_end:<outcome>`` (no success judgement: the kind is the outcome);
- ``tool_call`` and ``tool_call:<tool>`` at the call's time, success = the call's result was ok
  (from an episode); from raw traces a call's result is not known yet, so there the judged kinds
  are ``tool_result`` / ``tool_result:<tool>``;
- from raw traces also ``user_message``, ``agent_message``, ``delegation(:<agent>)`` and
  ``delegation_result(:<agent>)`` (success = the delegation succeeded).

>>> from datetime import datetime, timezone
>>> b = bins_of(datetime(2024, 3, 11, 9, 30, tzinfo=timezone.utc), "America/New_York")
>>> (b.hour, b.weekday, b.week_of_month, b.month, b.weekhour)  # EDT began on March 10
(5, 0, 1, 2, 5)
>>> ix = TemporalIndex()
>>> ix.add([TemporalMark("support", "session_end", datetime(2024, 5, 13, 9, 5, tzinfo=timezone.utc), True),
...         TemporalMark("support", "session_end", datetime(2024, 5, 14, 9, 50, tzinfo=timezone.utc), False)])
>>> [(k.kind, k.count, k.success_rate) for k in ix.usual_at("support", hours=[9], weekdays=WEEKDAYS)]
[('session_end', 2, 0.5)]
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, tzinfo
from typing import NamedTuple
from zoneinfo import ZoneInfo

import msgspec

from somnus.schemas.causal import TemporalBinCounted
from somnus.schemas.episodes import EpisodeDistilled
from somnus.schemas.events import (
    Delegated,
    DelegationReturned,
    Outcome,
    SessionEnded,
    ToolCalled,
    ToolReturned,
    TraceEvent,
    type_name,
)

BIN_SIZES: dict[str, int] = {"hour": 24, "weekday": 7, "week_of_month": 4, "month": 12, "weekhour": 168}
BIN_KINDS = tuple(BIN_SIZES)
WEEKDAYS = (0, 1, 2, 3, 4)  # Monday to Friday
WEEKEND = (5, 6)
DAY_NAMES = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


class Bins(NamedTuple):
    hour: int
    weekday: int
    week_of_month: int
    month: int
    weekhour: int


@functools.lru_cache(maxsize=256)
def zone(name: str) -> ZoneInfo:
    """An IANA zone by name (cached: ``ZoneInfo`` construction is the slow part of binning)."""
    return ZoneInfo(name)


def local_time(ts: datetime, tz: str | tzinfo | None = None) -> datetime:
    """``ts`` on the wall clock that bins it: its own offset, or the zone ``tz`` (DST-aware)."""
    if ts.tzinfo is None or ts.utcoffset() is None:
        raise ValueError(f"a naive datetime cannot be binned (no UTC offset): {ts.isoformat()}")
    if tz is None:
        return ts
    return ts.astimezone(zone(tz) if isinstance(tz, str) else tz)


def bins_of(ts: datetime, tz: str | tzinfo | None = None) -> Bins:
    """The bins of one event time (see the module's table)."""
    t = local_time(ts, tz)
    wd = t.weekday()
    return Bins(t.hour, wd, min((t.day - 1) // 7, 3), t.month - 1, wd * 24 + t.hour)


def around(hour: int, width: int = 1) -> list[int]:
    """The hours ``hour - width`` .. ``hour + width`` on the clock face: ``around(0)`` is [23, 0, 1]."""
    return [(hour + d) % 24 for d in range(-width, width + 1)]


# ---- marks ------------------------------------------------------------------------------------


class TemporalMark(NamedTuple):
    """Something an agent did at an event time; ``success`` None when there is nothing to judge."""

    agent: str
    kind: str
    at: datetime
    success: bool | None = None


def marks_of_episode(ep: EpisodeDistilled) -> list[TemporalMark]:
    """The marks of one finished session: its start, its end, and every call with a known time.

    Calls of episodes distilled before ``CallSeen.at`` existed have no time and are left out
    (their session marks still count)."""
    won = ep.outcome is Outcome.SUCCESS
    out = [
        TemporalMark(ep.agent, "session_start", ep.started_at, None),
        TemporalMark(ep.agent, "session_end", ep.ended_at, won),
        TemporalMark(ep.agent, f"session_end:{ep.outcome.value}", ep.ended_at, None),
    ]
    for call in ep.calls:
        if call.at is None:
            continue
        out.append(TemporalMark(ep.agent, "tool_call", call.at, call.ok))
        out.append(TemporalMark(ep.agent, f"tool_call:{call.tool}", call.at, call.ok))
    return out


def marks_of_event(ev: TraceEvent) -> list[TemporalMark]:
    """The marks of one raw trace event: its type, and a finer kind naming the tool, agent or outcome."""
    kind = type_name(ev)
    if isinstance(ev, ToolCalled):
        return [TemporalMark(ev.agent, kind, ev.ts), TemporalMark(ev.agent, f"{kind}:{ev.payload.tool}", ev.ts)]
    if isinstance(ev, ToolReturned):
        result = ev.payload
        out = [TemporalMark(ev.agent, kind, ev.ts, result.ok)]
        if result.tool:
            out.append(TemporalMark(ev.agent, f"{kind}:{result.tool}", ev.ts, result.ok))
        return out
    if isinstance(ev, Delegated):
        return [TemporalMark(ev.agent, kind, ev.ts), TemporalMark(ev.agent, f"{kind}:{ev.payload.to_agent}", ev.ts)]
    if isinstance(ev, DelegationReturned):
        won = ev.payload.outcome is Outcome.SUCCESS
        return [
            TemporalMark(ev.agent, kind, ev.ts, won),
            TemporalMark(ev.agent, f"{kind}:{ev.payload.to_agent}", ev.ts, won),
        ]
    if isinstance(ev, SessionEnded):
        return [
            TemporalMark(ev.agent, kind, ev.ts, ev.payload.outcome is Outcome.SUCCESS),
            TemporalMark(ev.agent, f"{kind}:{ev.payload.outcome.value}", ev.ts),
        ]
    return [TemporalMark(ev.agent, kind, ev.ts)]


# ---- the index --------------------------------------------------------------------------------

Cell = tuple[str, str, str, int]  # (agent, kind, bin kind, bin)


class KindAtTime(msgspec.Struct, frozen=True):
    """How often one kind of event happened in the asked bins, and how often it went well."""

    kind: str
    count: int
    successes: int
    failures: int
    share: float  # of all marks of the agent in those bins

    @property
    def success_rate(self) -> float | None:
        judged = self.successes + self.failures
        return self.successes / judged if judged else None


class TemporalIndex:
    """Counts per (agent, kind, bin kind, bin): ``add`` marks, ``merge`` indexes, ``deltas`` to persist.

    ``add`` and ``merge`` commute. For the projector: count a batch's marks in a fresh index and
    upsert its ``deltas()`` (``count = count + delta``) in the transaction that stores the batch's
    offsets; that gives exactly-once counts. ``from_deltas`` rebuilds an index from stored rows.
    """

    __slots__ = ("cells",)

    def __init__(self) -> None:
        self.cells: dict[Cell, list[int]] = {}  # [count, successes, failures]

    def add(
        self,
        marks: Iterable[TemporalMark],
        tz: str | tzinfo | None = None,
        tz_by_agent: Mapping[str, str] | None = None,
    ) -> None:
        """Count marks in their local bins (``tz_by_agent`` overrides ``tz`` for the agents it names)."""
        cells = self.cells
        for agent, kind, at, success in marks:
            zone_ = tz_by_agent.get(agent, tz) if tz_by_agent else tz
            b = bins_of(at, zone_)
            s, f = (1, 0) if success is True else (0, 1) if success is False else (0, 0)
            for bin_kind, value in zip(BIN_KINDS, b):
                cell = cells.get((agent, kind, bin_kind, value))
                if cell is None:
                    cells[(agent, kind, bin_kind, value)] = [1, s, f]
                else:
                    cell[0] += 1
                    cell[1] += s
                    cell[2] += f

    def merge(self, other: TemporalIndex) -> TemporalIndex:
        """A new index holding both (neither input is changed)."""
        out = TemporalIndex()
        for src in (self, other):
            for key, (c, s, f) in src.cells.items():
                cell = out.cells.setdefault(key, [0, 0, 0])
                cell[0] += c
                cell[1] += s
                cell[2] += f
        return out

    def deltas(self) -> list[TemporalBinCounted]:
        """Every non-empty cell as a row, in key order (byte-identical for equal indexes)."""
        return [TemporalBinCounted(a, k, bk, b, c, s, f) for (a, k, bk, b), (c, s, f) in sorted(self.cells.items())]

    @classmethod
    def from_deltas(cls, rows: Iterable[TemporalBinCounted]) -> TemporalIndex:
        out = cls()
        for r in rows:
            cell = out.cells.setdefault((r.agent, r.kind, r.bin_kind, r.bin), [0, 0, 0])
            cell[0] += r.count
            cell[1] += r.successes
            cell[2] += r.failures
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TemporalIndex) and self.cells == other.cells

    def __len__(self) -> int:
        return len(self.cells)

    # ---- queries ----

    def usual_at(
        self,
        agent: str,
        hours: Sequence[int],
        weekdays: Sequence[int] | None = None,
        top: int = 5,
        prefix: str | None = None,
    ) -> list[KindAtTime]:
        """What usually happens at these local hours (on these weekdays): top kinds by count.

        ``usual_at("support", around(9), WEEKDAYS)`` is "what usually happens around 9 AM on
        weekdays". With ``weekdays`` the exact ``weekhour`` bins are summed, else the ``hour`` bins.
        ``prefix`` keeps only kinds starting with it (``"tool_call:"``). Ties: by kind name."""
        if weekdays is None:
            wanted = [("hour", h % 24) for h in sorted(set(hours))]
        else:
            wanted = [("weekhour", d * 24 + h % 24) for d in sorted(set(weekdays)) for h in sorted(set(hours))]
        return self._top(agent, wanted, top, prefix)

    def usual_in(
        self, agent: str, bin_kind: str, bins: Sequence[int], top: int = 5, prefix: str | None = None
    ) -> list[KindAtTime]:
        """Top kinds in any bins of one kind: ``usual_in("a", "month", [11])`` is "what happens in December"."""
        if bin_kind not in BIN_SIZES:
            raise ValueError(f"unknown bin kind {bin_kind!r}; one of {', '.join(BIN_KINDS)}")
        return self._top(agent, [(bin_kind, b) for b in sorted(set(bins))], top, prefix)

    def _top(self, agent: str, wanted: list[tuple[str, int]], top: int, prefix: str | None) -> list[KindAtTime]:
        wanted_set = set(wanted)
        sums: dict[str, list[int]] = {}
        for (a, kind, bk, b), (c, s, f) in self.cells.items():
            if a == agent and (bk, b) in wanted_set:
                acc = sums.setdefault(kind, [0, 0, 0])
                acc[0] += c
                acc[1] += s
                acc[2] += f
        shown = {k: v for k, v in sums.items() if prefix is None or k.startswith(prefix)}
        total = sum(v[0] for v in shown.values())
        ranked = sorted(shown.items(), key=lambda kv: (-kv[1][0], kv[0]))[:top]
        return [KindAtTime(k, c, s, f, c / total if total else 0.0) for k, (c, s, f) in ranked]

    def profile(self, agent: str, kind: str, bin_kind: str) -> list[tuple[int, int, float | None]]:
        """(bin, count, success rate) for every bin of one kind, empty bins included."""
        if bin_kind not in BIN_SIZES:
            raise ValueError(f"unknown bin kind {bin_kind!r}; one of {', '.join(BIN_KINDS)}")
        out = []
        for b in range(BIN_SIZES[bin_kind]):
            c, s, f = self.cells.get((agent, kind, bin_kind, b), (0, 0, 0))
            out.append((b, c, s / (s + f) if s + f else None))
        return out


def index_of(marks: Iterable[TemporalMark], tz: str | tzinfo | None = None) -> TemporalIndex:
    """A fresh index of some marks (e.g. one batch's, whose ``deltas()`` the projector adds)."""
    ix = TemporalIndex()
    ix.add(marks, tz)
    return ix
