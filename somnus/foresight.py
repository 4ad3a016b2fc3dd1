"""Foresight: would the briefing an agent gets before a session have warned it of the errors it then met?

Two parts, kept apart:

1. **Scoring** (``score``): pure, no I/O, no clock. Given the sessions (who, when, which tools they called,
   which calls failed with what) and the briefing each agent was given right before each of its
   sessions, it counts (docs/foresight.md has the definitions and a worked example):

   - ``learnable``: failed calls whose (tool, error class) already failed in an earlier session (one
     that ended before this one started) of the same agent or of an agent sharing a team scope of its
     scope chain (``peer_agents``; ``global`` is left out: every agent reads it, so it would make
     every other agent's past count);
   - ``foretold``: learnable calls whose tool and error class one line of the briefing named, in a
     lesson or in Key Knowledge; ``foresight`` = foretold / learnable, overall and for each agent's
     first ``FIRST_SESSIONS`` sessions against the rest (``foresight_by_session_index``);
   - ``relevance``: the share of briefing lines whose subject (a tool, an error class, or an entity of
     a fact shown) the session then touched: called the tool, met the error class, or named the entity;
   - ``duplicate_lines``: lines that share a (tool, error class) pair, an error class (when one of
     the two names no tool) or a shown fact with another line of the same briefing;
   - ``chars``: the median and 95th percentile (nearest rank) of the briefings' length against
     ``briefingTokenBudget``.

   An error's class is the knowledge graph's (``somnus.processors.knowledge.extraction.error_class``: ids, numbers,
   paths and line numbers become placeholders); names are compared in the graph's form
   (``normalise_name``: case-folded). What a briefing line names is read from its text
   (``line_subjects``), whatever the briefing's exact wording, so the instrument does not change when
   the briefing does.

2. **Replay** (``run_foresight``): the sessions' events are published in event-time order to a fresh
   pipeline (broker, worker, projector); right before a session's first event, once everything earlier
   is projected and the briefings refreshed (``somnus.reads.wait_idle``), the agent's briefing is read
   and injected for that session (as a runtime would, so serving is recorded). Nothing later is
   published before it. Everything the replay starts, it stops.

>>> from datetime import datetime, timezone
>>> t = lambda h: datetime(2024, 5, 15, h, tzinfo=timezone.utc)
>>> s1 = SessionSeen("s1", "bot", t(1), t(2), ("deploy",), (FailedCall("deploy", "bash: helm: command not found"),))
>>> s2 = SessionSeen("s2", "bot", t(3), t(4), ("deploy",), (FailedCall("deploy", "/bin/bash: line 9: helm: command not found"),))
>>> warned = BriefingSeen("- [failure] deploy failed with 'helm: command not found' (1 hour ago)", budget=2000,
...                       sections=(("lessons", ("- [failure] deploy failed with 'helm: command not found' (1 hour ago)",)),))
>>> r = score([s1, s2], {"s2": warned}, {"bot": frozenset({"bot"})})
>>> r["learnable"], r["foretold"], r["foresight"], r["relevance"]
(1, 1, 1.0, 1.0)
"""

from __future__ import annotations

import math
import re
import statistics
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from somnus import broker as broker_mod
from somnus.bench import isolated_pipeline
from somnus.client import Publisher
from somnus.config import Settings
from somnus.importers import FORMATS as IMPORTERS
from somnus.importers import ImportShapeError, expand_paths, import_files, import_run
from somnus.processors.briefing.generator import DEFAULT_BUDGET
from somnus.processors.knowledge.extraction import error_class
from somnus.processors.knowledge.triples import normalise_name
from somnus.reads import read, wait_idle
from somnus.schemas.agents import DEFAULT_DIR, load_agents, scope_chain
from somnus.schemas.facts import GLOBAL_SCOPE, team_scope

FIRST_SESSIONS = 10  # foresight_by_session_index: an agent's first sessions against the rest
MIN_CUT_PREFIX = 40  # a line cut short ("…") names a class when at least this much of it survived
LESSON, FACT, STRATEGY, OTHER = "lesson", "fact", "strategy", "other"


