"""somnus.plots: the sleep history figure the CLI saves (``somnus sleep --report --plot out.png``)."""

from __future__ import annotations

import pytest

from tests.processors.sleep.memories import DAY, NOW, mem, run


def test_history_figure_draws_counts_and_fiedler() -> None:
    pytest.importorskip("matplotlib", reason="matplotlib not installed yet (the lead adds it)")
    from somnus.plots import history_figure

    plan = run([mem("m")])
    fig = history_figure([(NOW, plan.report), (NOW + DAY, plan.report)])
    top, bottom = fig.axes
    assert len(top.lines) == 4 and len(bottom.lines) == 1


def test_processors_import_no_plotting_library() -> None:
    import subprocess
    import sys

    code = ("import sys, somnus.processors.sleep.plan, somnus.processors.sleep.report; "
            "print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
