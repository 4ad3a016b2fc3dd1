"""somnus.streams.llm_extractor against a local HTTP server that answers in the Messages API's shape (no network)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from datetime import datetime, timezone

import pytest
from aiohttp import web

from somnus.processors.knowledge.extraction import TraceExtractor
from somnus.schemas.episodes import EpisodeDistilled
from somnus.schemas.events import Outcome
from somnus.streams.llm_extractor import TOOL_NAME, AnthropicExtractor, LLMExtractorConfig

KEY = "sk-test-SECRET-123"
T = datetime(2024, 5, 1, tzinfo=timezone.utc)


def episode(i: int) -> EpisodeDistilled:
    return EpisodeDistilled(
        episode_id=uuid.UUID(int=i),
        schema_version=1,
        agent="scraper",
        session_id=f"s{i}",
        task="fetch prices",
        goal=None,
        user_id=None,
        summary="failure: fetch prices",
        outcome=Outcome.FAILURE,
        started_at=T,
        ended_at=T,
        duration_s=1.0,
        event_count=4,
        tool_calls=1,
        tools=["fetch"],
        errors=[],
        lessons=[],
        delegations=[],
        first_event_id=uuid.UUID(int=1000 + i),
        last_event_id=uuid.UUID(int=2000 + i),
    )


def answer_for(body: dict) -> dict:
    ids = [e["episode_id"] for e in json.loads(body["messages"][0]["content"])["episodes"]]
    return {
        "episodes": [
            {
                "episode_id": i,
                "entities": [{"name": "api.x.io", "type": "api"}],
                "facts": [
                    {
                        "source": "api.x.io",
                        "source_type": "api",
                        "predicate": "rate_limit",
                        "target": "10/s",
                        "target_type": "rate",
                        "confidence": 0.95,
                        "functional": True,
                    }
                ],
            }
            for i in ids
        ]
    }


def message(tool_input: dict, input_tokens: int = 1000, output_tokens: int = 200) -> dict:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-haiku-4-5",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": TOOL_NAME, "input": tool_input}],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


class FakeAPI:
    """Scripted responses: each entry is a callable(body) -> (status, json or text, headers)."""

    def __init__(self, script: list[Callable[[dict], tuple[int, object, dict]]] | None = None) -> None:
        self.script = list(script or [])
        self.requests: list[tuple[dict, dict]] = []
        self.in_flight = self.max_in_flight = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append((dict(request.headers), body))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.02)
            step = self.script.pop(0) if self.script else (lambda b: (200, message(answer_for(b)), {}))
            status, payload, headers = step(body)
            if isinstance(payload, (dict, list)):
                return web.json_response(payload, status=status, headers=headers)
            return web.Response(text=str(payload), status=status, headers=headers)
        finally:
            self.in_flight -= 1


def run(api: FakeAPI, episodes: list[EpisodeDistilled], fallback=None, **cfg):
    async def go():
        app = web.Application()
        app.add_routes([web.post("/v1/messages", api.handle)])
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            config = LLMExtractorConfig(api_key=KEY, base_url=f"http://127.0.0.1:{port}", backoff_s=0.01, **cfg)
            ex = AnthropicExtractor(config, fallback=fallback)
            return ex, await ex.extract(episodes)
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def test_it_is_off_without_a_key():
    assert not LLMExtractorConfig.from_env({}).enabled
    assert LLMExtractorConfig.from_env({"ANTHROPIC_API_KEY": "k"}).enabled
    assert LLMExtractorConfig.from_env({"SOMNUS_LLM_API_KEY": "k", "SOMNUS_LLM_MODEL": "m"}).model == "m"
    with pytest.raises(ValueError, match="needs an API key"):
        AnthropicExtractor(LLMExtractorConfig())


def test_requests_have_the_api_shape_and_answers_become_facts():
    api = FakeAPI()
    ex, out = run(api, [episode(1), episode(2)])
    headers, body = api.requests[0]
    assert headers["x-api-key"] == KEY and headers["anthropic-version"] == "2023-06-01"
    assert body["model"] == "claude-haiku-4-5" and body["tool_choice"] == {"type": "tool", "name": TOOL_NAME}
    assert body["tools"][0]["input_schema"]["required"] == ["episodes"]
    assert [f.episode_id for f in out] == [uuid.UUID(int=1), uuid.UUID(int=2)]
    assert out[0].extractor == "llm/claude-haiku-4-5" and out[0].observed_at == T and out[0].agent == "scraper"
    assert out[0].facts[0].predicate == "rate_limit" and out[0].facts[0].functional is True
    assert ex.counters.cost_usd == pytest.approx((1000 * 1.0 + 200 * 5.0) / 1e6)


def test_episodes_are_batched_and_requests_bounded_in_parallel():
    api = FakeAPI()
    _, out = run(api, [episode(i) for i in range(1, 21)], episodes_per_request=3, concurrency=2)
    assert len(api.requests) == 7 and len(out) == 20
    assert api.max_in_flight == 2
    assert [f.episode_id.int for f in out] == list(range(1, 21))


def test_a_429_is_retried():
    api = FakeAPI([lambda b: (429, {"type": "error"}, {"retry-after": "0.01"})])
    ex, out = run(api, [episode(1)])
    assert len(api.requests) == 2 and ex.counters.retries == 1 and out[0].extractor.startswith("llm/")


@pytest.mark.parametrize(
    "bad",
    [
        lambda b: (500, "boom", {}),
        lambda b: (200, "{not json", {}),
        lambda b: (200, message({"episodes": [{"episode_id": "x", "facts": [{"source": "a"}]}]}), {}),
        lambda b: (200, {"content": [{"type": "text", "text": "no tool"}], "usage": {}}, {}),
    ],
)
def test_a_failed_or_invalid_answer_falls_back_to_the_trace_extractor(bad):
    api = FakeAPI([bad] * 10)
    ex, out = run(api, [episode(1)], fallback=TraceExtractor(), max_retries=1)
    assert out[0].extractor == "trace/1" and ex.counters.fallbacks == 1


def test_the_cost_cap_stops_new_requests_and_the_rest_fall_back():
    api = FakeAPI([lambda b: (200, message(answer_for(b), input_tokens=2_000_000), {})])
    ex, out = run(
        api,
        [episode(i) for i in range(1, 6)],
        fallback=TraceExtractor(),
        episodes_per_request=1,
        concurrency=1,
        cost_cap_usd=1.0,
    )
    assert len(api.requests) == 1 and ex.counters.cost_usd >= 1.0
    assert [f.extractor for f in out] == ["llm/claude-haiku-4-5"] + ["trace/1"] * 4


def test_the_key_never_appears_in_errors_or_repr():
    api = FakeAPI([lambda b: (401, {"error": "bad key"}, {})])
    ex, out = run(api, [episode(1)], max_retries=0)
    assert KEY not in repr(ex) and KEY not in repr(ex.config)
    assert out[0].facts == [] and ex.counters.failures == 1


def test_the_worker_uses_the_llm_only_when_turned_on_and_keyed(monkeypatch):
    from somnus.config import Settings
    from somnus.streams.app import make_extractor

    monkeypatch.delenv("SOMNUS_LLM_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    assert isinstance(make_extractor(Settings.resolve(env={})), TraceExtractor)
    on = Settings.resolve(env={"SOMNUS_LLM_EXTRACTOR": "true"})
    with pytest.raises(ValueError, match="no API key"):
        make_extractor(on)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    ex = make_extractor(on)
    assert isinstance(ex, AnthropicExtractor) and isinstance(ex.fallback, TraceExtractor)
