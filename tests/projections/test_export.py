"""projections.export: every projection as hive-partitioned Parquet with a manifest of offsets, read
back by DuckDB and polars; bad requests are refused by name."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import duckdb
import polars as pl
import pytest

from somnus.projections import schema
from somnus.projections.export import ExportError, export_parquet, tables_of


def _db(path: Path) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(str(path))
    schema.init(con)
    con.execute("INSERT INTO projection_offsets VALUES ('traces', 0, 7), ('traces', 1, 3), ('episodes', 0, 2)")
    con.execute("""INSERT INTO episodes (episode_id, agent, session_id, outcome, ended_at, src_partition, src_offset)
                   SELECT uuid(), a, 's' || i, 'success', TIMESTAMPTZ '2024-05-17 23:30:00+00' + i * INTERVAL 1 HOUR, 0, i
                   FROM range(6) t(i), (VALUES ('scraper'), ('a/b c')) v(a)""")
    con.execute("""INSERT INTO events SELECT uuid(), 1, TIMESTAMPTZ '2024-05-17 10:00:00+00', 'scraper', 's', i,
                   'tool_call', '{}', 0, i, 0 FROM range(5) t(i)""")
    return con


def parquet_rows(folder: Path, table: str) -> int:
    return duckdb.sql(
        f"SELECT count(*) FROM read_parquet('{folder / table}/**/*.parquet', hive_partitioning=true)"
    ).fetchall()[0][0]


def test_every_projection_is_written_partitioned_and_read_back(tmp_path: Path) -> None:
    con = _db(tmp_path / "somnus.duckdb")
    out = tmp_path / "export"
    manifest = export_parquet(con, str(out))
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert manifest["offsets"] == [
        {"topic": "episodes", "partition": 0, "next_offset": 2},
        {"topic": "traces", "partition": 0, "next_offset": 7},
        {"topic": "traces", "partition": 1, "next_offset": 3},
    ]
    assert set(manifest["tables"]) == set(tables_of(con))
    for table, info in manifest["tables"].items():
        assert parquet_rows(out, table) == info["rows"] == con.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
    ep = manifest["tables"]["episodes"]
    assert ep["partition_by"] == ["agent", "day"] and ep["day_from"] == "ended_at"
    assert manifest["tables"]["projection_offsets"]["partition_by"] == []
    # by agent (a name with / and a space is encoded in the folder name) and UTC day
    assert {p.name for p in (out / "episodes").iterdir()} == {"agent=scraper", "agent=a%2Fb%20c"}
    assert sorted(p.name for p in (out / "episodes" / "agent=scraper").iterdir()) == [
        "day=2024-05-17",
        "day=2024-05-18",
    ]
    back = pl.scan_parquet(out / "episodes" / "**" / "*.parquet", hive_partitioning=True).collect()
    assert back.height == 12 and sorted(set(back["agent"].to_list())) == ["a/b c", "scraper"]
    got = duckdb.sql(
        f"SELECT agent, day, count(*) FROM read_parquet('{out}/episodes/**/*.parquet', "
        "hive_partitioning=true) GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    assert [(a, str(d), n) for a, d, n in got] == [
        ("a/b c", "2024-05-17", 1),
        ("a/b c", "2024-05-18", 5),
        ("scraper", "2024-05-17", 1),
        ("scraper", "2024-05-18", 5),
    ]
    # an empty table is still there, with its columns
    assert parquet_rows(out, "lessons") == 0
    assert "text" in pl.read_parquet(out / "lessons" / "part-0.parquet").columns


def test_since_and_tables_narrow_the_export(tmp_path: Path) -> None:
    con = _db(tmp_path / "somnus.duckdb")
    manifest = export_parquet(con, str(tmp_path / "e"), ["episodes", "events"], "2024-05-18T00:00:00Z")
    assert set(manifest["tables"]) == {"episodes", "events"}
    assert manifest["tables"]["episodes"]["rows"] == 10 and manifest["tables"]["events"]["rows"] == 0
    assert manifest["tables"]["episodes"]["since_applied"]


@pytest.mark.parametrize(
    "args, says",
    [
        (("relative/dir",), "absolute"),
        ((None,), "required"),
        (("{tmp}/e", ["episodes", "nope"]), "'nope'"),
        (("{tmp}/e", None, "yesterday"), "ISO 8601"),
        (("{tmp}/full",), "not an empty folder"),
    ],
)
def test_a_bad_request_is_refused_by_name(tmp_path: Path, args: tuple, says: str) -> None:
    con = _db(tmp_path / "somnus.duckdb")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    args = tuple(a.format(tmp=tmp_path) if isinstance(a, str) else a for a in args)
    with pytest.raises(ExportError, match=says):
        export_parquet(con, *args)
    assert not (tmp_path / "e").exists()  # nothing half written


def test_the_export_is_one_snapshot_while_a_writer_commits(tmp_path: Path) -> None:
    """Rows and offsets committed together by another cursor during the export: the export has the
    rows of exactly the offsets it records."""
    con = _db(tmp_path / "somnus.duckdb")
    stop = threading.Event()

    def writer() -> None:
        w = con.cursor()
        n = 100
        while not stop.is_set():
            w.execute("BEGIN TRANSACTION")
            w.execute(
                "INSERT INTO events SELECT uuid(), 1, now(), 'scraper', 's', i, 'x', '{}', 1, ?, 0 FROM range(50) t(i)",
                [n],
            )
            w.execute(
                "UPDATE projection_offsets SET next_offset = ? WHERE topic = 'traces' AND kafka_partition = 1", [n + 1]
            )
            w.execute("COMMIT")
            n += 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        manifests = [export_parquet(con, str(tmp_path / f"e{i}"), ["events", "projection_offsets"]) for i in range(5)]
    finally:
        stop.set()
        t.join()
    seen = set()
    for i, m in enumerate(manifests):
        upto = next(o["next_offset"] for o in m["offsets"] if o["partition"] == 1)
        seen.add(upto)
        # 5 events of partition 0, 50 per committed batch of partition 1 from offset 100 to upto - 1
        assert m["tables"]["events"]["rows"] == 5 + 50 * max(0, upto - 100)
        assert parquet_rows(tmp_path / f"e{i}", "events") == m["tables"]["events"]["rows"]
    assert len(seen) > 1  # the writer did commit during the exports


def test_a_table_of_its_partition_column_alone_is_written_whole_and_read_back(tmp_path: Path) -> None:
    # briefings_dirty holds only `agent`: partitioned by it, its files would have no column, which
    # DuckDB refuses to read ("Need at least one non-root column")
    con = _db(tmp_path / "somnus.duckdb")
    con.execute("INSERT INTO briefings_dirty VALUES ('scraper'), ('deployer')")
    assert [c for c, _ in tables_of(con)["briefings_dirty"]] == ["agent"]
    out = tmp_path / "export"
    manifest = export_parquet(con, str(out), tables=["briefings_dirty"])
    assert manifest["tables"]["briefings_dirty"]["partition_by"] == []
    assert parquet_rows(out, "briefings_dirty") == 2
    assert sorted(pl.read_parquet(out / "briefings_dirty" / "part-0.parquet")["agent"].to_list()) == [
        "deployer",
        "scraper",
    ]


def test_a_symbolic_link_or_a_folder_others_may_write_is_refused(tmp_path: Path) -> None:
    """Attacks on the export's folder: a link to where the data would land; a folder another user
    may write to, where a link planted after the check would redirect a part file."""
    con = _db(tmp_path / "somnus.duckdb")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ExportError, match="symbolic link"):
        export_parquet(con, str(tmp_path / "link"))
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)
    with pytest.raises(ExportError, match="writable by others"):
        export_parquet(con, str(tmp_path / "open"))
    assert not any((tmp_path / "elsewhere").iterdir()) and not any((tmp_path / "open").iterdir())


def test_a_hostile_agent_name_stays_a_folder_name_inside_the_export(tmp_path: Path) -> None:
    """Partition values are stored text (a record names any agent): pyarrow writes them URI-encoded,
    so no "/" or ".." of an agent's name leaves the table's folder (pinned)."""
    con = _db(tmp_path / "somnus.duckdb")
    for agent in ("../../../../escaped", "a/../../../../escaped2", "..", "."):
        con.execute("INSERT INTO temporal_bins VALUES (?, 'k', 'hour', 1, 1, 0, 0)", [agent])
    export_parquet(con, str(tmp_path / "out"), tables=["temporal_bins"])
    assert not list(tmp_path.rglob("escaped*")) or all(
        p.resolve().is_relative_to((tmp_path / "out" / "temporal_bins").resolve()) for p in tmp_path.rglob("*escaped*")
    )
    written = [p for p in (tmp_path / "out").rglob("*.parquet")]
    assert len(written) == 4 and all(p.resolve().is_relative_to((tmp_path / "out").resolve()) for p in written)
    assert parquet_rows(tmp_path / "out", "temporal_bins") == 4
