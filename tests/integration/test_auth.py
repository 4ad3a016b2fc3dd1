"""Authentication on the real projector process and its briefing server (real broker, real HTTP)."""

from __future__ import annotations

import json
import stat
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from somnus.projections import api, auth
from somnus.projections.endpoint import endpoint_file
from somnus.reads import read
from tests.pipeline import Pipeline, wait_until

pytestmark = pytest.mark.integration


# What a GET route needs to answer 200 (the others need nothing).
QUERIES = {
    "history": {"entity": "tool:search"},
    "recall": {"query": "q", "record": "false"},
    "episodic_context": {"query": "q"},
    "context": {"query": "q"},
    "predict": {"tool": "search"},
    "advise": {"task": "search"},
}


def _status(port: int, route: api.Route, agent: str, token: str | None, **headers: str) -> tuple[int, Any]:
    body = json.dumps({"inject": {"prompt": "p"}, "sql": {"sql": "SELECT 1"}}.get(route.handler, {})).encode()
    query = f"?{urllib.parse.urlencode(QUERIES[route.handler])}" if route.handler in QUERIES else ""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{route.path.replace('{agent}', agent)}{query}",
        method=route.method,
        data=body if route.method == "POST" else None,
        headers={
            "Content-Type": "application/json",
            **({"Authorization": f"Bearer {token}"} if token else {}),
            **headers,
        },
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_the_projector_and_the_briefing_server_refuse_what_a_token_may_not_read(pipeline_settings: Any) -> None:
    p = Pipeline(pipeline_settings)
    home = pipeline_settings.home
    try:
        p.start("projector")
        wait_until(lambda: endpoint_file(pipeline_settings.db_path).exists(), 120, what="the projector's endpoint")
        info = json.loads(endpoint_file(pipeline_settings.db_path).read_text())
        # The projector made the operator's token file (0600) and names it, not the token, in its endpoint file.
        operator = auth.token_file(home).read_text().strip()
        assert stat.S_IMODE(auth.token_file(home).stat().st_mode) == 0o600
        assert info["token_file"] == str(auth.token_file(home)) and operator not in json.dumps(info)
        agent = auth.TokenStore(home).create(agent="support")[0]
        user = auth.TokenStore(home).create(agent="support", user="u1")[0]
        expired = auth.TokenStore(home).create(
            agent="support", expires_at=datetime.now(timezone.utc) - timedelta(seconds=1)
        )[0]
        for port in (info["port"], info["briefing_port"]):
            served = {("GET", "/openapi.json")} | (
                {(r.method, r.path) for r in api.all_routes()}
                if port == info["port"]
                else {(r.method, r.path) for r in api.all_routes() if r.handler in ("briefing", "inject")}
            )
            for route in api.all_routes():
                if (route.method, route.path) not in served:
                    continue
                assert _status(port, route, "support", None)[0] == 401, (port, route.path)
                assert _status(port, route, "support", "forged")[0] == 401, (port, route.path)
                status, got = _status(port, route, "support", expired)
                assert status == 401 and b"expired" in got, (port, route.path)
                # A user-bound token: its user's items on every agent route (issue 25), not a 403.
                assert _status(port, route, "support", user)[0] == (403 if auth.whole_store(route) else 200), (
                    port,
                    route.path,
                )
                if "{agent}" in route.path:
                    assert _status(port, route, "billing", agent)[0] == 403, (port, route.path)
                else:
                    assert _status(port, route, "", agent)[0] == 403, (port, route.path)
                assert _status(port, route, "support", operator, Host="evil.example")[0] == 421
            inject = next(r for r in api.all_routes() if r.handler == "inject")
            status, got = _status(port, inject, "support", agent)
            assert status == 200 and got["prompt"].endswith("p")
        # The CLI's reads send the operator's token by themselves.
        assert read(pipeline_settings.db_path, "summary")["counts"] is not None
        assert read(pipeline_settings.db_path, "briefing", "support")["agent"] == "support"
    finally:
        p.stop_all()
