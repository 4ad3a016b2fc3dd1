"""Counters of one worker process (logged; the projections hold the durable counts)."""

from dataclasses import dataclass


@dataclass
class WorkerCounters:
    events: int = 0
    episodes: int = 0
    dead_letters: int = 0
    duplicates: int = 0
    late: int = 0  # events of a session that had ended, or too old to tell (dead letters)
    forgotten: int = 0  # closed sessions whose marker expired (somnus.processors.sessions.session_retention)
    abandoned: int = 0  # open sessions closed after the idle time (somnus.processors.sessions.session_retention)
    future: int = 0  # events stamped ahead of their record by more than the clock skew allowed (dead letters)
    shredded: int = 0  # sealed records whose data key a forget deleted: skipped (somnus.schemas.sealed)
    poison: int = 0  # records whose distillation raised (dead letters, kind poison)
    facts: int = 0
    observations: int = 0
    link_updates: int = 0
    memory_units: int = 0
