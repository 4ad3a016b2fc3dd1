"""projections.positions: Kafka positions for ``somnus status``, answered on the projector's loop."""

from __future__ import annotations

import asyncio
import json
import threading

import duckdb
import pytest

from somnus.projections import api, positions


def test_positions_asked_from_another_thread_run_on_the_loop_and_survive_json(monkeypatch) -> None:
    ran_on: list[object] = []

    async def fake(settings, bootstrap):
        ran_on.append(asyncio.get_running_loop())
        return {"t": {0: 5, 1: 7}}, {"t": {0: 4}}

    monkeypatch.setattr(positions, "kafka_positions", fake)
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever)
    t.start()
    try:
        ask = positions.on_loop(None, "b", loop)  # type: ignore[arg-type]
        got = json.loads(json.dumps(ask()))
    finally:
        loop.call_soon_threadsafe(loop.stop)
        t.join()
        loop.close()
    assert ran_on == [loop]
    assert positions.from_json(got) == ({"t": {0: 5, 1: 7}}, {"t": {0: 4}})


def test_a_file_opened_without_a_projector_does_not_answer_positions() -> None:
    service = api.ReadService(duckdb.connect(), {})
    with pytest.raises(api.NotFound, match="running projector"):
        service.kafka_positions()
    service.extra["kafka_positions"] = lambda: {"ends": {}, "committed": {}}
    assert service.kafka_positions() == {"ends": {}, "committed": {}}
