"""The worker's entry point: logging set up as asked, not at DEBUG behind our back."""

from __future__ import annotations

import logging

import pytest

from somnus.config import Settings
from streams.app import create_app
from streams.worker import make_worker


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
