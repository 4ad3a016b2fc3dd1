"""`somnus bench scn`: the bytes the SCN (rhythms) index takes for the sample fleet's episodes."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any


def run_scn_footprint(memories: int = 10_000, seed: int = 42) -> dict[str, Any]:
    """Bytes the SCN index takes for ``memories`` episodes of the sample fleet (the projector's table).

    Measured as the growth of a DuckDB file holding only ``temporal_bins`` after a checkpoint, next
    to the same cells encoded as msgpack (the densest plain encoding)."""
    import duckdb
    import msgspec
    import pyarrow as pa

    from somnus.bench.advise import distilled
    from somnus.processors.prediction.rhythms import index_of, marks_of_episode
    from somnus.projections import schema
    from somnus.sample import generate

    episodes = distilled(generate(sessions=memories, seed=seed))
    marks = [m for ep in episodes for m in marks_of_episode(ep)]
    t0 = time.perf_counter()
    deltas = index_of(marks).deltas()
    index_s = time.perf_counter() - t0
    work = Path(tempfile.mkdtemp(prefix="somnus-bench-scn-"))
    try:
        sizes = []
        for fill in (False, True):
            path = work / f"scn-{fill}.duckdb"
            con = duckdb.connect(str(path))
            schema.init(con)
            if fill:
                frame = pa.Table.from_pylist([msgspec.structs.asdict(d) for d in deltas])  # noqa: F841
                con.execute(
                    "INSERT INTO temporal_bins SELECT agent, kind, bin_kind, bin, count, successes, failures FROM frame"
                )
            con.execute("CHECKPOINT")
            con.close()
            sizes.append(path.stat().st_size)
        packed = len(msgspec.msgpack.encode([msgspec.structs.astuple(d) for d in deltas]))
        return {
            "memories": len(episodes),
            "marks": len(marks),
            "cells": len(deltas),
            "duckdb_bytes": sizes[1] - sizes[0],
            "msgpack_bytes": packed,
            "marks_per_s": round(len(marks) / index_s, 1),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
