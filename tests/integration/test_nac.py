"""NAc and SCN end to end: tau-bench through the real broker, the Faust NAc agent and the projector."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from somnus.importers import openai_chat
from somnus.processors.prediction.causal_links import DEFAULT_ALPHA
from somnus.reads import read
from tests.pipeline import Pipeline
from tests.tau_bench import raw_tau_counts

pytestmark = pytest.mark.integration


def test_tau_bench_outcomes_are_learned_exactly_and_predicted(pipeline_settings, tau_bench_path):
    raw_errors, raw_calls, _ = raw_tau_counts(tau_bench_path)
    errors_by_tool: Counter[str] = Counter()
    for (tool, _), n in raw_errors.items():
        errors_by_tool[tool] += n
    p = Pipeline(pipeline_settings)
    db = p.s.db_path
    try:
        p.start_all()
        p.publish(list(openai_chat(tau_bench_path, agent="airline")))
        p.wait_idle()
        tools = {t["tool"]: t for t in read(db, "tools")}
        # Per-tool error counts learned from the stream equal the counts in the file, for every tool.
        assert {t: (v["calls"], v["errors"]) for t, v in tools.items()} == {
            t: (raw_calls[t], errors_by_tool[t]) for t in raw_calls
        }
        assert (tools["update_reservation_flights"]["calls"], tools["update_reservation_flights"]["errors"]) == (
            104,
            42,
        )
        assert (tools["book_reservation"]["calls"], tools["book_reservation"]["errors"]) == (53, 30)
        assert (tools["update_reservation_baggages"]["calls"], tools["update_reservation_baggages"]["errors"]) == (
            14,
            1,
        )

        # The Rescorla-Wagner strength of failing converges towards the observed failure rate: with a
        # constant alpha (0.1) V is a moving average of recent outcomes, so its level after a burn-in,
        # averaged over the stream, matches the rate; the final V alone wanders by about +-0.1.
        for tool in ("book_reservation", "update_reservation_flights"):
            got = read(db, "predict", tool=tool)
            assert got["known"] and got["basis"] == "tool" and got["outcomes"][0]["confidence"] > 0.9
            rate = errors_by_tool[tool] / raw_calls[tool]
            negative = {
                r[0]
                for r in read(
                    db,
                    "sql",
                    sql=(
                        "SELECT outcome_signature FROM causal_links WHERE level = 'tool' AND tool = ? "
                        "AND valence = 'negative'"
                    ),
                    params=[tool],
                )["rows"]
            }
            per_obs = read(
                db,
                "sql",
                sql=(
                    "SELECT strengths, valence FROM causal_link_updates WHERE level = 'tool' AND tool = ? "
                    "ORDER BY event_observations"
                ),
                params=[tool],
            )["rows"]
            v = [sum(x for o, x in json.loads(r[0]).items() if o in negative) for r in per_obs]
            failed = [1.0 if r[1] == "negative" else 0.0 for r in per_obs]  # this observation was a failure
            assert len(v) == raw_calls[tool] and sum(failed) == errors_by_tool[tool]
            # Averaged after a burn-in, V follows the failures as they came in the stream, up to its lag:
            # with a constant alpha, V_t - V_{t-1} = alpha (x_t - V_{t-1}) sums over the late third to
            # mean(x) - mean(V) = (V_end - V_before) (1 - alpha) / (alpha n), whatever the order.
            start = len(v) // 3
            late, late_failed = v[start:], failed[start:]
            lag = (v[-1] - v[start - 1]) * (1 - DEFAULT_ALPHA) / (DEFAULT_ALPHA * len(late))
            assert abs(sum(late_failed) / len(late_failed) - sum(late) / len(late) - lag) < 1e-9
            # ... and so the overall failure rate, up to how the late third differs from the whole.
            assert abs(sum(late) / len(late) - rate) < 0.15, (tool, sum(late) / len(late), rate)
            final = sum(o["strength"] for o in got["outcomes"] if o["valence"] == "negative")
            assert abs(final - v[-1]) < 1e-9  # predict reads the latest state

        # Never seen: said so, no confident guess.
        unseen = read(db, "predict", tool="teleport_passenger", args='{"to": "moon"}')
        assert unseen["known"] is False and unseen["basis"] == "none" and unseen["outcomes"] == []
        env = {**p.s.as_env(), "KAFKA_BOOTSTRAP": p.boot}
        cli = subprocess.run(
            [
                sys.executable,
                "-m",
                "somnus.cli",
                "predict",
                "--agent",
                "airline",
                "--tool",
                "book_reservation",
                "--args",
                '{"user_id": "someone_1", "cabin": "economy"}',
                "--json",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cli.returncode == 0, cli.stderr
        outcomes = json.loads(cli.stdout)
        assert outcomes and set(outcomes[0]) >= {"outcome", "valence", "strength", "confidence", "observations"}

        # Every update is in the append-only history; the SCN bins counted every call.
        hist = read(db, "sql", sql="SELECT count(*), count(DISTINCT event_signature) FROM causal_link_updates")
        assert hist["rows"][0][0] > sum(raw_calls.values())
        bins = read(
            db,
            "sql",
            sql="SELECT sum(count) FROM temporal_bins WHERE agent = 'airline' "
            "AND bin_kind = 'hour' AND kind = 'tool_call'",
        )
        assert bins["rows"][0][0] == sum(raw_calls.values())
    finally:
        p.stop_all()
