"""The distribution installs one import name, ``somnus``: the design card's root folders (schemas,
streams, processors, projections) go in as its sub-packages, never as generic top-level names."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_one_top_level_package(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    [wheel] = tmp_path.glob("somnus-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"somnus"}
    for sub in (
        "schemas/codec.py",
        "streams/worker.py",
        "processors/briefing/generator.py",
        "projections/projector.py",
        "schemas/trace_event.v1.schema.json",
        "schemas/wire.py",
        "schemas/agents.py",
        "streams/kafka_compat/consumer.py",
    ):
        assert f"somnus/{sub}" in names, sub
    # every package of the source folders (pyproject's packages list is written by hand)
    for folder in ("somnus", "schemas", "streams", "processors", "projections"):
        for init in (ROOT / folder).rglob("__init__.py"):
            inside = init.relative_to(ROOT / folder).as_posix()
            assert (f"somnus/{inside}" if folder == "somnus" else f"somnus/{folder}/{inside}") in names, init
    assert any(n.startswith("somnus/data/agents/") for n in names)  # schemas.agents.DEFAULT_DIR
