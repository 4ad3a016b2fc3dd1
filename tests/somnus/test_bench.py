"""The in-process benchmarks run, at toy sizes, and report what BENCHMARKS.md quotes (no timing asserted)."""

from __future__ import annotations

from somnus import bench
from somnus.bench.briefing import _floor_server


def test_fact_query_bench_checks_its_three_paths_agree():
    got = bench.run_fact_query(triples=3000, agents=20, teams=4, queries=20, limit=10)
    assert {"p95_ms", "sql_p95_ms", "scan_p95_ms"} <= set(got) and got["triples"] == 3000


def test_predict_scn_recall_and_context_benches_report_their_figures():
    assert bench.run_predict(links=2000, queries=20)["links"] == 2000
    scn = bench.run_scn_footprint(memories=40)
    assert scn["cells"] > 0 and scn["msgpack_bytes"] > 0
    rec = bench.run_recall(units=300, queries=10)
    assert rec["units"] == 300 and rec["p95_ms"] > 0 and rec["rss_mib"] >= 0
    ctx = bench.run_context(units=300, queries=5, messages=120)
    assert ctx["buffer_adds"] == 120 and ctx["context_p95_ms"] > 0


def test_capture_bench_times_each_part_and_tells_bounded_from_unbounded():
    bounded = bench.run_capture(sessions=300, batch=50, chunks=3, candidates=2)
    unbounded = bench.run_capture(sessions=300, batch=50, chunks=3, candidates=None)
    assert bounded["units"] == unbounded["units"] > 0 and len(bounded["us_per_unit_by_chunk"]) == 3
    assert 0 < bounded["stored"] <= bounded["units"]
    # With only 2 candidates, templated episodes find fewer near-duplicates to merge into: other decisions.
    assert bounded["digest"] != unbounded["digest"]


def test_sleep_bench_runs_a_real_sleep_and_reports_the_store_before_and_after():
    got = bench.run_sleep(units=1500, agents=10)
    assert got["units"] == 1500 and got["memories_before"] == got["live_memories"] > 0
    assert got["memories_after"] == got["memories_before"] - got["pruned"] == got["kept"] + got["compressed"]
    assert got["pruned"] > 0 and got["compressed"] > 0  # 60 days of episodes, 150 per agent over a cap of 50
    assert got["bytes_after"] < got["bytes_before"] and got["lifecycle_rows"] > got["pruned"]
    assert got["forgotten_events"] == got["pruned"] + got["compressed"]


def test_every_bench_command_has_its_runner():
    from somnus.cli.bench import bench_app

    names = {c.name for c in bench_app.registered_commands}
    assert names == {
        "e2e",
        "facts-query",
        "predict",
        "scn",
        "recall",
        "context",
        "briefing",
        "sleep",
        "capture",
        "cli",
        "advise",
        "oscillators",
    }
    for runner in (
        "run_e2e",
        "run_fact_query",
        "run_predict",
        "run_scn_footprint",
        "run_recall",
        "run_context",
        "run_briefing",
        "run_sleep",
        "run_capture",
    ):
        assert callable(getattr(bench, runner))
    from somnus.bench.advise import run_advise  # benchmarks in their own modules
    from somnus.bench.oscillators import run_oscillators

    assert callable(run_advise) and callable(run_oscillators)


def test_the_briefing_benchs_floor_server_answers_every_request_on_a_kept_connection_with_the_body():
    import http.client
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    ports = ctx.SimpleQueue()
    proc = ctx.Process(target=_floor_server, args=(b'{"markdown": "# x"}', ports), daemon=True)
    proc.start()
    try:
        con = http.client.HTTPConnection("127.0.0.1", ports.get(), timeout=10)
        for agent in ("a", "b", "c"):
            con.request("GET", f"/agents/{agent}/briefing")
            with con.getresponse() as resp:
                assert resp.status == 200 and resp.read() == b'{"markdown": "# x"}'
        con.close()
    finally:
        proc.kill()
        proc.join(10)