# ---- inputs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FailedCall:
    tool: str
    error: str  # the error text as the tool gave it (classed here)


@dataclass(frozen=True)
class SessionSeen:
    """One session as the scorer needs it. ``text``: everything it said or was told (task, messages,
    arguments, results), where an entity counts as named."""

    session_id: str
    agent: str
    started_at: datetime
    ended_at: datetime
    tools: tuple[str, ...] = ()  # tools called
    failures: tuple[FailedCall, ...] = ()
    text: str = ""


@dataclass(frozen=True)
class BriefingSeen:
    """The briefing given before one session: its Markdown, its budget, its bullet lines per section
    (``briefing_sections``; derived from the Markdown when not given) and the facts it showed, as
    (source, predicate, target) entity names."""

    markdown: str
    budget: int
    sections: tuple[tuple[str, tuple[str, ...]], ...] | None = None
    facts: tuple[tuple[str, str, str], ...] = ()
    generated_at: datetime | None = None  # the event time it was rendered as of (the replay's check)


# ---- reading a briefing ------------------------------------------------------------------------


def briefing_sections(markdown: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The bullet lines (``- ...``) of each ``###`` section, in order.

    >>> briefing_sections("## Session Briefing for a\\n\\n### Recent Lessons\\n- one\\n- two\\n\\n### Key Knowledge\\n- three\\n")
    (('Recent Lessons', ('- one', '- two')), ('Key Knowledge', ('- three',)))
    """
    out: list[tuple[str, list[str]]] = []
    for line in markdown.splitlines():
        if line.startswith("### "):
            out.append((line[4:].strip(), []))
        elif line.startswith("- ") and out:
            out[-1][1].append(line)
    return tuple((title, tuple(lines)) for title, lines in out)


def line_kind(section: str) -> str:
    """``lesson``, ``fact`` (Key Knowledge: facts and concepts), ``strategy`` or ``other``, by the section's title."""
    title = section.casefold()
    if "lesson" in title:
        return LESSON
    if "knowledge" in title or "fact" in title:
        return FACT
    if "strateg" in title:
        return STRATEGY
    return OTHER


@dataclass(frozen=True)
class Vocabulary:
    """The names a line can be about: tools and error classes (keys in ``normalise_name`` form) seen in
    the sessions, entity names of the facts shown. Built once per scoring."""

    tools: frozenset[str]
    classes: frozenset[str]
    entities: frozenset[str]
    _tool_rx: re.Pattern[str] | None = field(default=None, compare=False)

    @classmethod
    def of(cls, tools: Iterable[str], classes: Iterable[str], entities: Iterable[str] = ()) -> Vocabulary:
        t = frozenset(normalise_name(x) for x in tools if x)
        rx = _names_rx(t)
        return cls(
            t,
            frozenset(normalise_name(c) for c in classes if c),
            frozenset(normalise_name(e) for e in entities if e) - t,
            rx,
        )


def _names_rx(names: Iterable[str]) -> re.Pattern[str] | None:
    ordered = sorted(set(names), key=lambda n: (-len(n), n))
    if not ordered:
        return None
    return re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, ordered)) + r")(?![\w-])")


_TAG = re.compile(r"^-\s*(?:\[[^\]]{0,40}\]\s*)?")
_TRAILER = re.compile(r"\s*\([^()]*\)\s*$")
_QUOTED = re.compile(r"'([^']{3,})(?:'|$)|\"([^\"]{3,})(?:\"|$)|`([^`]{3,})(?:`|$)")


def _candidates(text: str) -> list[str]:
    """Stretches of a line that may hold an error's text: the whole line (without its bullet, kind tag
    and trailing parenthesis), every quoted stretch, and what follows every ': ' or ' with '."""
    body = _TRAILER.sub("", _TAG.sub("", text.strip()))
    out = [body]
    out += [next(g for g in m.groups() if g) for m in _QUOTED.finditer(body)]
    for sep in (": ", " with ", " failed_with "):
        i = body.find(sep)
        while i >= 0:
            out.append(body[i + len(sep) :])
            i = body.find(sep, i + 1)
    return out


