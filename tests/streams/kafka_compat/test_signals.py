"""somnus.streams.kafka_compat.signals: mode's worker calls the handlers it was given."""

from __future__ import annotations

import inspect

from mode import Worker

from somnus.streams.kafka_compat.signals import route_debug_signals


def test_the_workers_debug_signals_run_the_diagnostics() -> None:
    # mode installs bound self._on_sigusr1 / self._on_sigusr2 when the worker starts
    source = inspect.getsource(Worker)
    assert "add_signal_handler(signal.SIGUSR1, self._on_sigusr1)" in source
    assert "add_signal_handler(signal.SIGUSR2, self._on_sigusr2)" in source
    worker = Worker(quiet=True, redirect_stdouts=False)
    calls: list[str] = []
    route_debug_signals(worker, lambda: calls.append("tasks"), lambda: calls.append("consumer"))
    worker._on_sigusr1()
    worker._on_sigusr2()
    assert calls == ["tasks", "consumer"]
