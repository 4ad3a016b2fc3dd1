"""One clock, event time (issue 26, section 3): a person's commands on historical data are stamped
with the data's stream time, so they change nothing a live run would not have.

tau-bench airline is imported in two halves (`somnus import --format openai-chat`, the second with
`--start` where the first ended); between them a person promotes a fact and asks for a deep sleep,
after them promotes another. Against the same import without those commands: the same scheduled
sleeps run (none skipped behind a sleep dated today), and the briefing's lessons have the same ages
(none re-dated by a promotion stamped with the wall clock)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from somnus.reads import read
from tests.pipeline import Pipeline

pytestmark = pytest.mark.integration

START = datetime(2024, 5, 15, 20, tzinfo=timezone.utc)  # the importer's default; sessions 10 minutes apart
HALF = 100


def _halves(tau_bench_path: Path, tmp_path: Path) -> list[tuple[Path, datetime]]:
    items = json.loads(tau_bench_path.read_bytes())
    out = []
    for k, part in enumerate((items[:HALF], items[HALF:])):
        path = tmp_path / f"gpt-4o-airline-{k}.json"  # the session ids carry the file's stem: distinct per half
        path.write_text(json.dumps(part))
        out.append((path, START + timedelta(minutes=10 * HALF * k)))
    return out


def _t(value: Any) -> datetime:
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _lessons(markdown: str) -> list[str]:
    """The Recent Lessons section of a briefing, line by line (ages included)."""
    lines = markdown.splitlines()
    start = next(i for i, ln in enumerate(lines) if "Recent Lessons" in ln)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip("> ").startswith("###")), len(lines))
    return lines[start:end]


def _run(settings: Any, tmp_path: Path, tau_bench_path: Path, person: bool) -> dict[str, Any]:
    p = Pipeline(settings)
    db = p.s.db_path
    env = {**p.s.as_env(), "KAFKA_BOOTSTRAP": p.boot}
    cli = [sys.executable, "-m", "somnus.cli"]

    def somnus(*args: str) -> str:
        run = subprocess.run(cli + list(args), env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, (args, run.stdout, run.stderr)
        return run.stdout

    def sql(query: str) -> list[list[Any]]:
        return read(db, "sql", sql=query)["rows"]

    out: dict[str, Any] = {}
    tmp_path.mkdir(parents=True, exist_ok=True)
    try:
        p.start_all()
        halves = _halves(tau_bench_path, tmp_path)
        facts: list[list[Any]] = []
        for k, (path, start) in enumerate(halves):
            somnus("import", str(path), "--format", "openai-chat", "--agent", "airline", "--start", start.isoformat())
            p.wait_idle()
            if not person:
                continue
            if not facts:
                facts = sql(
                    "SELECT source, predicate, target FROM facts_active WHERE scope = 'agent:airline' "
                    "ORDER BY confidence DESC, source, predicate, target LIMIT 2"
                )
                assert len(facts) == 2
            stream = datetime.fromisoformat(read(db, "stream_time", scope="agent:airline")["at"])
            out.setdefault("stream", []).append(stream)
            somnus("promote", *facts[k], "--to", "global")
            p.wait_until(
                lambda: sql("SELECT count(*) FROM facts_active WHERE scope = 'global'")[0][0] == k + 1,
                timeout_s=60,
                what="the promoted fact",
            )
            if k == 0:
                said = somnus("sleep")
                assert "sleep requested at" in said, said
                p.wait_until(
                    lambda: sql("SELECT count(*) FROM sleep_runs WHERE trigger = 'on_demand'")[0][0] == 1,
                    timeout_s=60,
                    what="the requested sleep",
                )
                again = somnus("sleep")  # nothing newer: says so, and requests nothing
                assert "nothing to do" in again, again
            p.wait_idle()
        out["scheduled"] = [
            (_t(r[0]), r[1])
            for r in sql("SELECT run_at, memories_after FROM sleep_runs WHERE trigger = 'schedule' ORDER BY run_at")
        ]
        out["on_demand"] = [_t(r[0]) for r in sql("SELECT run_at FROM sleep_runs WHERE trigger = 'on_demand'")]
        out["promoted_at"] = [
            _t(r[0]) for r in sql("SELECT valid_from FROM facts_active WHERE scope = 'global' ORDER BY valid_from")
        ]
        out["newest_event"] = _t(sql("SELECT max(ts) FROM events")[0][0])
        briefing = read(db, "briefing", "airline")["briefing"]
        out["lessons"] = _lessons(briefing["markdown"])
        out["generated_at"] = _t(briefing["generated_at"])
        return out
    finally:
        p.stop_all()


def test_a_person_s_commands_on_historical_data_change_no_age_and_skip_no_scheduled_sleep(
    pipeline_settings, tmp_path, tau_bench_path
):
    import dataclasses
    import uuid

    control = _run(pipeline_settings, tmp_path / "control", tau_bench_path, person=False)
    run = uuid.uuid4().hex[:10]
    other = dataclasses.replace(
        pipeline_settings,
        db_path=tmp_path / "person.duckdb",
        topic_prefix=f"t{run}.",
        app_id=f"somnus-test-{run}",
        home=tmp_path / "person-home",
    )
    person = _run(other, tmp_path / "person", tau_bench_path, person=True)

    # Every command was stamped in the data's time: the airline's newest event when it was given.
    first, second = person["stream"]
    assert first < second <= person["newest_event"] < datetime(2024, 6, 1, tzinfo=timezone.utc)
    assert person["on_demand"] == [first]
    assert person["promoted_at"] == [first, second]
    # The same scheduled sleeps, one per night of the data: none skipped behind the requested one.
    assert [r[0] for r in person["scheduled"]] == [r[0] for r in control["scheduled"]]
    assert any(r[0] > first for r in control["scheduled"])  # ... including one after the request
    assert person["scheduled"][-1][1] == control["scheduled"][-1][1]  # and the last leaves as many memories
    # The lessons have the same ages: the briefing is as of the data's time, not the wall clock's.
    assert person["lessons"] == control["lessons"] and len(control["lessons"]) > 1
    assert person["generated_at"] == control["generated_at"]