def line_subjects(
    text: str, vocab: Vocabulary, facts: Sequence[tuple[str, str, str]] = (), reader: str = ""
) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """(tools, error classes, entities) a briefing line names, as keys.

    A tool is named when its name stands as a word of the line; an error class when the class of some
    stretch of the line (``_candidates``, classed by ``error_class``) holds it, or, for a stretch cut
    short with "…", begins it (at least ``MIN_CUT_PREFIX`` characters of it); an entity when it is the
    source or target of a shown fact whose names the line holds. The reading agent itself is no subject.

    >>> v = Vocabulary.of(["book_reservation"], [error_class("Error: flight HAT030 not available on date 2024-05-13")])
    >>> line_subjects("- [failure] book_reservation failed with 'Error: flight HAT1 not available on date 2024-06-01'", v)
    (frozenset({'book_reservation'}), frozenset({'flight <id> not available on date <date>'}), frozenset())
    """
    low = normalise_name(text)
    tools = frozenset(m.group(1) for m in vocab._tool_rx.finditer(low)) if vocab._tool_rx else frozenset()
    classes: set[str] = set()
    if vocab.classes:
        seen = [normalise_name(error_class(c)) for c in _candidates(text) if c.strip()]
        cut = [
            normalise_name(error_class(c.rstrip().rstrip("…"))) for c in _candidates(text) if c.rstrip().endswith("…")
        ]
        for key in vocab.classes:
            if any(key in s for s in seen) or any(
                len(p) >= min(MIN_CUT_PREFIX, len(key)) and key.startswith(p) for p in cut
            ):
                classes.add(key)
    me = normalise_name(reader)
    entities: set[str] = set()
    for source, _, target in facts:
        names = [normalise_name(source), normalise_name(target)]
        if all(n and n in low for n in names):
            entities.update(n for n in names if n != me and n not in vocab.tools and n not in vocab.classes)
            tools |= frozenset(n for n in names if n in vocab.tools)
            classes.update(n for n in names if n in vocab.classes)
    return tools, frozenset(classes), frozenset(entities)


# ---- scoring -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    kind: str
    text: str
    tools: frozenset[str]
    classes: frozenset[str]
    entities: frozenset[str]
    fact: tuple[str, str, str] | None


def read_briefing(b: BriefingSeen, vocab: Vocabulary, reader: str = "") -> list[Line]:
    """Every bullet line of a briefing with its kind and subjects (a fact line also with its fact)."""
    shown = [tuple(normalise_name(x) for x in f) for f in b.facts]
    out = []
    for section, lines in b.sections if b.sections is not None else briefing_sections(b.markdown):
        kind = line_kind(section)
        for text in lines:
            tools, classes, entities = line_subjects(text, vocab, b.facts, reader)
            low = normalise_name(text)
            fact = next((f for f in shown if f[0] in low and f[2] in low), None) if kind == FACT else None
            out.append(Line(kind, text, tools, classes, entities, fact))  # type: ignore[arg-type]
    return out


def duplicates(lines: Sequence[Line]) -> int:
    """Lines sharing a (tool, error class) pair, an error class where one of the two names no tool, or
    a shown fact, with another line."""

    def pairs(x: Line) -> set[tuple[str, str]]:
        return {(t, c) for t in x.tools for c in x.classes}

    dup = 0
    for i, a in enumerate(lines):
        for j, b in enumerate(lines):
            if i == j:
                continue
            if (
                pairs(a) & pairs(b)
                or (a.fact is not None and a.fact == b.fact)
                or ((not a.tools or not b.tools) and a.classes & b.classes)
            ):
                dup += 1
                break
    return dup


def touched(s: SessionSeen, vocab: Vocabulary) -> frozenset[tuple[str, str]]:
    """What a session touched: ("tool", t) for every tool it called, ("error", c) for every class it
    met, ("entity", e) for every vocabulary entity its text names as a word."""
    out = {("tool", normalise_name(t)) for t in s.tools}
    out |= {("tool", normalise_name(f.tool)) for f in s.failures}
    out |= {("error", normalise_name(error_class(f.error))) for f in s.failures}
    low = normalise_name(s.text)
    rx = _names_rx(e for e in vocab.entities if e in low)
    if rx is not None:
        out |= {("entity", m.group(1)) for m in rx.finditer(low)}
    return frozenset(out)


