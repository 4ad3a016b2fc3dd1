"""A worker app that never connects: its consumer and consumer thread are made, not started."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from somnus.streams.kafka_compat.consumer import SomnusApp


@pytest.fixture
def app(tmp_path: Path) -> Iterator[SomnusApp]:
    yield SomnusApp(
        "kafka-compat-test", broker="kafka://127.0.0.1:1", store="memory://", datadir=str(tmp_path), web_enabled=False
    )
