"""The import contracts of pyproject.toml name every runtime module of ``somnus/``."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED = {"somnus.config", "somnus.procs"}  # leaves every layer may import (settings, process helpers)
ENTRY_POINTS = {"somnus.__main__"}


def test_every_runtime_module_is_forbidden_to_the_library_layers_or_declared_shared():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    forbidden = next(c for c in config["contracts"] if c["type"] == "forbidden")
    assert set(forbidden["source_modules"]) == {
        "somnus.schemas",
        "somnus.processors",
        "somnus.streams",
        "somnus.projections",
    }
    runtime = {f"somnus.{p.stem}" for p in (ROOT / "somnus").glob("*.py") if p.stem != "__init__"}
    runtime |= {f"somnus.{p.name}" for p in (ROOT / "somnus").iterdir() if (p / "__init__.py").exists()}
    unclassified = runtime - set(forbidden["forbidden_modules"]) - SHARED - ENTRY_POINTS
    assert not unclassified, f"add these to the forbidden contract's modules, or to SHARED here: {unclassified}"


def test_the_layers_are_the_design_cards():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")
    assert layers["layers"] == ["somnus.projections | somnus.streams", "somnus.processors", "somnus.schemas"]
    # the only exceptions: the projector (the one Kafka consumer among the projections) and its entry
    # point, and the Kafka positions it answers for `somnus status` (projections/positions.py)
    assert {rule.split(" -> ")[0] for rule in layers["ignore_imports"]} == {
        "somnus.projections.projector",
        "somnus.projections.positions",
    }
