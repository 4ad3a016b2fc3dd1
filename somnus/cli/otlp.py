"""``somnus otlp``: the OTLP/HTTP receiver in the foreground (``somnus/otlp/command.py``)."""

from __future__ import annotations

from somnus.cli.app import app
from somnus.otlp.command import otlp_command

app.command("otlp")(otlp_command)