def subjects(line: Line) -> frozenset[tuple[str, str]]:
    return frozenset(
        {("tool", t) for t in line.tools}
        | {("error", c) for c in line.classes}
        | {("entity", e) for e in line.entities}
    )


def median_p95(values: Sequence[int]) -> tuple[float | None, int | None]:
    """Median (the mean of the middle two for an even count) and nearest-rank 95th percentile.

    >>> median_p95([10, 20, 30, 40]), median_p95([])
    ((25.0, 40), (None, None))
    """
    if not values:
        return None, None
    ordered = sorted(values)
    return float(statistics.median(ordered)), ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def _ratio(a: int, b: int) -> float | None:
    return round(a / b, 4) if b else None


def score(
    sessions: Sequence[SessionSeen],
    briefings: Mapping[str, BriefingSeen],
    peers: Mapping[str, frozenset[str]],
    first_n: int = FIRST_SESSIONS,
    details: bool = False,
) -> dict[str, Any]:
    """The foresight report of sessions and the briefing given before each (by session id; a session
    without one had none). ``peers``: agent -> the agents whose earlier sessions it can learn from
    (``peer_agents``; itself when absent). ``details``: also one row per session (``per_session``). Pure."""
    ordered = sorted(enumerate(sessions), key=lambda x: (x[1].started_at, x[0]))
    vocab = Vocabulary.of(
        [t for s in sessions for t in s.tools] + [f.tool for s in sessions for f in s.failures],
        [error_class(f.error) for s in sessions for f in s.failures],
        [n for b in briefings.values() for f in b.facts for n in (f[0], f[2])],
    )
    past: list[tuple[datetime, str, frozenset[tuple[str, str]]]] = []  # (ended, agent, pairs failed)
    index: Counter[str] = Counter()
    part: dict[str, Counter[str]] = {k: Counter() for k in ("first", "rest")}
    agents: dict[str, Counter[str]] = {}
    missed: Counter[tuple[str, str]] = Counter()
    totals: Counter[str] = Counter()
    kinds: dict[str, Counter[str]] = {}
    chars: list[int] = []
    budgets: list[int] = []
    rows: list[dict[str, Any]] = []
    for _, s in ordered:
        which = "first" if index[s.agent] < first_n else "rest"
        index[s.agent] += 1
        mine = peers.get(s.agent, frozenset({s.agent})) | {s.agent}
        known = {p for ended, who, pairs in past if ended < s.started_at and who in mine for p in pairs}
        b = briefings.get(s.session_id)
        lines = read_briefing(b, vocab, s.agent) if b is not None else []
        warned = {(t, c) for x in lines if x.kind in (LESSON, FACT) for t in x.tools for c in x.classes}
        pairs = []
        before = Counter(totals)
        per = agents.setdefault(s.agent, Counter())
        per["sessions"] += 1
        for f in s.failures:
            pair = (normalise_name(f.tool), normalise_name(error_class(f.error)))
            pairs.append(pair)
            totals["failed_calls"] += 1
            if pair in known:
                for c in (totals, part[which], per):
                    c["learnable"] += 1
                if pair in warned:
                    for c in (totals, part[which], per):
                        c["foretold"] += 1
                else:
                    missed[pair] += 1
        part[which]["sessions"] += 1
        hit = touched(s, vocab)
        for x in lines:
            k = kinds.setdefault(x.kind, Counter())
            k["lines"] += 1
            totals["lines"] += 1
            if subjects(x) & hit:
                k["relevant"] += 1
                totals["relevant"] += 1
        totals["duplicate_lines"] += duplicates(lines)
        if b is not None:
            chars.append(len(b.markdown))
            budgets.append(b.budget)
            totals["over_budget"] += len(b.markdown) > b.budget
            totals["non_empty"] += bool(b.markdown)
        past.append((s.ended_at, s.agent, frozenset(pairs)))
        if details:
            rows.append(
                {
                    "session_id": s.session_id,
                    "agent": s.agent,
                    "index": index[s.agent] - 1,
                    "started_at": s.started_at.isoformat(),
                    "ended_at": s.ended_at.isoformat(),
                    "briefing_as_of": b.generated_at.isoformat() if b is not None and b.generated_at else None,
                    "chars": len(b.markdown) if b is not None else None,
                    "lines": len(lines),
                    **{
                        k: totals[k] - before[k]
                        for k in ("failed_calls", "learnable", "foretold", "relevant", "duplicate_lines")
                    },
                }
            )
    med, p95 = median_p95(chars)
    return {
        "sessions": len(sessions),
        "briefings": len(chars),
        "briefings_non_empty": totals["non_empty"],
        "failed_calls": totals["failed_calls"],
        "learnable": totals["learnable"],
        "foretold": totals["foretold"],
        "foresight": _ratio(totals["foretold"], totals["learnable"]),
        "foresight_by_session_index": {f"first_{first_n}": _part(part["first"]), "rest": _part(part["rest"])},
        "relevance": _ratio(totals["relevant"], totals["lines"]),
        "briefing_lines": totals["lines"],
        "relevant_lines": totals["relevant"],
        "lines_by_kind": {k: {"lines": v["lines"], "relevant": v["relevant"]} for k, v in sorted(kinds.items())},
        "duplicate_lines": totals["duplicate_lines"],
        "chars": {
            "median": med,
            "p95": p95,
            "max": max(chars) if chars else None,
            "budget": max(budgets) if budgets else None,
            "over_budget": totals["over_budget"],
        },
        "by_agent": {
            a: {
                "sessions": c["sessions"],
                "learnable": c["learnable"],
                "foretold": c["foretold"],
                "foresight": _ratio(c["foretold"], c["learnable"]),
            }
            for a, c in sorted(agents.items())
        },
        "missed": [{"tool": t, "error_class": c, "calls": n} for (t, c), n in missed.most_common(10)],
    } | ({"per_session": rows} if details else {})


