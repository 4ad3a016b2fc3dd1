"""The optional LLM entity extractor: the Anthropic Messages API, off unless a key is configured.

It batches episodes (``episodes_per_request`` per request, ``concurrency`` requests in parallel),
constrains the answer with a JSON schema through tool use (``tool_choice`` forces the
``record_knowledge`` tool, whose ``input_schema`` is the output contract), validates what comes
back with msgspec, and keeps a per-run cost cap from the ``usage`` the API reports. An episode
whose request failed, whose answer was invalid, or that came after the cap was reached goes to
the fallback extractor (the deterministic ``TraceExtractor``), so nothing is lost and the write
path never depends on the network being up. The key is never logged nor put in an error.

This is I/O, so it lives in ``streams/``; the deterministic extractor stays in ``processors/``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec

from somnus.schemas.episodes import EpisodeDistilled
from somnus.schemas.facts import FACTS_SCHEMA_VERSION, EntityMention, FactAsserted, FactsExtracted

log = logging.getLogger("somnus.llm_extractor")

TOOL_NAME = "record_knowledge"
ANTHROPIC_VERSION = "2023-06-01"
MAX_TEXT = 400

SYSTEM_PROMPT = """You extract structured knowledge from summaries of AI agent sessions (episodes).
Return it only by calling the record_knowledge tool, one item per episode id you were given.
Entities: name, type (api, tool, agent, error, concept, project, client, or another short type
when none fits), attributes (a small JSON object). Facts (triples): source -> predicate -> target,
with the types of both ends. Predicates are short snake_case verbs: uses, depends_on, failed_with,
calls, rate_limit, delegates_to, learned_about, works_with, bypasses; invent a new one only when none
fits, and then say whether it is functional (one value at a time, like rate_limit or version).
Confidence: 0.9-1.0 for what the episode states outright, 0.6-0.7 for inferences. Do not invent
facts the episode does not support."""

_ENTITY_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "type": {"type": "string", "minLength": 1},
        "attributes": {"type": "object"},
    },
    "required": ["name", "type"],
}
_FACT_SCHEMA = {
    "type": "object",
    "properties": {
        "source": {"type": "string", "minLength": 1},
        "source_type": {"type": "string", "minLength": 1},
        "predicate": {"type": "string", "minLength": 1},
        "target": {"type": "string", "minLength": 1},
        "target_type": {"type": "string", "minLength": 1},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "functional": {"type": "boolean"},
    },
    "required": ["source", "source_type", "predicate", "target", "target_type", "confidence"],
}
INPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "episodes": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "episode_id": {"type": "string"},
                    "entities": {"type": "array", "items": _ENTITY_SCHEMA},
                    "facts": {"type": "array", "items": _FACT_SCHEMA},
                },
                "required": ["episode_id", "entities", "facts"],
            },
        }
    },
    "required": ["episodes"],
}


class _Fact(msgspec.Struct):
    source: str
    source_type: str
    predicate: str
    target: str
    target_type: str
    confidence: float
    functional: bool | None = None


class _Episode(msgspec.Struct):
    episode_id: str
    entities: list[EntityMention] = []
    facts: list[_Fact] = []


class _Answer(msgspec.Struct):
    episodes: list[_Episode]


@dataclass(frozen=True)
class LLMExtractorConfig:
    api_key: str | None = dataclasses.field(default=None, repr=False)
    base_url: str = "https://api.anthropic.com"
    model: str = "claude-haiku-4-5"
    max_tokens: int = 4096
    episodes_per_request: int = 8
    concurrency: int = 4
    cost_cap_usd: float = 1.0  # per run (per extractor instance)
    input_usd_per_mtok: float = 1.0  # the default model's list prices; override for another model
    output_usd_per_mtok: float = 5.0
    timeout_s: float = 60.0
    max_retries: int = 3
    backoff_s: float = 1.0

    @property
    def enabled(self) -> bool:
        return bool(self.api_key)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> LLMExtractorConfig:
        kw: dict[str, Any] = {"api_key": env.get("SOMNUS_LLM_API_KEY") or env.get("ANTHROPIC_API_KEY") or None}
        for field, var, kind in (
            ("base_url", "SOMNUS_LLM_BASE_URL", str),
            ("model", "SOMNUS_LLM_MODEL", str),
            ("cost_cap_usd", "SOMNUS_LLM_COST_CAP_USD", float),
            ("concurrency", "SOMNUS_LLM_CONCURRENCY", int),
            ("episodes_per_request", "SOMNUS_LLM_EPISODES_PER_REQUEST", int),
        ):
            if env.get(var):
                kw[field] = kind(env[var])
        return cls(**kw)


class RequestFailed(RuntimeError):
    """A request gave no usable answer (the message never includes the key)."""


@dataclass
class Counters:
    requests: int = 0
    retries: int = 0
    failures: int = 0
    fallbacks: int = 0
    invalid: int = 0
    cost_usd: float = 0.0


class AnthropicExtractor:
    def __init__(self, config: LLMExtractorConfig, fallback: Any = None) -> None:
        if not config.enabled:
            raise ValueError("the LLM extractor needs an API key (SOMNUS_LLM_API_KEY or ANTHROPIC_API_KEY)")
        self.config = config
        self.fallback = fallback
        self.name = f"llm/{config.model}"
        self.counters = Counters()

    def __repr__(self) -> str:
        return f"AnthropicExtractor(model={self.config.model!r}, base_url={self.config.base_url!r})"

    async def extract(self, episodes: Sequence[EpisodeDistilled]) -> list[FactsExtracted]:
        cfg = self.config
        chunks = [
            list(episodes[i : i + cfg.episodes_per_request]) for i in range(0, len(episodes), cfg.episodes_per_request)
        ]
        gate = asyncio.Semaphore(cfg.concurrency)
        timeout = aiohttp.ClientTimeout(total=cfg.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            results = await asyncio.gather(*(self._chunk(http, gate, c) for c in chunks))
        return [fx for chunk in results for fx in chunk]

    async def _chunk(
        self, http: aiohttp.ClientSession, gate: asyncio.Semaphore, episodes: list[EpisodeDistilled]
    ) -> list[FactsExtracted]:
        async with gate:
            if self.counters.cost_usd >= self.config.cost_cap_usd:
                return self._fall_back(episodes, "cost cap reached")
            try:
                answer = await self._request(http, episodes)
            except RequestFailed as exc:
                self.counters.failures += 1
                return self._fall_back(episodes, str(exc))
        by_id = {e.episode_id: e for e in answer.episodes}
        out = []
        for ep in episodes:
            got = by_id.get(str(ep.episode_id))
            if got is None:
                out.extend(self._fall_back([ep], "no answer for this episode"))
                continue
            out.append(
                FactsExtracted(
                    schema_version=FACTS_SCHEMA_VERSION,
                    episode_id=ep.episode_id,
                    agent=ep.agent,
                    observed_at=ep.ended_at,
                    extractor=self.name,
                    entities=got.entities,
                    facts=[
                        FactAsserted(
                            source=f.source,
                            source_type=f.source_type,
                            predicate=f.predicate,
                            target=f.target,
                            target_type=f.target_type,
                            confidence=min(1.0, max(0.0, f.confidence)),
                            functional=f.functional,
                        )
                        for f in got.facts
                    ],
                )
            )
        return out

    def _fall_back(self, episodes: list[EpisodeDistilled], why: str) -> list[FactsExtracted]:
        self.counters.fallbacks += len(episodes)
        log.warning("LLM extraction of %d episode(s) fell back: %s", len(episodes), why)
        if self.fallback is not None:
            return list(self.fallback.extract(episodes))
        return [
            FactsExtracted(
                schema_version=FACTS_SCHEMA_VERSION,
                episode_id=ep.episode_id,
                agent=ep.agent,
                observed_at=ep.ended_at,
                extractor=self.name,
            )
            for ep in episodes
        ]

    def _body(self, episodes: list[EpisodeDistilled]) -> dict[str, Any]:
        items = [
            {
                "episode_id": str(ep.episode_id),
                "agent": ep.agent,
                "task": ep.task[:MAX_TEXT],
                "summary": ep.summary[:MAX_TEXT],
                "outcome": ep.outcome.value,
                "tools": ep.tools,
                "errors": [msgspec.to_builtins(e) for e in ep.errors[:20]],
                "lessons": [lesson.text[:MAX_TEXT] for lesson in ep.lessons[:10]],
                "delegations": [msgspec.to_builtins(d) for d in ep.delegations[:10]],
                "metadata": ep.metadata,
            }
            for ep in episodes
        ]
        return {
            "model": self.config.model,
            "max_tokens": self.config.max_tokens,
            "system": SYSTEM_PROMPT,
            "tools": [
                {
                    "name": TOOL_NAME,
                    "description": "Record the entities and facts of each episode.",
                    "input_schema": INPUT_SCHEMA,
                }
            ],
            "tool_choice": {"type": "tool", "name": TOOL_NAME},
            "messages": [{"role": "user", "content": msgspec.json.encode({"episodes": items}).decode()}],
        }

    async def _request(self, http: aiohttp.ClientSession, episodes: list[EpisodeDistilled]) -> _Answer:
        cfg = self.config
        headers = {
            "x-api-key": cfg.api_key or "",
            "anthropic-version": ANTHROPIC_VERSION,
            "content-type": "application/json",
        }
        body = self._body(episodes)
        for attempt in range(cfg.max_retries + 1):
            self.counters.requests += 1
            try:
                async with http.post(f"{cfg.base_url}/v1/messages", json=body, headers=headers) as resp:
                    status = resp.status
                    retry_after = resp.headers.get("retry-after")
                    raw = await resp.read()
            except (TimeoutError, aiohttp.ClientError) as exc:
                status, retry_after, raw = 0, None, type(exc).__name__.encode()
            if status == 200:
                return self._parse(raw)
            if status in (0, 429, 500, 502, 503, 504, 529) and attempt < cfg.max_retries:
                self.counters.retries += 1
                delay = cfg.backoff_s * 2**attempt
                if retry_after and retry_after.replace(".", "", 1).isdigit():
                    delay = float(retry_after)
                await asyncio.sleep(delay)
                continue
            raise RequestFailed(f"HTTP {status}: {raw[:200].decode(errors='replace')}")
        raise RequestFailed("retries exhausted")  # pragma: no cover - the loop returns or raises

    def _parse(self, raw: bytes) -> _Answer:
        try:
            msg = msgspec.json.decode(raw)
            usage = msg.get("usage") or {}
            self.counters.cost_usd += (
                usage.get("input_tokens", 0) * self.config.input_usd_per_mtok
                + usage.get("output_tokens", 0) * self.config.output_usd_per_mtok
            ) / 1e6
            block = next(b for b in msg["content"] if b.get("type") == "tool_use" and b.get("name") == TOOL_NAME)
            return msgspec.convert(block["input"], _Answer)
        except (
            msgspec.DecodeError,
            msgspec.ValidationError,
            StopIteration,
            KeyError,
            TypeError,
            AttributeError,
        ) as exc:
            self.counters.invalid += 1
            raise RequestFailed(f"invalid answer: {type(exc).__name__}: {str(exc)[:200]}") from None
