"""The briefing server process (real child process, real HTTP; briefings built here, no broker)."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from datetime import datetime, timezone

import msgspec
import pytest

from somnus.projections import api
from somnus.projections.auth import ensure_operator_token
from somnus.projections.briefing_server import CHUNK, BriefingServer
from somnus.projections.http import dumps
from somnus.schemas.briefing import BriefingGenerated, ServedFact

AT = datetime(2025, 1, 6, 9, tzinfo=timezone.utc)


def _briefing(agent: str, text: str) -> BriefingGenerated:
    md = f"## Recent Lessons\n- {text} (1 day ago)\n"
    return BriefingGenerated(
        schema_version=1,
        agent=agent,
        briefing_id=f"b-{agent}-{len(text)}",
        generated_at=AT,
        budget=2000,
        markdown=md,
        chars=len(md),
        lessons=1,
        facts=[
            ServedFact(
                triple_id="t1",
                source="tool:fetch",
                predicate="failed_with",
                target="error:429",
                scope=f"agent:{agent}",
                confidence=0.9,
                source_name="fetch",
                target_name="429",
            )
        ],
        strategies=0,
        dropped_lessons=0,
        dropped_facts=0,
        dropped_strategies=0,
    )


TOKEN = {"value": ""}  # the operator token of the test's home (every route needs one: projections/auth.py)


def _http(port: int, path: str, body: dict | None = None) -> bytes:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN['value']}"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.read()


async def _eventually(check, timeout_s: float = 10.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        got = await asyncio.to_thread(check)
        if got or asyncio.get_running_loop().time() > deadline:
            return got
        await asyncio.sleep(0.05)


def test_it_answers_as_the_projector_does_and_follows_every_change_and_sends_served_records_back(tmp_path):
    TOKEN["value"] = ensure_operator_token(tmp_path)

    async def run():
        served: list = []
        first = [_briefing(f"agent-{i:04d}", f"lesson {i}") for i in range(CHUNK * 2 + 7)]  # several chunks
        server = BriefingServer(served.append, tmp_path)
        port = await server.start(first)
        try:
            # Same bytes as the projector's own route over the same cache.
            mine = api.ReadService(con=None, agents={}, briefings={b.agent: b for b in first})  # type: ignore[arg-type]
            for agent in ("agent-0000", f"agent-{CHUNK * 2 + 6:04d}", "nobody"):
                want = dumps(api.call(mine, next(r for r in api.ROUTES if r.handler == "briefing"), agent, {}))
                got = await _eventually(lambda: _http(port, f"/agents/{agent}/briefing"))
                assert json.loads(got) == json.loads(want)
            # A refresh's changes reach it.
            server.publish([_briefing("agent-0003", "rate limit hit; backoff resolved it")])
            assert await _eventually(lambda: b"backoff resolved it" in _http(port, "/agents/agent-0003/briefing"))
            # Injection: the prompt wrapped, and the served record comes back to the projector.
            out = json.loads(
                await asyncio.to_thread(
                    _http, port, "/agents/agent-0003/inject", {"prompt": "You are helpful.", "session_id": "s-1"}
                )
            )
            assert "backoff resolved it" in out["prompt"] and out["prompt"].endswith("You are helpful.")
            await _eventually(lambda: bool(served), 10)
            assert [(r.agent, r.session_id, [f.triple_id for f in r.facts]) for r in served] == [
                ("agent-0003", "s-1", ["t1"])
            ]
            # Other reads are not its business.
            with pytest.raises(urllib.error.HTTPError) as err:
                await asyncio.to_thread(_http, port, "/agents/agent-0003/facts")
            assert err.value.code == 404
            # Bad input gets the same clear error as from the projector.
            with pytest.raises(urllib.error.HTTPError) as err:
                await asyncio.to_thread(_http, port, "/agents/agent-0003/inject", {"prompt": 3})
            assert err.value.code == 400 and b"prompt" in err.value.read()
            # Without the token nothing is answered.
            TOKEN["value"] = "not-a-token"
            with pytest.raises(urllib.error.HTTPError) as err:
                await asyncio.to_thread(_http, port, "/agents/agent-0003/briefing")
            assert err.value.code == 401
        finally:
            proc = server._proc
            server.stop()
        assert proc.poll() is not None

    asyncio.run(run())


def test_it_exits_when_the_projector_goes_away(tmp_path):
    async def run():
        server = BriefingServer(lambda r: None, tmp_path)
        await server.start([])
        proc = server._proc
        server._updates.close()  # what the OS does to the pipe when the projector dies
        assert await asyncio.to_thread(proc.wait, 10) is not None
        server._updates = None
        server.stop()

    asyncio.run(run())


def test_briefings_travel_the_pipe_unchanged():
    b = _briefing("a", "x")
    assert msgspec.json.decode(msgspec.json.encode([b]), type=list[BriefingGenerated]) == [b]
