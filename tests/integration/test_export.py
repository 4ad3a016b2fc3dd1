"""``somnus export parquet`` against the real broker, worker and projector, while ingest runs: each
export is one committed snapshot, its rows those of the database at the offsets its manifest records,
and DuckDB and polars read it."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import polars as pl
import pytest

from somnus.projections.endpoint import endpoint_file
from somnus.reads import read
from somnus.sample import generate
from tests.pipeline import Pipeline

pytestmark = pytest.mark.integration


def parquet_count(folder: Path, table: str) -> int:
    return duckdb.sql(
        f"SELECT count(*) FROM read_parquet('{folder / table}/**/*.parquet', hive_partitioning=true, "
        "union_by_name=true)"
    ).fetchall()[0][0]


def count_below(s, table: str, topic: str, offsets: dict[tuple[str, int], int]) -> int:
    """Rows of ``table`` (live database) from records of ``topic`` before the manifest's offsets."""
    bounds = [(p, o) for (t, p), o in offsets.items() if t == topic]
    if not bounds:
        return 0
    cond = " OR ".join(f"(src_partition = {p} AND src_offset < {o})" for p, o in bounds)
    return read(s.db_path, "sql", sql=f"SELECT count(*) FROM {table} WHERE {cond}")["rows"][0][0]


def test_exports_during_ingest_are_snapshots_at_their_offsets(pipeline_settings, tmp_path):
    p = Pipeline(pipeline_settings)
    s = p.s
    env = {**s.as_env(), "KAFKA_BOOTSTRAP": p.boot}
    events = list(generate(sessions=400, seed=11))
    n = len(events) // 8 + 1
    chunks = [events[i : i + n] for i in range(0, len(events), n)]  # eight publishes, in order, while exports run
    try:
        p.start_all()
        p.wait_until(lambda: endpoint_file(s.db_path).exists(), what="the projector serving")
        done = threading.Event()

        def ingest() -> None:
            for chunk in chunks:
                p.publish(chunk)
                time.sleep(0.5)
            done.set()

        t = threading.Thread(target=ingest)
        t.start()
        exports: list[Path] = []
        while not done.is_set() or len(exports) < 2:
            out = tmp_path / f"export-{len(exports)}"
            run = subprocess.run(
                [sys.executable, "-m", "somnus.cli", "export", "parquet", str(out), "--json"],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert run.returncode == 0, run.stderr
            exports.append(out)
        t.join()
        p.wait_idle()
        final = read(s.db_path, "sql", sql="SELECT count(*) FROM events")["rows"][0][0]
        mid = 0
        for out in exports:
            m = json.loads((out / "manifest.json").read_text())
            offsets = {(o["topic"], o["partition"]): o["next_offset"] for o in m["offsets"]}
            # the offsets the snapshot was at are the ones its projection_offsets table holds
            got = duckdb.sql(
                f"SELECT topic, kafka_partition, next_offset FROM '{out}/projection_offsets/*.parquet'"
            ).fetchall()
            assert {(t, pt): o for t, pt, o in got} == offsets
            for table, info in m["tables"].items():
                assert parquet_count(out, table) == info["rows"], table
            # the database's rows at those offsets: the export has exactly them
            assert m["tables"]["events"]["rows"] == count_below(s, "events", s.traces_topic, offsets)
            assert m["tables"]["episodes"]["rows"] == count_below(s, "episodes", s.episodes_topic, offsets)
            assert (
                pl.scan_parquet(out / "episodes" / "**" / "*.parquet", hive_partitioning=True)
                .select(pl.len())
                .collect()
                .item()
                == m["tables"]["episodes"]["rows"]
            )
            mid += 0 < m["tables"]["events"]["rows"] < final
        assert mid >= 1, "no export was taken while ingest ran"
    finally:
        p.stop_all()
