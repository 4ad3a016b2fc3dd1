"""The worker's entry point: logging set up as asked, not at DEBUG behind our back."""

from __future__ import annotations

import logging

import pytest

from somnus.config import Settings
from somnus.streams.app import create_app
from somnus.streams.worker import make_worker


@pytest.fixture
def restore_root_logger():
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


def test_worker_logging_at_warning_drops_debug_calls(tmp_path, restore_root_logger):
    # Faust's terminal spinner set the root logger to DEBUG (it spins once a record), so each
    # log.debug of aiokafka's producer built and handled a record for every message sent.
    app = create_app(Settings.resolve(home=tmp_path), "127.0.0.1:1", worker_name="w")
    worker = make_worker(app, "warning")
    worker._setup_logging()
    assert not logging.getLogger("aiokafka.producer.producer").isEnabledFor(logging.DEBUG)
    assert logging.getLogger("aiokafka").isEnabledFor(logging.WARNING)


def test_worker_main_tunes_the_garbage_collector(monkeypatch, tmp_path):
    # With CPython's default thresholds the worker spent ~15% of its CPU in collections over its
    # long-lived heap (3.38 s of ~22.7 s in a 300k-event bench); main sets the project's thresholds.
    import gc
    import sys

    import somnus.streams.worker as worker_mod
    from somnus.procs import GC_THRESHOLD

    ran = []

    class FakeWorker:
        def execute_from_commandline(self):
            ran.append(gc.get_threshold())

    before = gc.get_threshold()
    monkeypatch.setenv("SOMNUS_HOME", str(tmp_path))
    monkeypatch.setenv("SOMNUS_WORKER_METRICS_PORT", "off")  # no metrics endpoint for the fake app
    monkeypatch.setattr(worker_mod, "bootstrap_for", lambda settings, start_if_missing: "127.0.0.1:1")
    monkeypatch.setattr(worker_mod, "await_broker", lambda bootstrap, timeout_s, log: None)
    monkeypatch.setattr(worker_mod, "ensure_topics", lambda settings, bootstrap: None)
    monkeypatch.setattr(worker_mod, "create_app", lambda settings, bootstrap, worker_name: object())
    monkeypatch.setattr(worker_mod, "make_worker", lambda app, loglevel: FakeWorker())
    monkeypatch.setattr(sys, "argv", ["somnus-worker"])
    gc.set_threshold(700, 10, 10)
    try:
        worker_mod.main([])
    finally:
        gc.set_threshold(*before)
    assert ran == [GC_THRESHOLD]


def test_worker_main_refuses_a_metrics_port_that_is_not_one(monkeypatch, tmp_path):
    import pytest

    import somnus.streams.worker as worker_mod

    monkeypatch.setenv("SOMNUS_HOME", str(tmp_path))
    monkeypatch.setenv("SOMNUS_WORKER_METRICS_PORT", "nine")
    monkeypatch.setattr(worker_mod, "bootstrap_for", lambda settings, start_if_missing: "127.0.0.1:1")
    monkeypatch.setattr(worker_mod, "await_broker", lambda bootstrap, timeout_s, log: None)
    monkeypatch.setattr(worker_mod, "ensure_topics", lambda settings, bootstrap: None)
    monkeypatch.setattr(worker_mod, "create_app", lambda settings, bootstrap, worker_name: object())
    with pytest.raises(SystemExit, match="SOMNUS_WORKER_METRICS_PORT: a port .* not 'nine'"):
        worker_mod.main([])
