"""Deep sleep's schedule: a cron on stream time, never the wall clock.

**When.** A cron schedule (default ``0 3 * * *``, ``SOMNUS_SLEEP_SCHEDULE``) evaluated on **stream
time**, never the wall clock: before the shell applies a memory-log record whose event time is
past a fire time ``f`` (``advance``), it runs sleep at ``now = f`` over the state folded from every
earlier record. The memory log has one partition, so live and replay see the same records before
the same trigger and reach the same decisions. Records that arrive late (event time before ``f``
but after the trigger) belong to the next window. On demand, a ``SleepRequested(at)`` runs at
``at``. The **watermark** (``SleepCompleted.watermark``, the last completed run's time) makes runs
idempotent: ``plan_sleep`` returns None for ``now <= watermark``.

Times inside a run are integers of microseconds since the epoch (``to_us`` / ``from_us``).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import msgspec

from somnus.processors.sleep.config import EPOCH, SCHEDULE_OFF, SleepConfig


def validate_schedule(schedule: str) -> str:
    """The expression, if cron can read it (or ``off``); ``ValueError`` naming the problem otherwise."""
    from cronsim import CronSim, CronSimError  # local: optional until the lead adds cronsim

    if schedule.strip().lower() == SCHEDULE_OFF:
        return SCHEDULE_OFF
    try:
        CronSim(schedule, EPOCH)
    except CronSimError as exc:
        raise ValueError(f"invalid sleep schedule {schedule!r}: {exc}") from None
    return schedule


def fire_times(
    schedule: str, after: datetime, before: datetime, *, tz: str = "UTC", limit: int | None = None
) -> tuple[list[datetime], int]:
    """Cron fire times ``f`` with ``after < f < before`` (UTC, ascending) and how many older ones were
    dropped by ``limit`` (only the last ``limit`` are kept: a catch-up after a long gap stays short).

    >>> from datetime import datetime, timezone
    >>> t = lambda d, h: datetime(2024, 5, d, h, tzinfo=timezone.utc)
    >>> [f.isoformat() for f in fire_times("0 3 * * *", t(1, 3), t(3, 4))[0]]
    ['2024-05-02T03:00:00+00:00', '2024-05-03T03:00:00+00:00']
    """
    from cronsim import CronSim  # local: optional until the lead adds cronsim

    require_aware(after, "after")
    require_aware(before, "before")
    zone = ZoneInfo(tz)
    out: list[datetime] = []
    dropped = 0
    # Walk backwards from ``before``: the newest fire times are the ones kept.
    for f in CronSim(schedule, before.astimezone(zone), reverse=True):
        if f <= after:
            break
        if f >= before:
            continue
        if limit is not None and len(out) >= limit:
            dropped += 1
            if dropped > 100_000:  # a huge gap of a frequent schedule: stop counting
                break
            continue
        out.append(f.astimezone(timezone.utc))
    out.reverse()
    return out, dropped


def next_fire(schedule: str, after: datetime, *, tz: str = "UTC") -> datetime | None:
    """The first fire time after ``after``, checked against ``fire_times`` itself: no event time up to
    it makes a run due (``advance`` then returns nothing). None for ``off``, or when unsure.

    >>> from datetime import datetime, timezone
    >>> next_fire("0 3 * * *", datetime(2024, 5, 1, 3, tzinfo=timezone.utc)).isoformat()
    '2024-05-02T03:00:00+00:00'
    """
    from cronsim import CronSim  # local: optional until the lead adds cronsim

    require_aware(after, "after")
    if schedule == SCHEDULE_OFF:
        return None
    for f in CronSim(schedule, after.astimezone(ZoneInfo(tz))):
        if f > after:
            nxt = f.astimezone(timezone.utc)
            return nxt if fire_times(schedule, after, nxt + timedelta(microseconds=1), tz=tz)[0] == [nxt] else None
    return None


class SleepClock(msgspec.Struct, frozen=True):
    """The schedule's position in stream time: the last fire time handled (None before any event)."""

    last_fired: datetime | None = None


def bounded_time(event_time: datetime, record_time: datetime | None, skew_s: float) -> datetime:
    """``event_time``, at most ``record_time + skew_s`` (no bound without a record time or a skew).

    >>> from datetime import datetime, timezone
    >>> t = datetime(2024, 5, 1, 10, tzinfo=timezone.utc)
    >>> bounded_time(t.replace(day=30), t, 300.0).isoformat(), bounded_time(t, t.replace(day=2), 300.0) == t
    ('2024-05-01T10:05:00+00:00', True)
    """
    if record_time is None or skew_s <= 0:
        return event_time
    return min(event_time, record_time + timedelta(seconds=skew_s))


def advance(
    clock: SleepClock, event_time: datetime, config: SleepConfig = SleepConfig()
) -> tuple[SleepClock, list[datetime], int]:
    """Call before applying a record with ``event_time``: the runs due first (ascending), the new
    clock, and how many fire times were skipped by ``max_catch_up``. The first record starts the
    clock (no runs for the time before the stream began).

    >>> from datetime import datetime, timezone
    >>> t = lambda d, h: datetime(2024, 5, d, h, tzinfo=timezone.utc)
    >>> c, due, _ = advance(SleepClock(), t(1, 10))
    >>> c, due, _ = advance(c, t(2, 2)); due
    []
    >>> c, due, _ = advance(c, t(2, 5)); [d.hour for d in due], c.last_fired.isoformat()
    ([3], '2024-05-02T03:00:00+00:00')
    """
    require_aware(event_time, "event_time")
    if clock.last_fired is None:
        return SleepClock(event_time.astimezone(timezone.utc)), [], 0
    if config.schedule == SCHEDULE_OFF:
        return clock, [], 0
    due, dropped = fire_times(
        config.schedule, clock.last_fired, event_time, tz=config.schedule_tz, limit=config.max_catch_up
    )
    if not due:
        return clock, [], dropped
    return SleepClock(due[-1]), due, dropped


def require_aware(ts: datetime, name: str) -> None:
    if ts.tzinfo is None or ts.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware (event time), got naive {ts!r}")


def to_us(ts: datetime) -> int:
    require_aware(ts, "time")
    delta = ts - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_us(us: int) -> datetime:
    return EPOCH + timedelta(microseconds=int(us))


def run_id_for(at: datetime) -> str:
    """One run per event time: ``sleep-20240515T030000Z`` (microseconds when there are any)."""
    at = at.astimezone(timezone.utc)
    return "sleep-" + (at.strftime("%Y%m%dT%H%M%S") + (f".{at.microsecond:06d}" if at.microsecond else "") + "Z")