def _part(c: Counter[str]) -> dict[str, Any]:
    return {
        "sessions": c["sessions"],
        "learnable": c["learnable"],
        "foretold": c["foretold"],
        "foresight": _ratio(c["foretold"], c["learnable"]),
    }


def peer_agents(agents: Mapping[str, Any], names: Iterable[str]) -> dict[str, frozenset[str]]:
    """Agent -> the agents (of ``names``) whose sessions it can learn from: itself, and every agent
    whose team scope (``team:<reportsTo>``) is in its scope chain. ``global`` does not count.

    >>> from somnus.schemas.agents import AgentSpec
    >>> fleet = {"lead": AgentSpec(name="lead"), "a": AgentSpec(name="a", reports_to="lead"),
    ...          "b": AgentSpec(name="b", reports_to="lead")}
    >>> {k: sorted(v) for k, v in peer_agents(fleet, ["lead", "a", "b", "x"]).items()}
    {'lead': ['lead'], 'a': ['a', 'b'], 'b': ['a', 'b'], 'x': ['x']}
    """
    registry = dict(agents)
    names = list(dict.fromkeys(names))

    def team(n: str) -> str | None:
        spec = registry.get(n)
        return team_scope(spec.reports_to) if spec is not None and spec.reports_to else None

    out = {}
    for a in names:
        chain = set(scope_chain(registry, a)) - {GLOBAL_SCOPE}
        out[a] = frozenset({a} | {b for b in names if team(b) in chain})
    return out


# ---- from events ---------------------------------------------------------------------------------


