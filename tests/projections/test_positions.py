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


def test_the_projectors_positions_keep_their_clients_and_reopen_them_once_after_an_error(monkeypatch) -> None:
    """One pair of clients serves every status; a call that fails on them (a broker restarted) closes
    them and asks again with new ones; a second failure is the call's error, and the next call opens anew."""
    opened: list[int] = []
    closed: list[int] = []
    failing: set[int] = set()

    async def open_(settings, bootstrap):
        opened.append(len(opened) + 1)
        return opened[-1], "admin"

    async def ask(settings, consumer, admin):
        if consumer in failing:
            raise ConnectionError(f"clients {consumer}: connection lost")
        return {"t": {0: consumer}}, {}

    async def close(consumer, admin):
        closed.append(consumer)

    monkeypatch.setattr(positions, "_open", open_)
    monkeypatch.setattr(positions, "_ask", ask)
    monkeypatch.setattr(positions, "_close", close)
    kp = positions.KafkaPositions(None, "b")  # type: ignore[arg-type]

    async def scenario() -> list[object]:
        got: list[object] = [await kp(), await kp()]  # the same clients twice
        failing.add(1)
        got.append(await kp())  # clients 1 fail: closed, clients 2 answer
        failing.update({2, 3})
        with pytest.raises(ConnectionError, match="clients 3"):
            await kp()  # 2 fails, 3 fails: the error, and 3 closed too
        failing.clear()
        got.append(await kp())
        await kp.close()
        return got

    got = asyncio.run(scenario())
    assert [g[0]["t"][0] for g in got] == [1, 1, 2, 4]  # type: ignore[index]
    assert opened == [1, 2, 3, 4] and closed == [1, 2, 3, 4]
