"""somnus.cli.app: typer's parameters coerced without pydantic, the same answers and errors; and
the read path to a running projector imports nothing heavy."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import somnus.cli  # noqa: F401  (applies the coercion)

cli_app = sys.modules["somnus.cli.app"]

HEAVY = ("pydantic", "duckdb", "polars", "numpy", "faust", "aiokafka", "aiohttp", "pyarrow", "rich", "asyncio")


def test_the_light_coercion_is_applied_while_typer_builds_pydantic_adapters() -> None:
    """Fails when typer no longer has the private names the patch relies on (see light_coercion)."""
    import importlib.util

    if importlib.util.find_spec("typer._adapters") is None:
        pytest.skip("this typer coerces without pydantic: nothing to replace")
    from typer import core

    assert cli_app.LIGHT_COERCION and getattr(core.build_runtime_param, "somnus_light", False)


def test_values_and_errors_are_as_typer_gives_them(tmp_path: Path) -> None:
    demo = typer.Typer(rich_markup_mode=None)
    got: dict = {}

    @demo.command()
    def run(
        path: Path = typer.Argument(..., exists=True, dir_okay=False),
        k: int = typer.Option(10, "-k"),
        rate: float = typer.Option(0.5, "--rate"),
        flag: bool = typer.Option(False, "--flag"),
        names: list[str] = typer.Option([], "--name"),
        paths: list[Path] = typer.Option([], "--also"),
        limit: int = typer.Option(3, "--limit", min=1, max=5),
    ) -> None:
        got.update(path=path, k=k, rate=rate, flag=flag, names=names, paths=paths, limit=limit)

    f = tmp_path / "f.txt"
    f.write_text("x")
    runner = CliRunner()
    ok = runner.invoke(
        demo,
        [str(f), "-k", "7", "--rate", "2", "--flag", "--name", "a", "--name", "b", "--also", "x/y", "--limit", "4"],
    )
    assert ok.exit_code == 0, ok.output
    assert got == {
        "path": f,
        "k": 7,
        "rate": 2.0,
        "flag": True,
        "names": ["a", "b"],
        "paths": [Path("x/y")],
        "limit": 4,
    }
    assert type(got["path"]) is type(f) and type(got["k"]) is int and type(got["rate"]) is float
    for args, says in [
        ([str(f), "-k", "x"], "'x' is not a valid int"),
        ([str(tmp_path / "no")], "does not exist"),
        ([str(tmp_path)], "is a directory"),
        ([str(f), "--limit", "9"], "--limit"),
    ]:
        bad = runner.invoke(demo, args)
        assert bad.exit_code == 2 and says in bad.output, (args, bad.output)


STUB_ANSWERS = {  # what a (stub) projector answers, by path
    "/agents/scraper/recall": {
        "hits": [
            {
                "rank": 1,
                "score": 0.5,
                "kind": "lesson",
                "occurred_at": "2024-05-17T05:10:00",
                "refs": ["e1"],
                "text": "retry after a rate limit",
            }
        ]
    },
    "/kafka-positions": {
        "ends": {"somnus.traces": {"0": 12}, "somnus.observations": {"0": 3}},
        "committed": {"somnus.traces": {"0": 10}, "somnus.observations": {"0": 3}},
    },
    "/summary": {
        "counts": {"episodes": 4, "dead_letters": 1},
        "offsets": {"somnus.traces": {"0": 9}},
        "dead_letter_kinds": {"schema": 1},
        "memories": None,
        "stale_briefings": 0,
    },
    "/memory": {
        "episodes": 4,
        "graph": {"entities": 2, "active_triples": 1, "triples": 1},
        "briefings": {"agents": 1, "non_empty": 1, "newest": None},
        "last_consolidation": None,
        "utilisation": [],
        "delegations": [],
    },
}


def _through_a_stub_projector(tmp_path: Path, argv: list[str]) -> tuple[str, list[str], list[str]]:
    """Run ``somnus <argv>`` in a fresh interpreter against a stub projector (``STUB_ANSWERS``): its
    stdout, the heavy modules it imported, and the paths it asked."""
    script = textwrap.dedent(f"""
        import json, os, sys, threading
        from http.server import BaseHTTPRequestHandler, HTTPServer
        answers, asked = {STUB_ANSWERS!r}, []

        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                path = self.path.split("?")[0]
                asked.append(path)
                body = json.dumps(answers[path]).encode()
                self.send_response(200); self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
            def log_message(self, *a): pass

        srv = HTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        home = {str(tmp_path)!r}
        open(os.path.join(home, "somnus.duckdb.projector.json"), "w").write(json.dumps(
            {{"pid": os.getpid(), "port": srv.server_address[1], "briefing_port": None, "token_file": "/none"}}))
        sys.argv = ["somnus", *{argv!r}, "--home", home, "--json"]
        from somnus.cli import main
        try:
            main()
        except SystemExit:
            pass
        print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))
        print(json.dumps(asked))
    """)
    # No KAFKA_BOOTSTRAP and no local broker: a command that wanted Kafka would fail here.
    run = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "SOMNUS_HOME": str(tmp_path)},
    )
    assert run.returncode == 0, run.stderr
    answer, heavy, asked = run.stdout.strip().splitlines()
    return answer, json.loads(heavy), json.loads(asked)


def test_a_read_through_the_projector_imports_nothing_heavy(tmp_path: Path) -> None:
    """somnus recall, answered over HTTP by a (stub) projector: typer and the standard library only."""
    answer, heavy, _ = _through_a_stub_projector(tmp_path, ["recall", "rate limit", "--agent", "scraper"])
    assert json.loads(answer)["hits"][0]["text"] == "retry after a rate limit"
    assert heavy == []


def test_status_through_the_projector_asks_no_kafka_and_imports_nothing_heavy(tmp_path: Path) -> None:
    """somnus status with a projector running: the lag from the projector's Kafka positions (no Kafka
    client of its own, no broker address needed), typer and the standard library only."""
    answer, heavy, asked = _through_a_stub_projector(tmp_path, ["status"])
    got = json.loads(answer)
    assert heavy == []
    assert sorted(asked) == ["/kafka-positions", "/memory", "/summary"]
    assert got["lag"]["somnus.traces"] == 3 and got["worker_lag"] == {"somnus.traces": 2, "somnus.observations": 0}
    assert got["counts"] == {"episodes": 4, "dead_letters": 1} and got["dead_letter_kinds"] == {"schema": 1}
    assert got["projector"] is True and got["idle"] is False and got["memory"]["episodes"] == 4
