"""A generator of realistic synthetic agent traces, seeded so runs are reproducible.

Six agents in two teams (see ``somnus/data/agents``) working as a real fleet does:

- **Time.** Sessions spread over ``days`` calendar days (four weeks by default) from ``START`` (a
  Monday, 07:00 UTC): on weekdays mostly in working hours (07-19 UTC, busiest late morning and
  mid-afternoon), on weekends a trickle. ``sessions`` sessions fill those days; with ``events``
  instead, the days hold about ``events / MEAN_EVENTS_PER_SESSION`` sessions, and further blocks
  of ``days`` follow if more are needed.
- **Tasks.** Each agent has a few recurring kinds of task (``TASK_KINDS``), each done with the same
  tool sequence when it goes well, so successful sequences repeat (the briefing's strategies).
  Every sequence follows one global order of tools (``TOOL_ORDER``, checked by the tests): a tool
  never both comes before and after another, so "b depends_on a" never has its reverse.
- **Errors that belong to their tools** (``TOOL_KIND``, ``TRANSIENT``): an HTTP tool gets HTTP
  statuses and timeouts, a shell tool exit codes and missing binaries, a parser selector errors, a
  model call context-length errors. Transient ones usually go away on a retry.
- **Recurring environment faults** (``FAULTS``), a few per agent, each in a window of days: a
  binary missing on the deploy runner, an expired payment API key, a flaky reader endpoint that is
  worse in the afternoon, a token lacking a scope, a runbook that does not exist, a pricing page
  whose layout changed, a CRM degrading week by week, a model provider overloaded in the afternoon.
  They recur until fixed: what a memory should learn. With several blocks of ``days`` (an
  ``events`` run), every block follows the same calendar of faults and rate limits.
- **Rate limits that change rarely** (``RATE_LIMITS``): each API has one limit (headers
  ``X-RateLimit-Limit``/``-Window`` and a fixed ``Retry-After``); one changes once, mid-way. A 429
  is always resolved by waiting and retrying.
- Delegations from leads to their reports, successes, partial results and failures.

>>> a = list(generate(sessions=3, seed=7)); b = list(generate(sessions=3, seed=7))
>>> a == b and a[0]["type"] == "session_start"
True
"""

from __future__ import annotations

import bisect
import math
import random
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from somnus.schemas.events import SCHEMA_VERSION

SAMPLE_NAMESPACE = uuid.UUID("a3c1f0de-2b7e-4d51-8c9a-1e0f5b6d7c82")
START = datetime(2026, 1, 5, 7, 0, tzinfo=timezone.utc)  # a Monday
DAYS = 28
ARRIVAL_SKEW = timedelta(minutes=10)  # how far out of time order the fleet's events arrive at most
MEAN_EVENTS_PER_SESSION = 9  # measured on the default fleet (8.6); sizes the days of an ``events`` run

TEAMS: dict[str, list[str]] = {
    "research-lead": ["researcher", "scraper"],
    "ops-lead": ["deployer", "support"],
}
AGENT_WEIGHT = {
    "research-lead": 1.0,
    "researcher": 2.0,
    "scraper": 2.0,
    "ops-lead": 1.0,
    "deployer": 1.5,
    "support": 2.5,
}

# Every task's tool sequence follows this order, so no two tools depend on each other both ways.
TOOL_ORDER = [
    "plan",
    "read_runbook",
    "crm_lookup",
    "web_search",
    "http_get",
    "parse_html",
    "summarize",
    "shell",
    "run_tests",
    "http_post",
    "send_email",
]
TOOL_KIND = {
    "plan": "model",
    "summarize": "model",
    "web_search": "http",
    "http_get": "http",
    "http_post": "http",
    "crm_lookup": "http",
    "parse_html": "parser",
    "shell": "shell",
    "run_tests": "shell",
    "read_runbook": "file",
    "send_email": "smtp",
}
# (error, http_status or None, chance a retry clears it) per kind of tool
TRANSIENT: dict[str, list[tuple[str, int | None, float]]] = {
    "http": [
        ("HTTP 502 Bad Gateway", 502, 0.9),
        ("HTTP 503 Service Unavailable", 503, 0.8),
        ("ConnectionTimeout: read timed out after 30s", None, 0.7),
    ],
    "shell": [("exit status 1: error: timed out waiting for the condition", None, 0.6)],
    "parser": [("UnicodeDecodeError: 'utf-8' codec can't decode byte 0xe9 in position 1041", None, 0.0)],
    "model": [("ContextLengthError: 131072 tokens exceed the 128000-token limit", None, 0.9)],
    "file": [("PermissionError: runbooks are being synced, try again", None, 0.9)],
    "smtp": [("SMTPServerDisconnected: connection unexpectedly closed", None, 0.9)],
}
TRANSIENT_RATE = 0.04  # chance a call meets a transient error of its kind


