"""Where a running projector can be found, and where the operator's token is: plain paths, no I/O
library, so the CLI's read path imports nothing heavy (``somnus.reads``).

>>> endpoint_file(Path("/tmp/x/somnus.duckdb")).name
'somnus.duckdb.projector.json'
>>> token_file(Path("/tmp/home")).name
'token'
"""

from __future__ import annotations

from pathlib import Path

TOKEN_FILE = "token"  # the operator's token, plain text, 0600: what the CLI sends


def endpoint_file(db_path: Path) -> Path:
    """The running projector's endpoint file for ``db_path``: its pid, ports and token file."""
    return Path(f"{db_path}.projector.json")


def token_file(home: Path) -> Path:
    """The operator's token file of ``home``."""
    return Path(home) / TOKEN_FILE
