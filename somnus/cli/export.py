"""``export parquet DIR``: the projections as hive-partitioned Parquet, with a manifest of the source
offsets (``projections/export.py``; docs/integrations/parquet.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from somnus.cli.app import app
from somnus.cli.common import CsvOpt, DbOpt, HomeOpt, JsonOpt, read, settings
from somnus.cli.tables import one_of, show

export_app = typer.Typer(help="Take data out of Somnus.", no_args_is_help=True)
app.add_typer(export_app, name="export")


@export_app.command("parquet")
def export_parquet(
    folder: Path = typer.Argument(..., help="A new (or empty) folder to write."),
    tables: Optional[list[str]] = typer.Option(
        None, "--tables", help="Only this table (repeatable; default: every projection)."
    ),
    since: Optional[str] = typer.Option(
        None, "--since", help="ISO 8601: only rows of this day or later, where a table has a time column."
    ),
    db: Optional[Path] = DbOpt,
    home: Optional[Path] = HomeOpt,
    as_json: bool = JsonOpt,
    as_csv: bool = CsvOpt,
) -> None:
    """Write every projection as Parquet (by table, agent and day) from one committed snapshot, while the
    stack runs; DIR/manifest.json records the source offsets of that snapshot."""
    one_of(as_json, as_csv)
    manifest = read(
        settings(home, db),
        "export_parquet",
        dir=str(folder.expanduser().resolve()),
        tables=list(tables) if tables else None,
        since=since,
    )
    if as_json:
        print(json.dumps(manifest))
        return
    if as_csv:  # every table, empty ones too
        show(
            ["table", "rows", "partitioned by", "day from"],
            [[t, v["rows"], "/".join(v["partition_by"]), v["day_from"]] for t, v in manifest["tables"].items()],
            as_csv=True,
        )
        return
    show(
        ["table", "rows", "partitioned by"],
        [[t, v["rows"], "/".join(v["partition_by"])] for t, v in manifest["tables"].items() if v["rows"]],
        f"exported to {folder} in {manifest['seconds']} s (empty tables left out of this list)",
    )
    print("offsets: " + ", ".join(f"{o['topic']}[{o['partition']}]={o['next_offset']}" for o in manifest["offsets"]))
    print(f"manifest: {folder / 'manifest.json'}")