@dataclass(frozen=True)
class Step:
    tool: str
    args: dict[str, Any]


@dataclass(frozen=True)
class TaskKind:
    agent: str
    text: str  # with {n}: an id, so the kind (briefing.task_kind) stays the same
    steps: tuple[Step, ...]
    goal: str  # what the kind of task is for: the same for every task of the kind


def _s(tool: str, **args: Any) -> Step:
    return Step(tool, args)


TASK_KINDS: list[TaskKind] = [
    TaskKind(
        "research-lead",
        "compile the competitor pricing report {n}",
        (_s("plan", steps=3), _s("web_search", q="competitor pricing 2026"), _s("summarize", max_words=300)),
        "keep leadership's view of competitor pricing current",
    ),
    TaskKind(
        "research-lead",
        "plan the vendor review for quarter {n}",
        (_s("plan", steps=4), _s("web_search", q="vendor review checklist")),
        "renew only vendors that earn it",
    ),
    TaskKind(
        "researcher",
        "find the pagination rules of the leads api {n}",
        (
            _s("web_search", q="instantly api pagination"),
            _s("http_get", url="https://api.instantly.ai/v1/leads?page=2"),
            _s("summarize", max_words=120),
        ),
        "document the APIs the team integrates with",
    ),
    TaskKind(
        "researcher",
        "summarise the pricing page of vendor {n}",
        (_s("http_get", url="https://r.jina.ai/https://example.com/pricing"), _s("summarize", max_words=200)),
        "track vendor pricing",
    ),
    TaskKind(
        "scraper",
        "collect open issues from tracker page {n}",
        (
            _s("http_get", url="https://api.github.com/repos/acme/app/issues?page=1"),
            _s("parse_html", selector="div.issue"),
        ),
        "keep the issue digest current",
    ),
    TaskKind(
        "scraper",
        "extract the pricing table of site {n}",
        (_s("http_get", url="https://www.example.com/pricing"), _s("parse_html", selector="table.pricing")),
        "track vendor pricing",
    ),
    TaskKind(
        "ops-lead",
        "ship release {n} to production",
        (_s("plan", steps=2), _s("read_runbook", name="deploy")),
        "ship weekly without downtime",
    ),
    TaskKind(
        "ops-lead",
        "triage the failed nightly build {n}",
        (_s("read_runbook", name="rollback"),),
        "keep the nightly build green",
    ),
    TaskKind(
        "deployer",
        "roll out web release {n}",
        (_s("shell", cmd="helm upgrade web ./chart"), _s("run_tests", suite="smoke")),
        "ship weekly without downtime",
    ),
    TaskKind(
        "deployer",
        "run the smoke suite after deploy {n}",
        (_s("shell", cmd="kubectl rollout status deploy/web"), _s("run_tests", suite="smoke")),
        "ship weekly without downtime",
    ),
    TaskKind(
        "support",
        "refund order {n} and tell the customer",
        (
            _s("crm_lookup", customer="acme"),
            _s("http_post", url="https://api.stripe.com/v1/refunds"),
            _s("send_email", to="billing@acme.test"),
        ),
        "resolve billing requests the same day",
    ),
    TaskKind(
        "support",
        "answer the customer escalation {n}",
        (_s("crm_lookup", customer="globex"), _s("send_email", to="ops@globex.test")),
        "answer every escalation within four hours",
    ),
]
AGENT_TOOLS: dict[str, list[tuple[str, dict[str, Any]]]] = {}
TASKS: dict[str, list[str]] = {}
for _k in TASK_KINDS:
    AGENT_TOOLS.setdefault(_k.agent, []).extend((s.tool, s.args) for s in _k.steps)
    TASKS.setdefault(_k.agent, []).append(_k.text.replace("{n}", "1042"))


@dataclass(frozen=True)
class RateLimit:
    limit: str  # X-RateLimit-Limit
    window: str  # X-RateLimit-Window
    retry_after: int  # seconds
    chance: float  # of a 429 on a call


