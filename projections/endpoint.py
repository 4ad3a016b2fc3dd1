"""Where a running projector says it serves: ``<db>.projector.json`` (pid, ports, the token's file).

Written by the projector once it serves, removed when it stops; read by ``somnus.reads``.
"""

from __future__ import annotations

from pathlib import Path


def endpoint_file(db_path: Path) -> Path:
    return Path(f"{db_path}.projector.json")
