"""Input: ``publish``, ``import``, ``sample`` and ``ingest-knowledge``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import typer

from somnus.cli.app import app
from somnus.cli.common import AT_HELP, FORMATS_HELP, BootOpt, DbOpt, HomeOpt, bootstrap, event_time, fail, settings

IMPORT_CHUNK = 20_000  # events per acknowledged send of `somnus import`


@app.command()
def publish(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="JSON lines of v1 trace events."),
    home: Optional[Path] = HomeOpt,
    bootstrap_: Optional[str] = BootOpt,
) -> None:
    """Publish trace events (one JSON object a line) to the traces topic, keyed by session_id."""
    from somnus.client import publish as publish_lines
    from somnus.streams.topics import ensure_topics

    s = settings(home, None, bootstrap_)
    boot = bootstrap(s)
    ensure_topics(s, boot)
    with file.open("rb") as f:
        n = publish_lines((line.rstrip(b"\n") for line in f if line.strip()), boot, s.traces_topic)
    print(f"published {n} events to {s.traces_topic}")


@app.command("import")
def import_(
    paths: list[str] = typer.Argument(..., help="Files, directories or globs (quoted: 'runs/**/*.traj')."),
    fmt: str = typer.Option(..., "--format", help=FORMATS_HELP),
    agent: Optional[str] = typer.Option(None, "--agent", help="Agent name for the imported sessions."),
    results: Optional[Path] = typer.Option(
        None,
        "--results",
        exists=True,
        dir_okay=False,
        help="Outcomes by id: a SWE-bench results.json (resolved/unresolved ids) or a JSON map id -> outcome.",
    ),
    start: Optional[str] = typer.Option(
        None, "--start", help="ISO time of the first session that carries no time (default 2024-05-15T20:00:00Z)."
    ),
    spacing: float = typer.Option(
        600.0, "--spacing", help="Seconds between the starts of such sessions, in file order."
    ),
    out: Optional[Path] = typer.Option(None, "--out", help="Write v1 events here (JSON lines) instead of publishing."),
    home: Optional[Path] = HomeOpt,
    bootstrap_: Optional[str] = BootOpt,
) -> None:
    """Turn transcripts of other tools into v1 trace events and publish them with one producer (or write
    them with --out). Many files, directories and globs in one call, with a progress bar. What is not
    of the format is reported and left out, and the rest imported: a file (the others are imported),
    an item of a file (a transcript, a trajectory, a conversation: the file's other items are
    imported), a line of a JSON Lines file, a span of an OTLP file. Exit 1 if anything was left out. A file of the format that holds no trajectory (a ToolBench answer file with
    valid_data false) is named as skipped and does not change the exit status."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from somnus.importers import FORMATS, ImportShapeError, expand_paths, import_run

    if fmt not in FORMATS:
        fail(f"unknown --format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    try:
        files = expand_paths(paths, fmt)
        run = import_run(start=start, spacing_s=spacing, results=results)
    except ImportShapeError as exc:
        fail(str(exc))
    s = settings(home, None, bootstrap_)
    if out is not None:
        sink: Any = out.open("wb")
    else:
        from somnus.client import Publisher
        from somnus.streams.topics import ensure_topics

        boot = bootstrap(s)
        ensure_topics(s, boot)
        sink = Publisher(boot, s.traces_topic)
    sessions: set[str] = set()
    pending: list[tuple[str, bytes]] = []  # (session id, encoded event)
    n = 0
    try:
        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        ) as bar:
            task = bar.add_task(f"importing {fmt}", total=len(files))
            for path in files:
                got: list[dict[str, Any]] = []
                try:  # a bad file stops only itself (a bad item or line was left out and named in run.problems)
                    got.extend(FORMATS[fmt](path, agent=agent, run=run))
                except (ImportShapeError, OSError) as exc:
                    run.problems.append(f"{exc}: the rest of the file is left out")
                except Exception as exc:  # noqa: BLE001 - the boundary: an unforeseen shape is named, not a traceback
                    run.problems.append(
                        f"{path}: could not be read as {fmt} ({type(exc).__name__}: {exc}): the rest of the file is left out"
                    )
                pending += _within(got, s.max_event_bytes, path, run.problems)
                if len(pending) >= IMPORT_CHUNK:  # one acknowledged send per chunk, not per file
                    n += _deliver(sink, pending, sessions)
                bar.advance(task)
            n += _deliver(sink, pending, sessions)
    finally:
        sink.close()
    where = f"wrote {n} events to {out}" if out is not None else f"published {n} events to {s.traces_topic}"
    skipped = f" ({len(run.skipped)} skipped: no trajectory)" if run.skipped else ""
    print(f"imported {len(sessions)} sessions from {len(files)} files{skipped}: {where}")
    for note in run.skipped:
        print(f"skipped: {note}", file=sys.stderr)
    for problem in run.problems:
        print(f"error: {problem}", file=sys.stderr)
    if run.problems:
        raise typer.Exit(1)