def sessions_of(events: Iterable[Mapping[str, Any]]) -> list[SessionSeen]:
    """Sessions from v1 event dicts (in the order they first appear): times, tools called, failed calls
    (a ``tool_result`` with ``ok`` false: its tool, or the tool of its call, and its error text)."""
    found: dict[str, dict[str, Any]] = {}
    for e in events:
        sid = str(e.get("session_id"))
        s = found.setdefault(
            sid, {"agent": e.get("agent"), "times": [], "tools": [], "failures": [], "calls": {}, "text": []}
        )
        s["times"].append(_time(e["ts"]))
        p = e.get("payload") or {}
        kind = e.get("type")
        if kind == "tool_call":
            s["tools"].append(str(p.get("tool")))
            s["calls"][p.get("call_id")] = str(p.get("tool"))
            s["text"].append(str(p.get("args", "")))
        elif kind == "tool_result":
            tool = p.get("tool") or s["calls"].get(p.get("call_id")) or "unknown"
            if p.get("ok") is False:
                s["failures"].append(FailedCall(str(tool), str(p.get("error") or p.get("output") or "")))
            s["text"].append(str(p.get("output") or p.get("error") or ""))
        elif kind == "session_start":
            s["text"].append(str(p.get("task") or ""))
        elif isinstance(p.get("text"), str):
            s["text"].append(p["text"])
    return [
        SessionSeen(
            sid,
            str(s["agent"]),
            min(s["times"]),
            max(s["times"]),
            tuple(s["tools"]),
            tuple(s["failures"]),
            "\n".join(s["text"]),
        )
        for sid, s in found.items()
    ]


def _time(value: Any) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def schedule(
    events: Sequence[Mapping[str, Any]],
) -> tuple[list[tuple[str, list[Mapping[str, Any]]]], list[Mapping[str, Any]]]:
    """The replay's plan: for each session in start order, the events to publish right before its first
    event (every event stamped earlier that was not published yet), and the events left after the last
    start. Events keep their input order among equal times, so a session's own order is kept.

    >>> ev = lambda s, t: {"session_id": s, "ts": f"2024-05-15T00:00:0{t}Z"}
    >>> plan, rest = schedule([ev("a", 0), ev("a", 2), ev("b", 1), ev("b", 3)])
    >>> [(sid, [(e["session_id"], e["ts"][-3]) for e in batch]) for sid, batch in plan], len(rest)
    ([('a', []), ('b', [('a', '0')])], 3)
    """
    timed = sorted(((_time(e["ts"]), i, e) for i, e in enumerate(events)), key=lambda x: (x[0], x[1]))
    first: dict[str, tuple[datetime, int]] = {}
    for t, i, e in timed:
        first.setdefault(str(e["session_id"]), (t, i))
    plan, k = [], 0
    for sid, (t0, _) in sorted(first.items(), key=lambda kv: kv[1]):
        batch = []
        while k < len(timed) and timed[k][0] < t0:
            batch.append(timed[k][2])
            k += 1
        plan.append((sid, batch))
    return plan, [e for _, _, e in timed[k:]]


# ---- the replay (I/O) ------------------------------------------------------------------------------

FORMATS = ("openai-chat", "swe-agent", "openhands", "toolbench", "otel", "v1")  # import's formats with tool calls


def load_events(
    paths: Sequence[str | Path],
    fmt: str,
    agent: str | None = None,
    results: Path | None = None,
    start: str | None = None,
    spacing_s: float | None = None,
) -> list[dict[str, Any]]:
    """The events of the files, read as ``somnus import`` reads them (``ImportShapeError`` when not)."""
    if fmt not in FORMATS or fmt not in IMPORTERS:
        raise ImportShapeError(f"--format {fmt!r}: choose one of {', '.join(f for f in FORMATS if f in IMPORTERS)}")
    run = import_run(start=start, spacing_s=spacing_s, results=results)
    return list(import_files(expand_paths(paths, fmt), fmt, agent=agent, run=run))


def first_sessions(events: Sequence[Mapping[str, Any]], n: int) -> list[Mapping[str, Any]]:
    """The events of the ``n`` sessions that start first (for a slice of a dataset)."""
    plan, _ = schedule(events)
    keep = {sid for sid, _ in plan[:n]}
    return [e for e in events if str(e["session_id"]) in keep]


