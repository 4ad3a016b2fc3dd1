"""The JSON Schema files are the contract; these tests keep them and the Python types in step, both ways.

- schema -> types: instances generated from ``trace_event.v1.schema.json`` itself all decode.
- types -> schema: typed events and episodes, encoded by ``somnus.schemas.codec.encode``, validate against
  their schema (with format checking) and decode back equal, byte for byte.
- shape: the schema's branches, properties and required lists match the Struct definitions.

Instances are generated from the schema by ``strategy_from_schema`` below, a small translator of
the JSON Schema subset the contracts use. (hypothesis-jsonschema 0.23.1 does not run on the
Hypothesis this project uses: its object strategy calls ``many.more()``, which Hypothesis removed.)
The translator raises on any keyword it does not know, so a contract that grows a new keyword
fails here loudly instead of being generated loosely.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from somnus.processors.sessions.distiller import distill
from somnus.schemas import codec
from somnus.schemas.codec import decode_episode, decode_trace, encode
from somnus.schemas.episodes import CallSeen, EpisodeDistilled, ErrorSeen, Lesson, LessonKind, episode_id_for
from somnus.schemas.episodes import Delegation as EpisodeDelegation
from somnus.schemas.events import (
    EVENT_TYPES,
    SCHEMA_VERSION,
    AgentMessaged,
    Delegated,
    Delegation,
    DelegationResult,
    DelegationReturned,
    Message,
    Outcome,
    SessionEnd,
    SessionEnded,
    SessionStart,
    SessionStarted,
    ToolCall,
    ToolCalled,
    ToolResult,
    ToolReturned,
    TraceEvent,
    UserMessaged,
    type_name,
)

SCHEMA_DIR = Path(codec.__file__).parent
TRACE_SCHEMA = json.loads((SCHEMA_DIR / "trace_event.v1.schema.json").read_text())
EPISODE_SCHEMA = json.loads((SCHEMA_DIR / "episode.v1.schema.json").read_text())
FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER
TRACE_VALIDATOR = jsonschema.Draft202012Validator(TRACE_SCHEMA, format_checker=FORMATS)
EPISODE_VALIDATOR = jsonschema.Draft202012Validator(EPISODE_SCHEMA, format_checker=FORMATS)

PROPERTY = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)


# ---- a strategy from a JSON Schema (the subset the contracts use) ------------------------------

JSON_SCALARS = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
_ANNOTATIONS = {"title", "description", "$schema", "$id", "$defs"}


def _uuid_texts() -> st.SearchStrategy[str]:
    return st.builds(lambda u, upper: str(u).upper() if upper else str(u), st.uuids(), st.booleans())


@st.composite
def _date_times(draw: Any) -> str:
    """Every RFC 3339 date-time shape: any year, T/t, 0-9 fraction digits, Z/z or a +-hh:mm offset."""
    day = draw(st.dates(min_value=datetime(1, 1, 1).date()))
    hh, mm, ss = draw(st.integers(0, 23)), draw(st.integers(0, 59)), draw(st.integers(0, 59))
    digits = draw(st.integers(0, 9))
    frac = (
        "." + "".join(draw(st.lists(st.sampled_from("0123456789"), min_size=digits, max_size=digits))) if digits else ""
    )
    sep = draw(st.sampled_from("Tt"))
    offset = draw(
        st.sampled_from(["Z", "z"])
        | st.builds(
            lambda sign, h, m: f"{sign}{h:02d}:{m:02d}", st.sampled_from("+-"), st.integers(0, 23), st.integers(0, 59)
        )
    )
    return f"{day.isoformat()}{sep}{hh:02d}:{mm:02d}:{ss:02d}{frac}{offset}"


def _string(node: dict[str, Any]) -> st.SearchStrategy[str]:
    fmt, pattern, min_len = node.pop("format", None), node.pop("pattern", None), node.pop("minLength", 0)
    max_len = node.pop("maxLength", None)
    base = {"uuid": _uuid_texts(), "date-time": _date_times(), None: st.text(min_size=min_len, max_size=12)}[fmt]
    if max_len is not None and fmt is None:  # a long name too: the bound itself is an instance
        base = base | st.text(min_size=max_len, max_size=max_len)
    if pattern is not None:
        base = base.filter(lambda s: re.search(pattern, s) is not None)
    if fmt is not None:
        base = base.filter(lambda s: FORMATS.conforms(s, fmt))
    return base.filter(lambda s: min_len <= len(s) <= (max_len if max_len is not None else len(s)))


def _object(node: dict[str, Any], root: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    props = node.pop("properties", {})
    required = node.pop("required", [])
    additional = node.pop("additionalProperties", True)
    assert set(required) <= set(props), f"required but undefined: {set(required) - set(props)}"
    fixed = {k: strategy_from_schema(v, root) for k, v in props.items() if k in required}
    optional = {k: strategy_from_schema(v, root) for k, v in props.items() if k not in required}
    declared = st.fixed_dictionaries(fixed, optional=optional)
    if additional is False:
        return declared
    values = JSON_VALUES if additional is True else strategy_from_schema(additional, root)
    extra = st.dictionaries(st.text(max_size=8).filter(lambda k: k not in props), values, max_size=2)
    return st.builds(lambda d, e: {**e, **d}, declared, extra)


def strategy_from_schema(schema: dict[str, Any], root: dict[str, Any]) -> st.SearchStrategy[Any]:
    node = {k: v for k, v in schema.items() if k not in _ANNOTATIONS}
    if not node:  # {} (e.g. array items without a schema): any JSON value
        return JSON_VALUES
    if "$ref" in node:
        assert set(node) == {"$ref"}, node
        target: Any = root
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        return strategy_from_schema(target, root)
    for combinator in ("oneOf", "anyOf"):
        if combinator in node:
            branches = node.pop(combinator)
            assert all(not set(node) & set(b) for b in branches), "a branch repeats a keyword of its parent"
            return st.one_of([strategy_from_schema({**node, **b}, root) for b in branches])
    if "const" in node:
        return st.just(node.pop("const"))
    if "enum" in node:
        return st.sampled_from(node.pop("enum"))
    kind = node.pop("type", None)
    if kind == "object":
        strat = _object(node, root)
    elif kind == "string":
        strat = _string(node)
    elif kind == "integer":
        strat = st.integers(min_value=node.pop("minimum", None), max_value=node.pop("maximum", None))
    elif kind == "number":
        lo = node.pop("minimum", None)
        strat = st.integers(min_value=lo) | st.floats(min_value=lo, allow_nan=False, allow_infinity=False)
    elif kind == "array":
        strat = st.lists(strategy_from_schema(node.pop("items", {}), root), max_size=3)
    elif kind == "boolean":
        strat = st.booleans()
    elif kind == "null":
        strat = st.none()
    else:
        raise ValueError(f"no strategy for schema type {kind!r}")
    if node:
        raise ValueError(f"the translator does not know the keywords {sorted(node)}: teach it, don't skip them")
    return strat


def _to_json(instance: Any) -> bytes:
    # the stdlib, not orjson: the contract allows integers beyond 64 bits and orjson refuses them
    return json.dumps(instance, ensure_ascii=False).encode()


# ---- schema -> types ---------------------------------------------------------------------------


def test_the_translator_covers_every_keyword_of_both_contracts():
    strategy_from_schema(TRACE_SCHEMA, TRACE_SCHEMA).validate()
    strategy_from_schema(EPISODE_SCHEMA, EPISODE_SCHEMA).validate()
    with pytest.raises(ValueError, match="multipleOf"):
        strategy_from_schema({"type": "integer", "multipleOf": 2}, {}).validate()


def test_the_format_checker_really_checks_date_time_and_uuid():
    # jsonschema checks date-time only when rfc3339-validator is installed; without it every test
    # below that validates formats would pass vacuously.
    assert not FORMATS.conforms("2024-02-30T10:00:00Z", "date-time")
    assert not FORMATS.conforms("2024-05-15T10:00:00", "date-time")
    assert FORMATS.conforms("2024-05-15T10:00:00.5+05:30", "date-time")
    assert not FORMATS.conforms("6f1c1a6e7d0c-4a43-9a55-0c7f2d1f4b1e", "uuid")


@PROPERTY
@given(strategy_from_schema(TRACE_SCHEMA, TRACE_SCHEMA))
def test_every_instance_of_the_trace_contract_decodes(instance):
    assert TRACE_VALIDATOR.is_valid(instance)  # the generator itself stays inside the contract
    event = decode_trace(_to_json(instance), max_bytes=10**9)
    assert not isinstance(event, codec.Rejection), (event.reason, instance)
    assert type_name(event) == instance["type"]
    assert event.event_id == uuid.UUID(instance["event_id"])
    assert (event.schema_version, event.agent, event.session_id, event.seq) == (
        instance["schema_version"],
        instance["agent"],
        instance["session_id"],
        instance["seq"],
    )
    assert event.ts.tzinfo is not None
    for name in TRACE_SCHEMA["$defs"][instance["type"]]["properties"]:
        if name in instance["payload"]:
            assert getattr(event.payload, name) == instance["payload"][name], name


@PROPERTY
@given(strategy_from_schema(EPISODE_SCHEMA, EPISODE_SCHEMA))
def test_every_instance_of_the_episode_contract_decodes(instance):
    episode = decode_episode(_to_json(instance))
    assert episode.episode_id == uuid.UUID(instance["episode_id"])
    assert [lesson.text for lesson in episode.lessons] == [lesson["text"] for lesson in instance["lessons"]]
    assert episode.outcome.value == instance["outcome"]


# Near misses: a valid event with one field removed or replaced by a tricky value, for every event
# type, every field and every value. The contract and the decoder must agree on each, so a type that
# drifts looser or stricter than the schema (a dropped min_length, a moved bound) is caught either way.
TRICKY: list[Any] = [
    "",
    "x",
    -1,
    0,
    1,
    99,
    100,
    599,
    600,
    1.5,
    -0.5,
    True,
    False,
    None,
    [],
    {},
    {"k": 1},
    {"k": "v"},
    "success",
    "won",
    "2024-05-15T15:00:00",
    "2024-05-15T15:00:00+01:00",
]
FULL_PAYLOADS: dict[str, dict[str, Any]] = {
    "session_start": {"task": "t", "goal": "g", "user_id": "u", "metadata": {"k": 1}},
    "user_message": {"text": "hi"},
    "agent_message": {"text": "hi"},
    "tool_call": {"tool": "http_get", "call_id": "c1", "args": {"url": "u"}},
    "tool_result": {
        "call_id": "c1",
        "ok": False,
        "tool": "http_get",
        "error": "e",
        "http_status": 429,
        "latency_ms": 80.5,
        "output": "o",
        "headers": {"Retry-After": "2"},
    },
    "delegation": {"to_agent": "deployer", "task": "t", "delegation_id": "d1"},
    "delegation_result": {"to_agent": "deployer", "outcome": "failure", "delegation_id": "d1", "summary": "s"},
    "session_end": {"outcome": "success", "reason": "r"},
}


def _near_misses() -> list[dict[str, Any]]:
    out = []
    for tag, payload in FULL_PAYLOADS.items():
        required = TRACE_SCHEMA["$defs"][tag]["required"]
        for full in (True, False):
            base = {
                "event_id": "6f1c1a6e-7d0c-4a43-9a55-0c7f2d1f4b1e",
                "schema_version": 1,
                "ts": "2024-05-15T15:00:00.25Z",
                "agent": "support",
                "session_id": "s1",
                "seq": 3,
                "type": tag,
                "payload": {k: v for k, v in payload.items() if full or k in required},
            }
            fields = ((False, list(base)), (True, list(payload))) if full else ((True, list(payload)),)
            for in_payload, names in fields:
                for name in names:
                    for value in [KeyError, *TRICKY]:  # KeyError stands for "field removed"
                        instance = json.loads(json.dumps(base))
                        target = instance["payload"] if in_payload else instance
                        if value is KeyError:
                            target.pop(name, None)
                        else:
                            target[name] = value
                        out.append(instance)
    return out


def test_the_full_payloads_are_valid_and_cover_every_payload_field():
    for tag, payload in FULL_PAYLOADS.items():
        assert set(payload) == set(TRACE_SCHEMA["$defs"][tag]["properties"])
        event = {
            "event_id": str(uuid.UUID(int=1)),
            "schema_version": 1,
            "ts": "2024-05-15T15:00:00Z",
            "agent": "a",
            "session_id": "s",
            "seq": 0,
            "type": tag,
            "payload": payload,
        }
        assert TRACE_VALIDATOR.is_valid(event)


def test_the_contract_and_the_decoder_agree_on_every_near_miss():
    cases = _near_misses()
    disagreements = []
    for instance in cases:
        accepted = not isinstance(decode_trace(_to_json(instance), max_bytes=10**9), codec.Rejection)
        if TRACE_VALIDATOR.is_valid(instance) != accepted:
            disagreements.append((accepted, instance))
    assert len(cases) > 1500
    assert disagreements == []


def test_an_integral_float_seq_valid_under_the_contract_decodes():
    """JSON Schema's integer includes 1.0 (what Python's json.dumps writes for a whole float); the
    decoder accepts it too, as the int it is. A fraction stays a schema error on both sides."""
    event = {
        "event_id": "6f1c1a6e-7d0c-4a43-9a55-0c7f2d1f4b1e",
        "schema_version": 1,
        "ts": "2024-05-15T15:00:00Z",
        "agent": "a",
        "session_id": "s",
        "seq": 1.0,
        "type": "user_message",
        "payload": {"text": "x"},
    }
    assert TRACE_VALIDATOR.is_valid(event)
    decoded = decode_trace(_to_json(event), 10_000)
    assert not isinstance(decoded, codec.Rejection) and decoded.seq == 1 and type(decoded.seq) is int
    event["seq"] = 1.5
    assert not TRACE_VALIDATOR.is_valid(event)
    rejected = decode_trace(_to_json(event), 10_000)
    assert isinstance(rejected, codec.Rejection) and rejected.kind == "schema" and "seq" in rejected.reason


@pytest.mark.parametrize(
    "mutate",
    [
        lambda e: e.pop("payload"),
        lambda e: e.update(seq=-1),
        lambda e: e.update(schema_version=SCHEMA_VERSION + 1),
        lambda e: e.update(agent=""),
        lambda e: e.update(ts="2024-05-15T15:00:00"),
        lambda e: e.update(type="tool_called"),
        lambda e: e["payload"].pop("call_id"),
        lambda e: e["payload"].update(http_status=600),
        lambda e: e["payload"].update(latency_ms=-1),
        lambda e: e.update(agent="a" * 1025),
        lambda e: e["payload"].update(tool="t" * 1025),
        lambda e: e["payload"].update(call_id="c" * 1025),
    ],
    ids=[
        "no payload",
        "negative seq",
        "future version",
        "empty agent",
        "naive ts",
        "unknown type",
        "no call_id",
        "status 600",
        "negative latency",
        "agent of 1025 characters",
        "tool of 1025 characters",
        "call_id of 1025 characters",
    ],
)
def test_what_the_contract_rejects_the_decoder_rejects_too(mutate):
    event = {
        "event_id": "6f1c1a6e-7d0c-4a43-9a55-0c7f2d1f4b1e",
        "schema_version": 1,
        "ts": "2024-05-15T15:00:00Z",
        "agent": "support",
        "session_id": "s1",
        "seq": 3,
        "type": "tool_result",
        "payload": {"call_id": "c1", "ok": False, "http_status": 429},
    }
    assert TRACE_VALIDATOR.is_valid(event)
    assert not isinstance(decode_trace(_to_json(event), 10_000), codec.Rejection)
    mutate(event)
    assert not TRACE_VALIDATOR.is_valid(event)
    assert isinstance(decode_trace(_to_json(event), 10_000), codec.Rejection)


# ---- types -> schema: hand-written strategies of typed values ----------------------------------

texts = st.text(max_size=20)
non_empty = st.text(min_size=1, max_size=12)
# RFC 3339 offsets are whole minutes; msgspec keeps the offset, so the round trip is exact
offsets = st.integers(-(24 * 60 - 1), 24 * 60 - 1).map(lambda m: timezone(timedelta(minutes=m)))
aware = st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=offsets)
json_objects = st.dictionaries(
    st.text(max_size=6),
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**63 - 1)
        | st.floats(allow_nan=False, allow_infinity=False)
        | texts,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
        max_leaves=6,
    ),
    max_size=3,
)
outcomes = st.sampled_from(Outcome)


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


PAYLOADS: dict[type, st.SearchStrategy[Any]] = {
    SessionStarted: st.builds(SessionStart, task=texts, goal=maybe(texts), user_id=maybe(texts), metadata=json_objects),
    UserMessaged: st.builds(Message, text=texts),
    AgentMessaged: st.builds(Message, text=texts),
    ToolCalled: st.builds(ToolCall, tool=non_empty, call_id=non_empty, args=json_objects),
    ToolReturned: st.builds(
        ToolResult,
        call_id=non_empty,
        ok=st.booleans(),
        tool=maybe(texts),
        error=maybe(texts),
        http_status=maybe(st.integers(100, 599)),
        latency_ms=maybe(st.floats(min_value=0, allow_nan=False, allow_infinity=False)),
        output=maybe(texts),
        headers=st.dictionaries(texts, texts, max_size=3),
    ),
    Delegated: st.builds(Delegation, to_agent=non_empty, task=texts, delegation_id=maybe(texts)),
    DelegationReturned: st.builds(
        DelegationResult, to_agent=non_empty, outcome=outcomes, delegation_id=maybe(texts), summary=maybe(texts)
    ),
    SessionEnded: st.builds(SessionEnd, outcome=outcomes, reason=maybe(texts)),
}


def typed_event(cls: type) -> st.SearchStrategy[Any]:
    return st.builds(
        cls,
        payload=PAYLOADS[cls],
        event_id=st.uuids(),
        schema_version=st.just(SCHEMA_VERSION),
        ts=aware,
        agent=non_empty,
        session_id=non_empty,
        seq=st.integers(0, 2**63 - 1),
    )


typed_events = st.one_of([typed_event(cls) for cls in EVENT_TYPES.values()])


def test_there_is_a_payload_strategy_for_every_event_type():
    assert set(PAYLOADS) == set(EVENT_TYPES.values())


@PROPERTY
@given(typed_events)
@example(
    ToolReturned(
        event_id=uuid.UUID(int=0),
        schema_version=1,
        agent="a",
        session_id="s",
        seq=0,
        ts=datetime(2024, 5, 15, 15, 0, 0, 123456, tzinfo=timezone(timedelta(hours=-9, minutes=-30))),
        payload=ToolResult(call_id="c", ok=False, http_status=429, latency_ms=0.0, headers={"Retry-After": "2"}),
    )
)
def test_typed_events_round_trip_through_the_contract(event):
    raw = encode(event)
    instance = json.loads(raw)
    errors = [e.message for e in TRACE_VALIDATOR.iter_errors(instance)]
    assert not errors, errors
    back = decode_trace(raw, max_bytes=len(raw))
    assert back == event
    assert type(back) is type(event)
    assert encode(back) == raw


# episodes: real ones from the distiller (sessions generated from typed events) and arbitrary ones


@st.composite
def sessions(draw: Any) -> list[TraceEvent]:
    """One complete session: start, a body of any events (never session_end), end; seqs consecutive."""
    agent, session_id = draw(non_empty), draw(non_empty)
    t0 = draw(st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2090, 1, 1), timezones=offsets))
    body_types = [c for c in EVENT_TYPES.values() if c not in (SessionStarted, SessionEnded)]
    kinds = [SessionStarted] + draw(st.lists(st.sampled_from(body_types), max_size=12)) + [SessionEnded]
    tools = draw(st.lists(non_empty, min_size=1, max_size=3, unique=True))
    events: list[TraceEvent] = []
    t = t0
    for seq, cls in enumerate(kinds):
        payload = draw(PAYLOADS[cls])
        if cls is ToolCalled or cls is ToolReturned:  # a few tools and call ids, so errors meet retries
            payload = msgspec.structs.replace(payload, call_id=f"c{draw(st.integers(0, 3))}")
        if cls is ToolCalled:
            payload = msgspec.structs.replace(payload, tool=draw(st.sampled_from(tools)))
        if cls is ToolReturned:
            payload = msgspec.structs.replace(payload, tool=draw(st.none() | st.sampled_from(tools)))
        events.append(
            cls(
                event_id=draw(st.uuids()),
                schema_version=SCHEMA_VERSION,
                ts=t,
                agent=agent,
                session_id=session_id,
                seq=seq,
                payload=payload,
            )
        )
        t += timedelta(seconds=draw(st.integers(0, 120)))
    return events


def _assert_episode_round_trips(episode: EpisodeDistilled) -> None:
    raw = encode(episode)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in EPISODE_VALIDATOR.iter_errors(json.loads(raw))]
    assert not errors, errors
    back = decode_episode(raw)
    assert back == episode
    assert encode(back) == raw


@PROPERTY
@given(sessions())
def test_distilled_episodes_round_trip_through_the_contract(events):
    out = distill({}, events)
    assert len(out.episodes) == 1
    _assert_episode_round_trips(out.episodes[0])


episodes = st.builds(
    EpisodeDistilled,
    episode_id=st.uuids(),
    schema_version=st.integers(1, 5),
    agent=non_empty,
    session_id=non_empty,
    task=texts,
    goal=maybe(texts),
    user_id=maybe(texts),
    summary=texts,
    outcome=outcomes,
    started_at=aware,
    ended_at=aware,
    duration_s=st.floats(allow_nan=False, allow_infinity=False),
    event_count=st.integers(0, 10**6),
    tool_calls=st.integers(0, 10**6),
    tools=st.lists(texts, max_size=4),
    errors=st.lists(
        st.builds(ErrorSeen, tool=texts, error=texts, http_status=maybe(st.integers(100, 599)), resolved=st.booleans()),
        max_size=3,
    ),
    lessons=st.lists(
        st.builds(Lesson, kind=st.sampled_from(LessonKind), text=texts, tool=maybe(texts), error=maybe(texts)),
        max_size=3,
    ),
    delegations=st.lists(st.builds(EpisodeDelegation, to_agent=texts, task=texts, outcome=maybe(outcomes)), max_size=3),
    first_event_id=st.uuids(),
    last_event_id=st.uuids(),
)


@PROPERTY
@given(episodes)
def test_any_episode_round_trips_through_the_contract(episode):
    _assert_episode_round_trips(episode)


def test_a_distilled_episode_with_every_optional_part_matches_the_contract():
    t = datetime(2024, 5, 15, 15, 0, tzinfo=timezone.utc)
    evs: list[TraceEvent] = []

    def add(cls: type, payload: Any, dt: float = 1.0) -> None:
        nonlocal t
        evs.append(
            cls(
                event_id=uuid.UUID(int=len(evs) + 1),
                schema_version=1,
                ts=t,
                agent="ops-lead",
                session_id="s-full",
                seq=len(evs),
                payload=payload,
            )
        )
        t += timedelta(seconds=dt)

    add(SessionStarted, SessionStart(task="ship 2.4", goal="by noon", user_id="u1"))
    add(ToolCalled, ToolCall(tool="http_get", call_id="c1"))
    add(ToolReturned, ToolResult(call_id="c1", ok=False, http_status=429, error="Too Many Requests"), 4.0)
    add(ToolCalled, ToolCall(tool="http_get", call_id="c2"))
    add(ToolReturned, ToolResult(call_id="c2", ok=True))
    add(ToolCalled, ToolCall(tool="shell", call_id="c3"))
    add(ToolReturned, ToolResult(call_id="c3", ok=False, error="helm: command not found"))
    add(Delegated, Delegation(to_agent="deployer", task="roll out"))
    add(DelegationReturned, DelegationResult(to_agent="deployer", outcome=Outcome.FAILURE, summary="timeout"))
    add(SessionEnded, SessionEnd(outcome=Outcome.FAILURE))
    (episode,) = distill({}, evs).episodes
    assert {l.kind for l in episode.lessons} == {LessonKind.RECOVERY, LessonKind.FAILURE}
    assert [e.resolved for e in episode.errors] == [True, False]
    assert episode.errors[0].http_status == 429 and episode.delegations[0].outcome is Outcome.FAILURE
    assert episode.episode_id == episode_id_for("ops-lead", "s-full")
    assert all(c.at is not None and c.signature is not None for c in episode.calls)
    _assert_episode_round_trips(episode)


# ---- shape: branches, properties and required fields match the Structs -------------------------


def _fields(cls: type) -> tuple[set[str], set[str]]:
    """(all wire names, required wire names) of a Struct, the tag field excluded."""
    fields = msgspec.structs.fields(cls)
    return {f.encode_name for f in fields}, {f.encode_name for f in fields if f.required}


def test_every_event_type_is_a_branch_of_the_schema_and_vice_versa():
    branches = {b["properties"]["type"]["const"]: b for b in TRACE_SCHEMA["oneOf"]}
    assert set(branches) == set(EVENT_TYPES)
    assert len(branches) == len(TRACE_SCHEMA["oneOf"]) == 8
    for tag, branch in branches.items():
        assert branch["title"] == tag
        assert branch["properties"]["payload"] == {"$ref": f"#/$defs/{tag}"}


@pytest.mark.parametrize("tag", sorted(EVENT_TYPES))
def test_the_envelope_and_payload_of_each_branch_match_the_struct(tag):
    cls = EVENT_TYPES[tag]
    branch = next(b for b in TRACE_SCHEMA["oneOf"] if b["properties"]["type"]["const"] == tag)
    names, required = _fields(cls)
    assert set(branch["properties"]) == names | {"type"}
    assert set(branch["required"]) == required | {"type"}
    payload_cls = next(f.type for f in msgspec.structs.fields(cls) if f.name == "payload")
    names, required = _fields(payload_cls)
    definition = TRACE_SCHEMA["$defs"][tag]
    assert set(definition["properties"]) == names
    assert set(definition["required"]) == required


def test_the_schema_defines_no_payload_without_an_event_type():
    assert set(TRACE_SCHEMA["$defs"]) == set(EVENT_TYPES)


@pytest.mark.parametrize(
    ("cls", "node"),
    [
        (EpisodeDistilled, EPISODE_SCHEMA),
        (Lesson, EPISODE_SCHEMA["$defs"]["lesson"]),
        (ErrorSeen, EPISODE_SCHEMA["$defs"]["error"]),
        (EpisodeDelegation, EPISODE_SCHEMA["$defs"]["delegation"]),
        (CallSeen, EPISODE_SCHEMA["$defs"]["call"]),
    ],
    ids=["episode", "lesson", "error", "delegation", "call"],
)
def test_the_episode_schema_matches_the_structs(cls, node):
    names, required = _fields(cls)
    assert set(node["properties"]) == names
    assert set(node["required"]) == required
    assert node["additionalProperties"] is False


def test_enums_in_the_schemas_match_the_python_enums():
    outcomes_ = {o.value for o in Outcome}
    assert set(TRACE_SCHEMA["$defs"]["session_end"]["properties"]["outcome"]["enum"]) == outcomes_
    assert set(TRACE_SCHEMA["$defs"]["delegation_result"]["properties"]["outcome"]["enum"]) == outcomes_
    assert set(EPISODE_SCHEMA["properties"]["outcome"]["enum"]) == outcomes_
    assert set(EPISODE_SCHEMA["$defs"]["lesson"]["properties"]["kind"]["enum"]) == {k.value for k in LessonKind}


def test_schema_version_bounds_are_pinned():
    assert SCHEMA_VERSION == 1
    for branch in TRACE_SCHEMA["oneOf"]:
        assert branch["properties"]["schema_version"] == {"type": "integer", "minimum": 1, "maximum": SCHEMA_VERSION}


# ---- the wire contract: every topic and header kind (somnus.schemas.wire) --------------------------


def test_every_topic_somnus_creates_is_in_the_wire_contract():
    from somnus.config import Settings
    from somnus.schemas.wire import TOPICS
    from somnus.streams.topics import topic_specs

    settings = Settings()
    by_name = {getattr(settings, field): field for field in TOPICS}
    assert set(by_name) == set(topic_specs(settings)), "a topic without its record types in schemas/wire.py"


def test_every_header_kind_is_defined_in_schemas_and_named_once_in_the_wire_contract():
    import ast

    import somnus.schemas
    from somnus.schemas.wire import TOPICS

    root = Path(somnus.schemas.__file__).resolve().parents[1]
    defined: dict[str, bytes] = {}
    for path in root.rglob("*.py"):
        if {".venv", "tests", "build"} & set(path.parts):  # build/: a wheel's copy of the sources
            continue
        for node in ast.parse(path.read_text()).body:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id.startswith("KIND_")
            ):
                assert path.parent.name == "schemas", f"{node.targets[0].id} is defined in {path}, not schemas/"
                defined[node.targets[0].id] = ast.literal_eval(node.value)
    listed = [r.kind for records in TOPICS.values() for r in records if r.kind is not None]
    assert len(listed) == len(set(listed)), "a header kind names two record types"
    assert sorted(listed) == sorted(defined.values())
    for records in TOPICS.values():  # within a topic, a kind (or no header) means one type
        kinds = [r.kind for r in records]
        assert len(kinds) == len(set(kinds))


def test_every_wire_type_is_a_frozen_struct_with_a_decoder():
    from somnus.schemas.wire import TOPICS

    for records in TOPICS.values():
        for r in records:
            members = getattr(r.type, "__args__", (r.type,))  # a tagged union: each of its members
            for member in members:
                assert issubclass(member, msgspec.Struct) and member.__struct_config__.frozen, member
            msgspec.json.Decoder(list[r.type] if r.bundle else r.type)


@pytest.mark.parametrize(
    "record", ["ForgetRequested", "SleepRequested", "KnowledgeIngested", "PromotionRequested", "GoalSet", "GoalClosed"]
)
def test_the_operators_records_round_trip(record):
    from somnus.schemas.forget import ForgetRequested, ForgetSubject
    from somnus.schemas.goals import GoalClosed, GoalSet, GoalStatus
    from somnus.schemas.lifecycle import SleepRequested
    from somnus.schemas.semantic import (
        CallOutcome,
        CausalLinkView,
        IngestedConcept,
        IngestedRelationship,
        KnowledgeIngested,
        PromotionRequested,
    )

    at = datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc)
    value = {
        "ForgetRequested": ForgetRequested(request_id="r1", subject=ForgetSubject.USER, value="u1", at=at),
        "SleepRequested": SleepRequested(at=at, requested_by="operator"),
        "KnowledgeIngested": KnowledgeIngested(
            owner="global",
            source="doc.md",
            at=at,
            concepts=[
                IngestedConcept(
                    name="refund",
                    definition="money back",
                    properties={"max": 3},
                    relationships=[IngestedRelationship(relation="needs", target="receipt")],
                )
            ],
        ),
        "PromotionRequested": PromotionRequested(
            owner="agent:a",
            at=at,
            request_id="sleep:1",
            links=[
                CausalLinkView(
                    event_signature="tool:grasp",
                    tool="grasp",
                    outcome="error",
                    valence="negative",
                    strength=0.8,
                    confidence=0.7,
                    observation_count=5,
                    observation_times=[at],
                )
            ],
            calls=[CallOutcome("grasp", False, at, "e1", "a")],
        ),
        "GoalSet": GoalSet(goal_id="g1", agent="a", text="ship the refund flow", at=at, user_id="u1", set_by="cli"),
        "GoalClosed": GoalClosed(goal_id="g1", agent="a", at=at, status=GoalStatus.DROPPED),
    }[record]
    raw = encode(value)
    assert msgspec.json.decode(raw, type=type(value)) == value
    assert encode(msgspec.json.decode(raw, type=type(value))) == raw


def test_the_key_topic_carries_data_keys_and_sealed_records_open_to_their_wire_type():
    """The forget branch's records: ``DataKey`` on the key topic round-trips, and a sealed record of a
    sealed topic opens to bytes that decode as the type the wire contract lists for it."""
    from somnus.schemas.sealed import HEADER, DataKey, decode_key, encode_key, new_key, open_value, seal, sealed_key_id
    from somnus.schemas.wire import SEALED_TOPICS, TOPICS, record_type

    assert record_type("keys_topic", None).type is DataKey
    assert SEALED_TOPICS <= set(TOPICS) and "keys_topic" not in SEALED_TOPICS
    assert HEADER != "somnus-kind"  # the sealing mark is not a header kind
    key = new_key("aga", "s1", "u1")
    assert decode_key(encode_key(key)) == key
    at = datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc)
    from somnus.schemas.forget import ForgetRequested, ForgetSubject

    plain = encode(ForgetRequested(request_id="r1", subject=ForgetSubject.USER, value="u1", at=at))
    sealed = seal(key, plain)
    assert sealed_key_id(sealed) == key.key_id and plain not in sealed
    opened = open_value(sealed, {key.key_id: key.key})
    assert opened == plain
    assert msgspec.json.decode(opened, type=record_type("facts_topic", b"forget").type).value == "u1"
