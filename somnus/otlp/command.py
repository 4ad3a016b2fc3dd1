"""``somnus otlp``: run the OTLP/HTTP receiver in the foreground (``somnus up`` runs it supervised)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def otlp_command(
    host: Optional[str] = typer.Option(None, "--host", help="Address to bind (SOMNUS_OTLP_HOST, default 127.0.0.1)."),
    port: Optional[int] = typer.Option(None, "--port", help="Port (SOMNUS_OTLP_PORT, default 4318)."),
    home: Optional[Path] = typer.Option(None, "--home", help="State folder (SOMNUS_HOME)."),
    bootstrap: Optional[str] = typer.Option(None, "--bootstrap", help="Kafka bootstrap servers (KAFKA_BOOTSTRAP)."),
) -> None:
    """Serve OTLP/HTTP `POST /v1/traces` (protobuf and JSON): GenAI spans become trace events
    (docs/integrations/otlp.md). Exporters authenticate with a Somnus token:
    OTEL_EXPORTER_OTLP_HEADERS="Authorization=Bearer <token>"."""
    import logging

    from somnus import procs
    from somnus.config import Settings
    from somnus.otlp.receiver import run

    procs.private_files()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    run(Settings.resolve(home=home, bootstrap=bootstrap), host, port)
