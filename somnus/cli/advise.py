"""``somnus advise`` (the pre-flight read, docs/concepts/advise.md), ``bench advise`` and
``bench oscillators``: thin registrations of ``somnus/cli/advise_command.py`` and ``somnus/cli/rhythms_command.py``."""

from __future__ import annotations

from somnus.cli.advise_command import advise_command, bench_advise_command
from somnus.cli.app import app
from somnus.cli.bench import bench_app
from somnus.cli.rhythms_command import bench_oscillators_command

app.command("advise")(advise_command)
bench_app.command("advise")(bench_advise_command)
bench_app.command("oscillators")(bench_oscillators_command)
