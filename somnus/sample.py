"""A generator of realistic synthetic agent traces, seeded so runs are reproducible.

Several agents in two teams (see ``somnus/data/agents``): tool calls against APIs and shells,
429s resolved by exponential backoff, errors that are never resolved, delegations from leads to
their reports, successes, partial results and failures. The benchmarks use it too.

>>> a = list(generate(sessions=3, seed=7)); b = list(generate(sessions=3, seed=7))
>>> a == b and a[0]["type"] == "session_start"
True
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

from schemas.events import SCHEMA_VERSION

SAMPLE_NAMESPACE = uuid.UUID("a3c1f0de-2b7e-4d51-8c9a-1e0f5b6d7c82")
START = datetime(2026, 1, 5, 7, 0, tzinfo=timezone.utc)

TEAMS: dict[str, list[str]] = {
    "research-lead": ["researcher", "scraper"],
    "ops-lead": ["deployer", "support"],
}
AGENT_TOOLS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "research-lead": [("plan", {"steps": 3}), ("web_search", {"q": "vendor pricing"})],
    "researcher": [("web_search", {"q": "rate limits of the instantly api"}),
                   ("http_get", {"url": "https://api.instantly.ai/v1/leads?page=2"}),
                   ("http_get", {"url": "https://r.jina.ai/https://example.com/pricing"}),
                   ("summarize", {"max_words": 120})],
    "scraper": [("http_get", {"url": "https://api.github.com/repos/acme/app/issues?page=1"}),
                ("http_get", {"url": "https://news.ycombinator.com/item?id=123"}),
                ("parse_html", {"selector": "table.pricing"})],
    "ops-lead": [("plan", {"steps": 2}), ("read_runbook", {"name": "deploy"})],
    "deployer": [("shell", {"cmd": "kubectl rollout status deploy/web"}),
                 ("shell", {"cmd": "helm upgrade web ./chart"}),
                 ("run_tests", {"suite": "smoke"})],
    "support": [("crm_lookup", {"customer": "acme"}), ("send_email", {"to": "ops@acme.test"}),
                ("http_post", {"url": "https://api.stripe.com/v1/refunds"})],
}
TASKS: dict[str, list[str]] = {
    "research-lead": ["compile a competitor pricing report", "plan the Q3 vendor review"],
    "researcher": ["find the pagination rules of the Instantly API", "summarise pricing pages"],
    "scraper": ["collect open issues from the tracker", "extract the pricing table"],
    "ops-lead": ["ship release 2.4 to production", "triage the failed nightly"],
    "deployer": ["roll out web 2.4", "run the smoke suite after deploy"],
    "support": ["refund order 1042", "answer the acme escalation"],
}
UNRESOLVED = [
    (500, "HTTP 500 Internal Server Error"),
    (None, "ConnectionTimeout: read timed out after 30s"),
    (None, "bash: helm: command not found"),
    (403, "HTTP 403 Forbidden: token lacks scope repo:read"),
    (None, "ValueError: selector matched no elements"),
]


class _Writer:
    def __init__(self, rng: random.Random, agent: str, session_id: str, t: datetime) -> None:
        self.rng, self.agent, self.session_id, self.t = rng, agent, session_id, t
        self.events: list[dict[str, Any]] = []

    def add(self, type_: str, payload: dict[str, Any], dt: float | None = None) -> None:
        seq = len(self.events)
        self.events.append({
            "event_id": str(uuid.uuid5(SAMPLE_NAMESPACE, f"{self.session_id}/{seq}")),
            "schema_version": SCHEMA_VERSION, "ts": self.t.isoformat().replace("+00:00", "Z"),
            "agent": self.agent, "session_id": self.session_id, "seq": seq, "type": type_, "payload": payload})
        self.t += timedelta(seconds=dt if dt is not None else self.rng.uniform(0.5, 20))


def _session(rng: random.Random, index: int, t: datetime) -> list[dict[str, Any]]:
    agents = list(AGENT_TOOLS)
    agent = agents[rng.randrange(len(agents))]
    w = _Writer(rng, agent, f"s{index:07d}-{agent}", t)
    task = rng.choice(TASKS[agent])
    w.add("session_start", {"task": task, "goal": f"{task} by end of day",
                            "metadata": {"project": rng.choice(["atlas", "borealis"]),
                                         "client": rng.choice(["acme", "globex", "initech"])}})
    w.add("user_message", {"text": f"Please {task}."})
    failed = False
    steps = rng.randint(2, 6)
    for step in range(steps):
        tool, args = rng.choice(AGENT_TOOLS[agent])
        call = f"c{step}"
        w.add("tool_call", {"tool": tool, "call_id": call, "args": args}, dt=rng.uniform(0.05, 0.5))
        roll = rng.random()
        if roll < 0.12 and tool.startswith("http"):
            # rate limited; back off exponentially until it works
            tries = rng.randint(1, 3)
            for k in range(tries):
                w.add("tool_result", {"call_id": call, "tool": tool, "ok": False, "http_status": 429,
                                      "error": "Too Many Requests", "headers": {"Retry-After": str(2 ** k)},
                                      "latency_ms": 80.0}, dt=2.0 ** k)
                call = f"c{step}r{k}"
                w.add("tool_call", {"tool": tool, "call_id": call, "args": args}, dt=0.1)
            w.add("tool_result", {"call_id": call, "tool": tool, "ok": True, "http_status": 200,
                                  "latency_ms": round(rng.uniform(50, 400), 1), "output": "200 OK"})
        elif roll < 0.20:
            status, error = rng.choice(UNRESOLVED)
            w.add("tool_result", {"call_id": call, "tool": tool, "ok": False, "error": error,
                                  **({"http_status": status} if status else {}),
                                  "latency_ms": round(rng.uniform(10, 3000), 1)})
            failed = True
            break
        else:
            w.add("tool_result", {"call_id": call, "tool": tool, "ok": True,
                                  "latency_ms": round(rng.uniform(5, 900), 1), "output": f"{tool} ok"})
    if agent in TEAMS and rng.random() < 0.5:
        to = rng.choice(TEAMS[agent])
        w.add("delegation", {"to_agent": to, "task": rng.choice(TASKS[to]), "delegation_id": f"d{index}"})
        outcome = "success" if rng.random() < 0.75 else "failure"
        w.add("delegation_result", {"to_agent": to, "outcome": outcome, "delegation_id": f"d{index}"},
              dt=rng.uniform(30, 600))
        failed = failed or outcome == "failure"
    w.add("agent_message", {"text": "Done." if not failed else "I could not finish this."})
    outcome = "failure" if failed else ("partial" if rng.random() < 0.08 else "success")
    w.add("session_end", {"outcome": outcome})
    return w.events


def generate(sessions: int | None = None, events: int | None = None, seed: int = 42,
             interleave: int = 8) -> Iterator[dict[str, Any]]:
    """Yield events of ``sessions`` sessions (or until at least ``events`` events), sessions interleaved.

    Up to ``interleave`` sessions run at once, as in a real fleet; within a session events keep
    their order.
    """
    if sessions is None and events is None:
        raise ValueError("give sessions or events")
    rng = random.Random(seed)
    t = START
    produced = 0
    index = 0
    open_: list[list[dict[str, Any]]] = []

    def more() -> bool:
        return (sessions is None or index < sessions) and (events is None or produced < events)

    while more() or open_:
        while more() and len(open_) < interleave:
            evs = _session(rng, index, t)
            produced += len(evs)
            open_.append(evs)
            index += 1
            t += timedelta(seconds=rng.uniform(5, 90))
        i = rng.randrange(len(open_))
        yield open_[i].pop(0)
        if not open_[i]:
            open_.pop(i)
