"""A Kafka record as the projector sees one, built in tests without a broker."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Rec:
    topic: str
    partition: int
    offset: int
    value: bytes | None
    key: bytes | None = None
    headers: list | None = None
    timestamp: int | None = None  # ms since the epoch, as Kafka stamps a record
