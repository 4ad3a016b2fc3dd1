"""Somnus's benchmarks, one module per ``somnus bench`` command (method and figures: BENCHMARKS.md).

``pipeline`` runs an isolated pipeline on the local broker (also used by ``somnus eval``);
``synthetic`` makes the in-process benchmarks' inputs.
"""

from __future__ import annotations

from somnus.bench.advise import run_advise
from somnus.bench.briefing import run_briefing
from somnus.bench.capture import run_capture
from somnus.bench.context import run_context
from somnus.bench.e2e import run_e2e
from somnus.bench.facts_query import run_fact_query
from somnus.bench.oscillators import run_oscillators
from somnus.bench.pipeline import isolated_pipeline, python_loop_s, raw_consume
from somnus.bench.predict import run_predict
from somnus.bench.recall import run_recall
from somnus.bench.scn import run_scn_footprint
from somnus.bench.sleep import run_sleep
from somnus.bench.synthetic import synthetic_triples

__all__ = [
    "isolated_pipeline",
    "python_loop_s",
    "raw_consume",
    "run_advise",
    "run_briefing",
    "run_capture",
    "run_context",
    "run_e2e",
    "run_fact_query",
    "run_oscillators",
    "run_predict",
    "run_recall",
    "run_scn_footprint",
    "run_sleep",
    "synthetic_triples",
]
