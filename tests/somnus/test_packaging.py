"""The distribution installs one import name, ``somnus``: the design card's root folders (schemas,
streams, processors, projections) go in as its sub-packages, never as generic top-level names."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_one_top_level_package(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                    "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True, cwd=tmp_path)
    [wheel] = tmp_path.glob("somnus-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"somnus"}
    for sub in ("schemas/codec.py", "streams/worker.py", "processors/briefing/generator.py", "projections/projector.py",
                "schemas/trace_event.v1.schema.json"):
        assert f"somnus/{sub}" in names, sub
