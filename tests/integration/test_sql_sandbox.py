"""The SQL sandbox in the real pipeline: a query over its time limit is interrupted while the projector
keeps projecting episodes and answering its other reads, and a SIGTERM stops it mid-query."""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from pathlib import Path

import pytest

from somnus.reads import ReadError, read, sql, summary
from somnus.sample import generate
from tests.pipeline import Pipeline

pytestmark = pytest.mark.integration

LONG = "SELECT sum(hash(i)) FROM range(1000000000000) t(i)"  # hours of work: only the time limit ends it
LIMIT_S = 6.0  # SOMNUS_SQL_TIMEOUT_S of the projector under test


def _episodes(db: Path) -> int:
    return summary(db)["counts"]["episodes"]


def test_a_query_over_its_time_is_interrupted_while_episodes_keep_being_projected(pipeline_settings):
    settings = dataclasses.replace(pipeline_settings, sql_timeout_s=LIMIT_S)
    db = Path(settings.db_path)  # type: ignore[arg-type]
    events = list(generate(sessions=240, seed=5))
    sessions = len({e["session_id"] for e in events})
    first, second = events[: len(events) // 3], events[len(events) // 3 :]
    p = Pipeline(settings)
    try:
        p.start_all()
        p.publish(first)
        p.wait_idle()
        before = _episodes(db)
        assert 0 < before < sessions

        # Analysts' long queries, one after another, while the rest of the trace arrives.
        stop = threading.Event()
        calls: list[tuple[float, float, BaseException | None]] = []

        def analyst() -> None:
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    sql(db, LONG)
                    failure: BaseException | None = None
                except BaseException as exc:  # noqa: BLE001 (the test looks at it)
                    failure = exc
                calls.append((t0, time.monotonic(), failure))

        thread = threading.Thread(target=analyst, daemon=True)
        thread.start()
        time.sleep(1.0)  # the first query is running
        published_at = time.monotonic()
        p.publish(second)
        latencies = []
        while _episodes(db) < sessions:  # each /summary answered while a query runs
            t = time.monotonic()
            summary(db)
            latencies.append(time.monotonic() - t)
            assert time.monotonic() - published_at < 240, f"episodes stalled at {_episodes(db)} of {sessions}"
            time.sleep(0.2)
        projected_at = time.monotonic()
        stop.set()
        thread.join(LIMIT_S * 3)
        assert not thread.is_alive()

        # Every long query ended at its limit, with an error that names it.
        assert calls, "no query ran"
        for t0, t1, failure in calls:
            assert isinstance(failure, ReadError) and "SOMNUS_SQL_TIMEOUT_S" in str(failure), failure
            assert LIMIT_S - 0.5 <= t1 - t0 <= LIMIT_S + 10, t1 - t0
        # ... and queries were running the whole time the second part was projected.
        assert calls[0][0] < published_at and calls[-1][1] > projected_at
        assert latencies and max(latencies) < LIMIT_S / 2, latencies  # not queued behind a query
        assert _episodes(db) == sessions
        # Another read of the projections is fine, and the sandbox refuses writes on the real file.
        assert sql(db, "SELECT count(*) AS n FROM episodes")["rows"] == [[sessions]]
        with pytest.raises(ReadError, match="DELETE"):
            read(db, "sql", sql="EXPLAIN ANALYZE DELETE FROM episodes")
        assert _episodes(db) == sessions

        # SIGTERM while a query runs: the projector stops within the query's limit, cleanly.
        thread = threading.Thread(target=lambda: calls.append((0.0, 0.0, _quietly(db))), daemon=True)
        thread.start()
        time.sleep(1.0)
        projector = p.procs.pop("projector")
        t0 = time.monotonic()
        projector.send_signal(signal.SIGTERM)
        assert projector.wait(timeout=LIMIT_S + 20) == 0
        assert time.monotonic() - t0 < LIMIT_S + 20
        thread.join(30)
    finally:
        p.stop_all()


def _quietly(db: Path) -> BaseException | None:
    try:
        sql(db, LONG)
    except BaseException as exc:  # noqa: BLE001 (the server went away under it)
        return exc
    return None
