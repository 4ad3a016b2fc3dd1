"""``GET /metrics`` on the real projector, and a worker's own endpoint, scraped and parsed with
prometheus_client's parser."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from somnus.projections import auth
from somnus.projections.projector import endpoint_file
from somnus.sample import generate
from tests.pipeline import Pipeline, wait_until

pytestmark = pytest.mark.integration


def _get(url: str, token: str | None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_metrics_of_the_projector_and_the_worker_parse_and_count_what_was_projected(pipeline_settings: Any) -> None:
    p = Pipeline(pipeline_settings)
    home = pipeline_settings.home
    try:
        p.start_all()
        sent = p.publish(list(generate(sessions=30, seed=3)))
        wait_until(lambda: endpoint_file(pipeline_settings.db_path).exists(), 120, what="the projector's endpoint")
        done = p.wait_idle()
        info = json.loads(endpoint_file(pipeline_settings.db_path).read_text())
        url = f"http://127.0.0.1:{info['port']}/metrics"
        operator = auth.token_file(home).read_text().strip()
        agent = auth.TokenStore(home).create(agent="support")[0]
        assert _get(url, None)[0] == 401
        assert _get(url, agent)[0] == 403  # lag and counts describe the whole store: operators only
        status, text = _get(url, operator)
        assert status == 200
        got = _samples(text)
        assert got[("somnus_projected_total", (("kind", "events"),))] == sent == done["counts"]["events"]
        assert got[("somnus_projected_total", (("kind", "episodes"),))] == done["counts"]["episodes"] > 0
        assert got[("somnus_projector_batch_seconds_count", ())] >= 1
        assert any(name == "somnus_projector_fold_seconds_count" for name, _ in got)
        assert got[("somnus_briefing_refresh_seconds_count", ())] >= 1
        assert got[("somnus_projector_lag", (("topic", pipeline_settings.traces_topic),))] == 0
        assert got[("somnus_briefings_stale", ())] == 0 and got[("somnus_briefing_staleness_seconds", ())] == 0
        assert all(v == 0 for (name, _), v in got.items() if name == "somnus_scrape_errors")
        # The worker serves its own counters; where is in its run folder.
        port = json.loads((pipeline_settings.run_dir / "worker.metrics.json").read_text())["port"]
        status, text = _get(f"http://127.0.0.1:{port}/metrics", None)
        worker = _samples(text)
        assert status == 200 and worker[("somnus_worker_events_total", (("worker", "worker"),))] == sent
    finally:
        p.stop_all()