# host -> (from day, limit): one API's limit changes once, mid-way
RATE_LIMITS: dict[str, list[tuple[int, RateLimit]]] = {
    "api.instantly.ai": [(0, RateLimit("10", "1s", 2, 0.15)), (17, RateLimit("5", "1s", 5, 0.2))],
    "api.github.com": [(0, RateLimit("5000", "1h", 60, 0.05))],
    "r.jina.ai": [(0, RateLimit("20", "1m", 3, 0.08))],
    "api.stripe.com": [(0, RateLimit("100", "1s", 1, 0.03))],
}


@dataclass(frozen=True)
class Fault:
    """A recurring environment fault: from ``first_day`` until ``last_day`` (inclusive; days since
    START), a call of ``tool`` whose args contain ``match`` fails with ``error`` with chance
    ``chance(day, hour)`` (UTC hour); a retry clears it with ``retry_clears``."""

    agent: str
    tool: str
    match: str
    error: str
    http_status: int | None
    first_day: int
    last_day: int
    chance: Callable[[int, float], float]
    retry_clears: float = 0.0


FAULTS: list[Fault] = [
    Fault("deployer", "shell", "helm", "bash: helm: command not found", None, 3, 12, lambda d, h: 1.0),
    Fault("support", "http_post", "stripe", "HTTP 401 Unauthorized: API key expired", 401, 9, 16, lambda d, h: 1.0),
    # worse in the (UTC) afternoon, when the reader's free tier is busiest
    Fault(
        "researcher",
        "http_get",
        "r.jina.ai",
        "ConnectionTimeout: r.jina.ai read timed out after 30s",
        None,
        0,
        10_000,
        lambda d, h: 0.15 + 0.45 * max(0.0, math.cos(2 * math.pi * (h - 16) / 24)),
        retry_clears=0.6,
    ),
    # the model provider both research agents use is overloaded in the US afternoon
    *(
        Fault(
            agent,
            "summarize",
            "",
            "OverloadedError: the model is overloaded, try again later",
            None,
            0,
            10_000,
            lambda d, h: 0.05 + 0.8 * max(0.0, math.cos(2 * math.pi * (h - 17) / 24)),
            retry_clears=0.3,
        )
        for agent in ("research-lead", "researcher")
    ),
    # the CRM degrades week by week until its migration
    Fault(
        "support",
        "crm_lookup",
        "",
        "HTTP 504 Gateway Timeout: crm.internal did not answer",
        504,
        0,
        10_000,
        lambda d, h: min(0.9, 0.035 * d),
        retry_clears=0.2,
    ),
    Fault(
        "scraper",
        "http_get",
        "acme/app/issues",
        "HTTP 403 Forbidden: token lacks scope repo:read",
        403,
        0,
        10_000,
        lambda d, h: 0.3,
    ),
    Fault(
        "scraper",
        "parse_html",
        "table.pricing",
        "ValueError: selector 'table.pricing' matched no elements",
        None,
        18,
        10_000,
        lambda d, h: 0.85,
    ),
    Fault(
        "ops-lead",
        "read_runbook",
        "rollback",
        "FileNotFoundError: runbooks/rollback.md",
        None,
        0,
        10_000,
        lambda d, h: 1.0,
    ),
]


def _hour_weight(weekday: int, hour: int) -> float:
    """How busy an hour is: weekdays 07-19 UTC with a late-morning and a mid-afternoon peak; nights and
    weekends a trickle."""
    if 7 <= hour < 19:
        w = 0.6 + math.exp(-((hour - 10.5) ** 2) / 4) + 0.8 * math.exp(-((hour - 15) ** 2) / 4)
    else:
        w = 0.03
    return w * (0.08 if weekday >= 5 else 1.0)


def session_times(rng: random.Random, n: int, start: datetime = START, days: int = DAYS) -> list[datetime]:
    """``n`` session start times over ``days`` days from ``start`` following ``_hour_weight``, sorted;
    the first is ``start`` itself."""
    base = start.replace(hour=0, minute=0, second=0, microsecond=0)
    slots = [(d, h) for d in range(days) for h in range(24) if base + timedelta(days=d, hours=h + 1) > start]
    cum: list[float] = []
    total = 0.0
    for d, h in slots:
        total += _hour_weight((base + timedelta(days=d)).weekday(), h)
        cum.append(total)
    out = []
    for _ in range(n):
        d, h = slots[bisect.bisect_right(cum, rng.random() * total)]
        out.append(max(start, base + timedelta(days=d, hours=h, seconds=rng.uniform(0, 3600))))
    out.sort()
    if out:
        out[0] = start
    return out


