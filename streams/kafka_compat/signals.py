"""mode's worker: its SIGUSR1 and SIGUSR2 handlers replaced by Somnus's diagnostics dumps.

mode's ``Worker`` installs its own handlers when it starts (a stack dump on SIGUSR1, pdb on SIGUSR2,
useless without a terminal), possibly after the app installed Somnus's
(``somnus.streams.liveness.install_diagnostics``): pointing the worker's handlers at the same dumps
means that whichever is installed last, the dumps run. Relies on ``mode.Worker._on_sigusr1`` and
``_on_sigusr2`` (``tests/streams/kafka_compat/test_signals.py``). No upstream issue (mode's
behaviour is by design); it can go if mode lets an app choose those handlers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def route_debug_signals(worker: Any, on_usr1: Callable[[], None], on_usr2: Callable[[], None]) -> None:
    """Make ``worker`` (a mode ``Worker``) call ``on_usr1`` on SIGUSR1 and ``on_usr2`` on SIGUSR2."""
    worker._on_sigusr1, worker._on_sigusr2 = on_usr1, on_usr2