def run_foresight(
    paths: Sequence[str | Path],
    fmt: str,
    *,
    results: Path | None = None,
    agent: str | None = None,
    start: str | None = None,
    spacing_s: float | None = None,
    sessions: int | None = None,
    home: Path | None = None,
    bootstrap: str | None = None,
    serve: bool = True,
    timeout_s: float = 600.0,
    log: Any = None,
    progress: Any = None,
    details: bool = False,
) -> dict[str, Any]:
    """Replay the files' sessions through a fresh pipeline and score the briefings (``score``).

    A local broker that was not running is started and stopped again; the worker, the projector, their
    topics and state folder are ``somnus.bench.isolated_pipeline``'s, removed afterwards. ``serve``:
    inject each briefing for its session, as a runtime does, so that serving is recorded (utilisation,
    promotion). ``sessions``: only the first N sessions by start time. ``progress(done, total)``."""
    events: Sequence[Mapping[str, Any]] = load_events(
        paths, fmt, agent=agent, results=results, start=start, spacing_s=spacing_s
    )
    if sessions is not None:
        events = first_sessions(events, sessions)
    seen = sessions_of(events)
    agent_of = {s.session_id: s.agent for s in seen}
    plan, _ = schedule(events)
    base = Settings.resolve(home=home, bootstrap=bootstrap)
    ours = base.bootstrap is None and broker_mod.status(base) is None
    if ours:
        broker_mod.start(base)
    briefings: dict[str, BriefingSeen] = {}
    t0 = time.perf_counter()
    try:
        with isolated_pipeline(home, label="foresight", log=log, bootstrap=bootstrap) as (s, boot):
            registry = load_agents(s.agents_dir or DEFAULT_DIR)
            db = s.db
            with Publisher(boot, s.traces_topic) as publisher:
                for done, (sid, batch) in enumerate(plan):
                    if batch:
                        publisher.send(batch)
                        _settle(s, boot, timeout_s, f"before session {sid} ({done + 1} of {len(plan)})", wait_idle)
                    briefings[sid] = _briefing_before(db, s.agents_dir, registry, agent_of[sid], sid, serve, read)
                    if progress is not None:
                        progress(done + 1, len(plan))
    finally:
        if ours:
            broker_mod.stop(base)
    report = score(seen, briefings, peer_agents(registry, agent_of.values()), details=details)
    report.update(
        {
            "format": fmt,
            "events": len(events),
            "replay_s": round(time.perf_counter() - t0, 1),
            "served": serve,
            "path": "import -> Kafka -> Faust worker -> projector; briefing read (and injected) before "
            "each session's first event",
        }
    )
    return report


def _settle(s: Any, boot: str, timeout_s: float, where: str, wait_idle: Any) -> None:
    """Wait until everything published is projected and no briefing is stale; a timeout says where the
    replay was and ends with the worker's log (a stalled worker was seen once under heavy load)."""
    try:
        wait_idle(s, boot, timeout_s=timeout_s, poll_s=0.2)
    except TimeoutError as exc:
        log = s.run_dir / "worker.log"
        tail = log.read_text(errors="replace")[-4000:] if log.exists() else "(no worker log)"
        raise TimeoutError(f"{where}: {exc}\n--- worker.log (end) ---\n{tail}") from None


def _briefing_before(
    db: Path, agents_dir: Path | None, registry: Mapping[str, Any], agent: str, session_id: str, serve: bool, read: Any
) -> BriefingSeen:
    spec = registry.get(agent)
    budget = spec.briefing_token_budget if spec is not None else DEFAULT_BUDGET
    got = read(db, "briefing", agent, agents_dir=agents_dir)["briefing"]
    if not got or not got.get("markdown"):
        return BriefingSeen("", budget)
    if serve:
        read(db, "inject", agent, agents_dir=agents_dir, prompt="", session_id=session_id)
    facts = tuple(
        (f.get("source_name") or f["source"], f["predicate"], f.get("target_name") or f["target"])
        for f in got.get("facts") or []
    )
    as_of = got.get("generated_at")
    return BriefingSeen(
        got["markdown"], int(got.get("budget") or budget), facts=facts, generated_at=_time(as_of) if as_of else None
    )