def _within(events: list[dict[str, Any]], max_bytes: int, path: Path, problems: list[str]) -> list[tuple[str, bytes]]:
    """``(session id, encoded event)`` of the events of at most ``max_bytes`` encoded
    (``SOMNUS_MAX_EVENT_BYTES``: the worker dead-letters a larger one, and one over the producer's 8 MiB
    stopped the whole import); each larger one is named in ``problems`` and left out."""
    import orjson

    kept = []
    for e in events:
        raw = orjson.dumps(e)
        if len(raw) > max_bytes:
            problems.append(
                f"{path}: session {e.get('session_id')!r} event {e.get('seq')} ({e.get('type')}) is "
                f"{len(raw)} bytes, over the pipeline's limit of {max_bytes} (SOMNUS_MAX_EVENT_BYTES): "
                "left out"
            )
        else:
            kept.append((str(e.get("session_id")), raw))
    return kept


def _deliver(sink: Any, events: list[tuple[str, bytes]], sessions: set[str]) -> int:
    """Write encoded events to a file (JSON lines) or send them with the open publisher, note their
    sessions, and empty the list; how many were delivered."""
    sessions.update(sid for sid, _ in events)
    if hasattr(sink, "send"):
        n = sink.send([raw for _, raw in events]) if events else 0
    else:
        sink.write(b"".join(raw + b"\n" for _, raw in events))
        n = len(events)
    events.clear()
    return n


@app.command()
def sample(
    out: Path = typer.Argument(..., dir_okay=False, help="Where to write the JSON lines."),
    sessions: int = typer.Option(200, "--sessions"),
    seed: int = typer.Option(42, "--seed"),
) -> None:
    """Write seeded synthetic traces of the built-in fleet (several agents and teams)."""
    import orjson

    from somnus.sample import generate

    n = 0
    with out.open("wb") as f:
        for ev in generate(sessions=sessions, seed=seed):
            f.write(orjson.dumps(ev) + b"\n")
            n += 1
    print(f"wrote {n} events of {sessions} sessions to {out}")


@app.command("ingest-knowledge")
def ingest_knowledge(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="JSON or Markdown."),
    owner: str = typer.Option("global", "--owner", help="global, team:<lead> or agent:<name>"),
    at: Optional[str] = typer.Option(None, "--at", help=AT_HELP),
    db: Optional[Path] = DbOpt,
    home: Optional[Path] = HomeOpt,
    bootstrap_: Optional[str] = BootOpt,
) -> None:
    """Add concepts from a document to semantic memory (DIRECT_INGESTION; deduplicated by name), stamped
    with the owner's stream time unless --at is given."""
    from somnus import memory_requests
    from somnus.processors.semantic.concepts import KnowledgeFileError, parse_knowledge

    fmt = "json" if file.suffix.lower() in (".json", ".jsonl") else "markdown"
    try:
        concepts = parse_knowledge(file.read_text(encoding="utf-8"), fmt)
    except KnowledgeFileError as exc:
        fail(f"{file}: {exc}")
    s = settings(home, db, bootstrap_)
    req = memory_requests.ingest_knowledge(s, bootstrap(s), owner, file.name, concepts, event_time(s, at, owner))
    print(f"published {len(concepts)} concepts from {file.name} for {owner} at {req.at.isoformat()}")
