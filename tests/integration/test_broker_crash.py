"""The broker itself crashes (SIGKILL) in the middle of a run and is started again: the worker and the
projector carry on by themselves, and the projections are exactly the no-crash result. Its own local
broker (the session's may be someone else's), with the real worker and projector."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
import uuid
from collections.abc import Iterator

import pytest

from somnus import broker
from somnus.config import Settings
from somnus.sample import generate
from tests.pipeline import Pipeline

pytestmark = pytest.mark.integration

CONTENT_TABLES = ("events", "episodes", "lessons", "working_memory")


@pytest.fixture()
def own_broker(tmp_path) -> Iterator[Settings]:
    settings = Settings.resolve(env={}, home=tmp_path / "broker-home")
    broker.start(settings)
    try:
        yield settings
    finally:
        broker.stop(settings)


def _settings(bootstrap: str, tmp_path, name: str) -> Settings:
    run = uuid.uuid4().hex[:10]
    return dataclasses.replace(
        Settings.resolve(env={}, home=tmp_path / name),
        bootstrap=bootstrap,
        db_path=tmp_path / f"{name}.duckdb",
        topic_prefix=f"t{run}.",
        app_id=f"somnus-test-{run}",
        partitions=4,
        session_timeout_s=6.0,
    )


def test_a_broker_killed_mid_run_and_started_again_loses_and_duplicates_nothing(own_broker, tmp_path):
    events = list(generate(sessions=3000, seed=5))
    bootstrap = broker.status(own_broker).bootstrap
    ref = Pipeline(_settings(bootstrap, tmp_path, "ref"))
    try:
        ref.start_all()
        ref.publish(events)
        ref.wait_idle()
        reference = ref.checksum()["tables"]
    finally:
        ref.stop_all()
    p = Pipeline(_settings(bootstrap, tmp_path, "crash"))
    try:
        p.start_all()
        p.publish(events)
        # the worker and the projector in the middle of it (a worker that cannot reach the broker while
        # it starts exits with the error: that is for whoever runs it to restart, not tested here)
        p.wait_until(lambda: p.status()["counts"].get("episodes", 0) > 0, what="a first episode projected")
        before = p.status()["counts"]["episodes"]
        os.kill(broker.status(own_broker).pid, signal.SIGKILL)
        time.sleep(8.0)  # both keep trying to reach it
        assert broker.start(own_broker).bootstrap == bootstrap
        p.wait_idle(timeout_s=240)
        for name, proc in p.procs.items():
            assert proc.poll() is None, f"{name} exited with {proc.returncode}"  # no supervisor restarted them
        crashed = p.checksum()["tables"]
        p.stop_all()
        assert before < 3000, before  # the crash fell in the middle of the run
        for table in CONTENT_TABLES:
            assert crashed[table] == reference[table], table
        assert p.query("SELECT count(DISTINCT episode_id), count(*) FROM episodes")[0] == (3000, 3000)
        assert p.query("SELECT count(*) FROM events")[0][0] == len(events)
    finally:
        p.stop_all()
