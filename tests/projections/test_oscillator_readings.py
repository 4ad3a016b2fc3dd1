"""The SCN oscillators' anomaly scores, stored in ``oscillator_readings`` by the memory fold and shown
by the oscillators route (real DuckDB file; records built here, no broker)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import duckdb
import pytest

from somnus.processors.prediction.oscillators import OscillatorConfig
from somnus.projections import api, queries, schema
from somnus.projections.writer import ReadModels, Topics, apply_batch, load_offsets
from somnus.schemas.codec import encode
from somnus.schemas.memory import KIND_UNITS, MemoryKind, MemoryUnit
from tests.factories import Rec

TOPICS = Topics("traces", "episodes", "dead-letters", "facts", "link-updates", "memory")
T0 = datetime(2024, 1, 1, 9, tzinfo=timezone.utc)  # a Monday, 9 AM
PLANTED = T0 + timedelta(days=40, hours=12)  # a 9 PM run of a job that runs at 9 AM


def unit(i: int, at: datetime, agent: str = "nightly") -> MemoryUnit:
    return MemoryUnit(
        memory_id=f"m{i:03d}",
        kind=MemoryKind.EPISODE,
        agent=agent,
        scope=f"agent:{agent}",
        run_id=f"s{i}",
        occurred_at=at,
        perception=f"run {i}",
        outcome="success",
        success=True,
    )


def daily_with_a_planted_anomaly() -> list[MemoryUnit]:
    days = [unit(d, T0 + timedelta(days=d)) for d in range(40)]
    return [*days, unit(40, PLANTED), *(unit(41 + d, T0 + timedelta(days=41 + d)) for d in range(5))]


def project(path, units, chunks=1):
    con = duckdb.connect(str(path))
    schema.init(con)
    size = -(-len(units) // chunks)
    for c, j in enumerate(range(0, len(units), size)):
        rec = Rec(
            "memory",
            0,
            c,
            encode(units[j : j + size]),
            headers=[("somnus-kind", KIND_UNITS)],
            timestamp=int(max(u.occurred_at for u in units[j : j + size]).timestamp() * 1000) + 1000,
        )
        apply_batch(con, TOPICS, [rec], load_offsets(con), 1 << 20, ReadModels(con, oscillators=OscillatorConfig(True)))
    return con


def test_a_planted_off_rhythm_run_is_stored_as_the_anomaly_and_shown(tmp_path):
    con = project(tmp_path / "o.duckdb", daily_with_a_planted_anomaly())
    rows = con.execute(
        "SELECT memory_id, anomaly FROM oscillator_readings WHERE kind = 'session_end' ORDER BY anomaly DESC"
    ).fetchall()
    assert len(rows) == 45  # every event but the pattern's first has a reading
    (top, score), (_, second) = rows[0], rows[1]
    assert top == "m040" and score > 0.9  # 12 hours off a daily rhythm: half a period
    # the run after it is pulled off too (entrainment moved the phase), the rest are on time
    on_time = [a for m, a in rows if m not in ("m040", "m041")]
    assert max(on_time) < 0.05 and second < score
    shown = api.ReadService(con, {}).oscillators("nightly")
    end = next(p for p in shown if p["kind"] == "session_end")
    assert end["anomalies"][0]["memory_id"] in ("m040", "m041") and "m040" in {a["memory_id"] for a in end["anomalies"]}
    assert all(a["anomaly"] >= 0.25 for a in end["anomalies"])
    assert end["coupling"]["eigenvalues"] and 0.0 <= end["coherence"] <= 1.0 and end["next_recurrence"]
    top_only = api.ReadService(con, {}).oscillators("nightly", anomaly_min=score)
    assert [a["memory_id"] for a in next(p for p in top_only if p["kind"] == "session_end")["anomalies"]] == ["m040"]
    with pytest.raises(api.BadRequest, match="anomaly_min"):
        api.ReadService(con, {}).oscillators("nightly", anomaly_min="high")
    con.close()


def test_readings_are_the_same_whatever_the_batches_and_a_redelivery_adds_none(tmp_path):
    units = daily_with_a_planted_anomaly()
    one = project(tmp_path / "one.duckdb", units)
    many = project(tmp_path / "many.duckdb", units, chunks=4)
    assert queries.table_checksums(one)["oscillator_readings"] == queries.table_checksums(many)["oscillator_readings"]
    n = many.execute("SELECT count(*) FROM oscillator_readings").fetchone()[0]
    again = Rec("memory", 0, 0, encode(units[:12]), headers=[("somnus-kind", KIND_UNITS)])
    apply_batch(
        many, TOPICS, [again], load_offsets(many), 1 << 20, ReadModels(many, oscillators=OscillatorConfig(True))
    )
    assert many.execute("SELECT count(*) FROM oscillator_readings").fetchone()[0] == n
    one.close()
    many.close()


def test_no_readings_when_the_oscillators_are_off(tmp_path):
    con = duckdb.connect(str(tmp_path / "off.duckdb"))
    schema.init(con)
    rec = Rec("memory", 0, 0, encode(daily_with_a_planted_anomaly()), headers=[("somnus-kind", KIND_UNITS)])
    apply_batch(con, TOPICS, [rec], {}, 1 << 20, ReadModels(con))
    assert con.execute("SELECT count(*) FROM oscillator_readings").fetchone()[0] == 0
    con.close()
