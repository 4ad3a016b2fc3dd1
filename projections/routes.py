"""The read API's routes: a table of (method, path, handler), light enough for the CLI to import.

``somnus.reads`` sends a read to the running projector by its route without importing the
handlers (``projections/api.py``, DuckDB and the folds), so a read command starts at once.
"""

from __future__ import annotations

from dataclasses import dataclass

BRIEFING_SERVER_HANDLERS = ("briefing", "inject")  # the handlers the briefing server answers


@dataclass(frozen=True)
class Route:
    method: str  # GET (query parameters) or POST (JSON body)
    path: str  # {agent} is the only path parameter
    handler: str  # the ReadService method
    summary: str
    params: tuple[tuple[str, str, str], ...] = ()  # (name, JSON type, description)
    stateful: bool = False  # reads a fold's in-memory state (memory index, semantic layers, synopses)
    offloop: bool = False  # may run for long (analysts' SQL): served from its own threads, not the event loop


USER_ID = (
    "user_id",
    "string",
    "the user the reader acts for: only that user's (and user-less) items, filtered before ranking",
)

ROUTES: tuple[Route, ...] = (
    Route(
        "GET",
        "/agents/{agent}/briefing",
        "briefing",
        "The agent's cached briefing (null when it has none).",
        (("user_id", "string", "a reader acting for this user gets none (SECURITY.md)"),),
    ),
    Route(
        "POST",
        "/agents/{agent}/inject",
        "inject",
        "The system prompt with the agent's briefing prepended between delimiters (unchanged without one).",
        (
            ("prompt", "string", "the system prompt"),
            ("session_id", "string", "the session about to start: recorded, so utilisation can be counted"),
            ("user_id", "string", "a reader acting for this user gets the prompt unchanged (SECURITY.md)"),
        ),
    ),
    Route(
        "GET",
        "/agents/{agent}/facts",
        "facts",
        "Facts of the agent's scope chain, highest confidence first.",
        (
            ("as_of", "string", "ISO 8601 time: the facts active then"),
            ("limit", "integer", "default 50"),
            ("predicate", "string", "only this predicate"),
            ("entity", "string", "only facts about this entity id"),
            USER_ID,
        ),
    ),
    Route(
        "GET",
        "/agents/{agent}/entities",
        "entities",
        "Entities of the agent's scope chain, most mentioned first.",
        (("type", "string", "only this entity type"), ("limit", "integer", "default 100"), USER_ID),
    ),
    Route(
        "GET",
        "/agents/{agent}/history",
        "history",
        "Every change to facts about an entity in the scope chain.",
        (("entity", "string", "an entity id, e.g. tool:book_reservation"), USER_ID),
    ),
    Route(
        "POST",
        "/sql",
        "sql",
        "A read-only SELECT over every projection (not scoped), in the SQL sandbox: "
        "one SELECT or EXPLAIN of one, no files, interrupted after SOMNUS_SQL_TIMEOUT_S.",
        (("sql", "string", "the query; ? placeholders"), ("params", "array", "values of the placeholders")),
        offloop=True,
    ),
    Route(
        "GET",
        "/agents/{agent}/recall",
        "recall",
        "Memories of the scope chain that best answer a query.",
        (
            ("query", "string", "what to recall"),
            ("k", "integer", "default 10"),
            ("explain", "boolean", "per-signal scores and ranks"),
            ("filters", "string", 'JSON object of multi-key filters, e.g. {"tool": "x", "success": true}'),
            ("record", "boolean", "record the hits as accesses (default true)"),
            ("goals", "boolean", "lean towards the agent's open goals, if it has any (default true)"),
            USER_ID,
            ("without", "string", "signals left out of the fusion, comma-separated, e.g. graph (an ablation)"),
        ),
        stateful=True,
    ),
    Route(
        "GET",
        "/agents/{agent}/goals",
        "goals",
        "The agent's goals, newest first, with their forward prediction error (1 - nearest belief score).",
        (("all", "boolean", "closed goals too (default false: open ones)"), USER_ID),
    ),
    Route(
        "GET",
        "/agents/{agent}/wander",
        "wander",
        "A walk over the agent's memory graph by information gain (under-explored, low confidence, "
        "goal-adjacent, stale, random), each step with its reasons.",
        (
            ("steps", "integer", "default 10"),
            ("seed", "integer", "the walk's random seed (default 0)"),
            ("start", "string", "a memory id to start from (default: the best memory)"),
            USER_ID,
        ),
        stateful=True,
    ),
    Route(
        "GET",
        "/agents/{agent}/episodic-context",
        "episodic_context",
        "Token-budgeted text of relevant past work for a prompt.",
        (
            ("query", "string", "the task at hand"),
            ("top_k", "integer", "default 5"),
            ("token_budget", "integer", "default 2000"),
            ("success_only", "boolean", "only past work that succeeded (default false)"),
            ("domain_hint", "string", "the task's domain: past work of that domain counts as relevant"),
            ("min_relevance", "number", "the relevance gate, in [0, 1] (default 0.05)"),
            USER_ID,
        ),
        stateful=True,
    ),
    Route(
        "GET",
        "/agents/{agent}/context",
        "context",
        "One fitted context: user synopsis, the session's recent conversation, fused recall/knowledge/briefing.",
        (
            ("query", "string", "the task or question at hand"),
            ("user_id", "string", "the user served (isolation)"),
            ("session_id", "string", "the current session (default: the agent's latest open one)"),
            ("max_tokens", "integer", "default 4000"),
        ),
        stateful=True,
    ),
    Route(
        "GET",
        "/agents/{agent}/knowledge-context",
        "knowledge_context",
        "What the agent knows: concepts (with relationships) and confirmed patterns of its scope chain, ranked.",
        (
            ("query", "string", "rank by relevance to this text"),
            ("limit", "integer", "default 8"),
            ("user_id", "string", "a reader acting for this user gets none (SECURITY.md)"),
        ),
        stateful=True,
    ),
    Route(
        "GET",
        "/stream-time",
        "stream_time",
        "The stream time of a scope: the newest event time of the agents writing in it (null: no event yet).",
        (("scope", "string", "global (default), team:<lead> or agent:<name>"),),
    ),
    Route(
        "GET",
        "/promotion-inputs",
        "promotion_inputs",
        "A snapshot of the promotion inputs (NAc candidate links, call outcomes) for an owner.",
        (("owner", "string", "global (default), team:<lead> or agent:<name>"),),
    ),
    Route(
        "GET",
        "/predict",
        "predict",
        "Likely outcomes of a call before it is made (NAc causal links).",
        (
            ("tool", "string", "the tool"),
            ("args", "string", "the call's arguments, a JSON object"),
            ("agent", "string", "context: the calling agent"),
            ("hour", "string", "context: local hour, 00-23"),
        ),
    ),
    Route(
        "GET",
        "/agents/{agent}/advise",
        "advise",
        "Pre-flight advice for a task: strategies, risks, "
        "escalation and salient entities of related past episodes, with provenance (docs/concepts/advise.md).",
        (
            ("task", "string", "the task about to start"),
            ("user_id", "string", "a reader acting for this user gets none (SECURITY.md)"),
        ),
    ),
    Route("GET", "/tools", "tools", "Exact calls and errors per tool."),
    Route(
        "GET",
        "/agents/{agent}/rhythms",
        "rhythms",
        "What usually happens at given local hours (SCN bins).",
        (
            ("hours", "string", "e.g. 9 or 8,9,10"),
            ("days", "string", "weekdays, weekend or 0,1,... (Monday 0)"),
            ("top", "integer", "default 5"),
            ("user_id", "string", "a reader acting for this user gets none"),
        ),
    ),
    Route(
        "GET",
        "/agents/{agent}/oscillators",
        "oscillators",
        "The agent's coupled oscillators per pattern (SOMNUS_OSCILLATORS): locks, coherence r, coupling "
        "eigenvalues, next recurrence and stored anomalies.",
        (
            ("anomaly_min", "number", "list readings at or above this anomaly, in [0, 1] (default 0.25)"),
            ("limit", "integer", "anomalies per pattern, newest first (default 10)"),
            ("user_id", "string", "a reader acting for this user gets none"),
        ),
    ),
    Route(
        "GET",
        "/memory",
        "memory",
        "Memory status: graph size, briefing cache, utilisation, delegation success.",
        (("top", "integer", "how many agents / pairs to list (default 5)"),),
    ),
    Route("GET", "/summary", "summary", "Row counts, projected offsets and dead letters by kind."),
    Route("GET", "/checksum", "checksum", "The content checksum of every projection."),
    Route(
        "GET",
        "/kafka-positions",
        "kafka_positions",
        "End offsets of the projected topics and the worker group's committed offsets (somnus status).",
        offloop=True,
    ),
    Route(
        "POST",
        "/export/parquet",
        "export_parquet",
        "Write projections as hive-partitioned Parquet under a folder, from one committed snapshot, with a "
        "manifest of the source offsets (projections/export.py).",
        (
            ("dir", "string", "the folder to write (absolute; created; must be empty)"),
            ("tables", "array", "only these tables (default: every projection)"),
            ("since", "string", "ISO 8601: only rows of this day or later, where a table has a time column"),
        ),
        offloop=True,
    ),
)

EXTRA_ROUTES: list[Route] = []  # capabilities add their reads here (see register)