class _Writer:
    def __init__(self, rng: random.Random, agent: str, session_id: str, t: datetime) -> None:
        self.rng, self.agent, self.session_id, self.t = rng, agent, session_id, t
        self.events: list[dict[str, Any]] = []

    def add(self, type_: str, payload: dict[str, Any], dt: float | None = None) -> None:
        seq = len(self.events)
        self.events.append(
            {
                "event_id": str(uuid.uuid5(SAMPLE_NAMESPACE, f"{self.session_id}/{seq}")),
                "schema_version": SCHEMA_VERSION,
                "ts": self.t.isoformat().replace("+00:00", "Z"),
                "agent": self.agent,
                "session_id": self.session_id,
                "seq": seq,
                "type": type_,
                "payload": payload,
            }
        )
        self.t += timedelta(seconds=dt if dt is not None else self.rng.uniform(0.5, 20))


def _host(args: dict[str, Any]) -> str | None:
    url = str(args.get("url", ""))
    return url.split("/")[2] if url.startswith("http") else None


def _rate_limit(host: str | None, day: int) -> RateLimit | None:
    if host is None or host not in RATE_LIMITS:
        return None
    return [rl for first, rl in RATE_LIMITS[host] if first <= day][-1]


def _fault(agent: str, step: Step, day: int) -> Fault | None:
    text = " ".join(str(v) for v in step.args.values())
    return next(
        (
            f
            for f in FAULTS
            if f.agent == agent and f.tool == step.tool and f.match in text and f.first_day <= day <= f.last_day
        ),
        None,
    )


def _result(
    w: _Writer,
    call: str,
    tool: str,
    ok: bool,
    error: str | None = None,
    status: int | None = None,
    headers: dict[str, str] | None = None,
    dt: float | None = None,
) -> None:
    payload: dict[str, Any] = {"call_id": call, "tool": tool, "ok": ok}
    if ok:
        payload.update(output=f"{tool} ok", latency_ms=round(w.rng.uniform(20, 900), 1))
        if status:
            payload["http_status"] = status
    else:
        payload.update(error=error, latency_ms=round(w.rng.uniform(10, 3000), 1))
        if status:
            payload["http_status"] = status
    if headers:
        payload["headers"] = headers
    w.add("tool_result", payload, dt)


def _run_step(w: _Writer, step: Step, index: int, day: int) -> bool:
    """One step: its call and result, with retries; True when it ended ok."""
    call = f"c{index}"
    w.add("tool_call", {"tool": step.tool, "call_id": call, "args": step.args}, dt=w.rng.uniform(0.05, 0.5))
    host = _host(step.args)
    rl = _rate_limit(host, day)
    http = TOOL_KIND[step.tool] == "http"
    limit_headers = {"X-RateLimit-Limit": rl.limit, "X-RateLimit-Window": rl.window} if rl else None
    if rl and w.rng.random() < rl.chance:  # rate limited: wait Retry-After and retry; that retry works
        for k in range(w.rng.choice([1, 1, 2])):
            _result(
                w,
                call,
                step.tool,
                False,
                "Too Many Requests",
                429,
                {**(limit_headers or {}), "Retry-After": str(rl.retry_after)},
                dt=float(rl.retry_after),
            )
            call = f"c{index}r{k}"
            w.add("tool_call", {"tool": step.tool, "call_id": call, "args": step.args}, dt=0.1)
        _result(w, call, step.tool, True, status=200, headers=limit_headers)
        return True
    hour = (w.t - w.t.replace(hour=0, minute=0, second=0, microsecond=0)).total_seconds() / 3600
    fault = _fault(w.agent, step, day)
    failure: tuple[str, int | None, float] | None = None
    if fault is not None and w.rng.random() < fault.chance(day, hour):
        failure = (fault.error, fault.http_status, fault.retry_clears)
    elif w.rng.random() < TRANSIENT_RATE:
        failure = w.rng.choice(TRANSIENT[TOOL_KIND[step.tool]])
    if failure is None:
        _result(w, call, step.tool, True, status=200 if http else None, headers=limit_headers)
        return True
    error, status, clears = failure
    _result(w, call, step.tool, False, error, status)
    if clears > 0 and w.rng.random() < 0.8:  # the agent retries once
        call = f"c{index}x"
        w.add("tool_call", {"tool": step.tool, "call_id": call, "args": step.args}, dt=w.rng.uniform(2, 10))
        if w.rng.random() < clears:
            _result(w, call, step.tool, True, status=200 if http else None, headers=limit_headers)
            return True
        _result(w, call, step.tool, False, error, status)
    return False


def _session(rng: random.Random, index: int, t: datetime, seed: int = 0, day: int = 0) -> list[dict[str, Any]]:
    """One session starting at ``t``, on ``day`` of the faults' and rate limits' calendar."""
    agents = list(AGENT_WEIGHT)
    agent = rng.choices(agents, weights=[AGENT_WEIGHT[a] for a in agents])[0]
    kind = rng.choice([k for k in TASK_KINDS if k.agent == agent])
    w = _Writer(rng, agent, f"s{seed}-{index:07d}-{agent}", t)  # two seeds never share a session
    task = kind.text.format(n=rng.randint(1000, 9999))
    w.add(
        "session_start",
        {
            "task": task,
            "goal": kind.goal,
            "metadata": {
                "project": rng.choice(["atlas", "borealis"]),
                "client": rng.choice(["acme", "globex", "initech"]),
            },
        },
    )
    w.add("user_message", {"text": f"Please {task}."})
    failed = False
    for i, step in enumerate(kind.steps):
        if not _run_step(w, step, i, day):
            failed = True
            break
    if agent in TEAMS and not failed and rng.random() < 0.5:
        to = rng.choice(TEAMS[agent])
        sub = rng.choice([k for k in TASK_KINDS if k.agent == to]).text.format(n=rng.randint(1000, 9999))
        w.add("delegation", {"to_agent": to, "task": sub, "delegation_id": f"d{index}"})
        outcome = "success" if rng.random() < 0.8 else "failure"
        w.add(
            "delegation_result",
            {"to_agent": to, "outcome": outcome, "delegation_id": f"d{index}"},
            dt=rng.uniform(30, 600),
        )
        failed = outcome == "failure"
    w.add("agent_message", {"text": "Done." if not failed else "I could not finish this."})
    outcome = "failure" if failed else ("partial" if rng.random() < 0.05 else "success")
    w.add("session_end", {"outcome": outcome})
    return w.events


def _ts(event: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(event["ts"].replace("Z", "+00:00"))


def generate(
    sessions: int | None = None, events: int | None = None, seed: int = 42, interleave: int = 8, days: int = DAYS
) -> Iterator[dict[str, Any]]:
    """Yield events of ``sessions`` sessions (or until at least ``events`` events), sessions interleaved.

    Sessions start over ``days`` days from ``START`` (``session_times``); with ``events``, blocks of
    ``days`` holding about ``events / MEAN_EVENTS_PER_SESSION`` sessions each, as many as needed. Up
    to ``interleave`` sessions are in flight at once, their events mixed as a fleet's publishers mix
    them, but never more than ``ARRIVAL_SKEW`` out of time order: a session starts once the fleet's
    events reach its start, and an event is sent only when no pending event is older by more than
    that (sessions that overlap in time mix; yesterday's never arrive after today's). Within a
    session events keep their order.
    """
    if sessions is None and events is None:
        raise ValueError("give sessions or events")
    rng = random.Random(seed)
    per_block = sessions if sessions is not None else max(1, math.ceil((events or 0) / MEAN_EVENTS_PER_SESSION))
    produced = 0
    index = 0
    block = 0
    times: list[datetime] = []
    open_: list[tuple[list[dict[str, Any]], list[datetime]]] = []  # each session's events and their times

    def more() -> bool:
        return (sessions is None or index < sessions) and (events is None or produced < events)

    def next_start() -> datetime:
        nonlocal times, block
        if not times:
            times = session_times(rng, per_block, START + timedelta(days=block * days), days)[::-1]
            block += 1
        return times[-1]

    while more() or open_:
        oldest = min((ts[0] for _, ts in open_), default=None)
        while more() and len(open_) < interleave and (oldest is None or next_start() <= oldest + ARRIVAL_SKEW):
            at = next_start()
            times.pop()
            evs = _session(rng, index, at, seed, (at - START).days % days)  # each block of days tells the same story
            produced += len(evs)
            open_.append((evs, [_ts(e) for e in evs]))
            index += 1
            oldest = at if oldest is None else min(oldest, at)
        assert oldest is not None
        ready = [i for i, (_, ts) in enumerate(open_) if ts[0] <= oldest + ARRIVAL_SKEW]
        i = ready[rng.randrange(len(ready))]
        evs, ts = open_[i]
        yield evs.pop(0)
        ts.pop(0)
        if not evs:
            open_.pop(i)
