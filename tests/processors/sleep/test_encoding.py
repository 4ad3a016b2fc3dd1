"""somnus.processors.sleep.encoding: a plan's events as columns (``SleepPlan.encoded``) are its events (``SleepPlan.events``)
encoded one by one (``encode_lifecycle``), byte for byte, and the JSON texts the columns are made of are
msgspec's."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import msgspec
import numpy as np
import polars as pl
import pyarrow as pa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from somnus.processors.sleep import encoding
from somnus.processors.sleep.config import SleepConfig
from somnus.processors.sleep.plan import SleepInputs, plan_sleep
from somnus.processors.sleep.schedule import from_us
from somnus.schemas.lifecycle import encode_lifecycle

NOW = datetime(2024, 6, 5, 3, 0, tzinfo=timezone.utc)
ENC = msgspec.json.Encoder()
# Texts that exercise JSON: quotes, backslashes, control characters, non-ASCII, surrogate-free.
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
NASTY = st.sampled_from(['q"uote', "back\\slash", "tab\tnl\n", "ünï", "\x00\x1f", "plain", "a,b", '",\\"'])


def msgspec_text(value: Any) -> str:
    return ENC.encode(value).decode()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=True, allow_infinity=True), st.none(), st.booleans()
        )
    )
)
@example([0.1, 1e-7, 1e16, 2.0, -0.0, 5e-324, None])
def test_json_numbers_are_msgspec_texts(values):
    assert encoding.json_numbers(values).to_pylist() == [msgspec_text(v) for v in values]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1)))
def test_json_ints_are_msgspec_texts(values):
    assert encoding.json_ints(np.array(values, dtype=np.int64)).to_pylist() == [msgspec_text(v) for v in values]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(TEXT, NASTY)), st.booleans())
def test_json_strings_are_msgspec_texts(values, repeated):
    got = encoding.json_strings(pa.array(values, pa.string()), repeated=repeated).to_pylist()
    assert got == [msgspec_text(v) for v in values]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(encoding.MIN_SECONDS - 10, encoding.MAX_SECONDS + 10)))
@example([encoding.MIN_SECONDS, encoding.MAX_SECONDS, 0, -1, 951_782_400])
def test_json_seconds_are_msgspec_datetimes_or_none_out_of_range(seconds):
    got = encoding.json_seconds(np.array(seconds, dtype=np.int64))
    if any(s < encoding.MIN_SECONDS or s > encoding.MAX_SECONDS for s in seconds):
        assert got is None
    else:
        assert got.to_pylist() == [msgspec_text(from_us(s * 1_000_000)) for s in seconds]


memory = st.fixed_dictionaries(
    {
        "agent": st.sampled_from(["a", "b", 'q"', "ü"]),
        "layer": st.sampled_from(["hippocampus", "hippocampus", "atl", "angular_gyrus"]),
        "age_s": st.integers(0, 60 * 86_400),
        "micros": st.sampled_from([0, 0, 123_456]),
        "idle_s": st.one_of(st.none(), st.integers(0, 60 * 86_400)),
        "access": st.integers(0, 30),
        "importance": st.floats(0, 1),
        "outcome": st.sampled_from(["success", "failure", "partial", "", "a very long outcome text"]),
        "user": st.booleans(),
        "edges": st.integers(0, 12),
        "size": st.integers(0, 5000),
        "long_term": st.booleans(),
        "compressed": st.booleans(),
        "retention": st.one_of(st.none(), st.floats(0, 1)),
        "keys": st.lists(st.one_of(st.sampled_from(["tool:x", "k" * 60, "ü" * 45, 'o"k', "host1"]), TEXT), max_size=8),
        "domain": st.sampled_from(["", "billing", "ops"]),
        "long_id": st.booleans(),
    }
)


def memory_rows(specs: list[dict[str, Any]], suffixes: list[str]) -> pl.DataFrame:
    rows = []
    for k, (m, suffix) in enumerate(zip(specs, suffixes, strict=True)):
        created = NOW - timedelta(seconds=m["age_s"], microseconds=m["micros"])
        rows.append(
            {
                "memory_id": (f"m{k:03d}{suffix}" + ("x" * 190 if m["long_id"] else "")),
                "agent": m["agent"],
                "layer": m["layer"],
                "created_at": created,
                "last_access": None if m["idle_s"] is None else NOW - timedelta(seconds=m["idle_s"]),
                "access_count": m["access"],
                "importance": m["importance"],
                "outcome": m["outcome"],
                "is_user_interaction": m["user"],
                "edge_count": m["edges"],
                "size_bytes": m["size"],
                "long_term": m["long_term"],
                "compressed": m["compressed"],
                "retention": m["retention"],
                "index_keys": m["keys"],
                "domain": m["domain"],
            }
        )
    return pl.DataFrame(
        rows,
        schema_overrides={
            "created_at": pl.Datetime("us", "UTC"),
            "last_access": pl.Datetime("us", "UTC"),
            "retention": pl.Float64,
            "index_keys": pl.List(pl.String),
            "importance": pl.Float64,
        },
    )


def plan_of(specs, suffixes, pairs, now, cap):
    frame = memory_rows(specs, suffixes)
    ids = frame["memory_id"].to_list()
    edges = pl.DataFrame(
        {
            "src": [ids[a % len(ids)] for a, _ in pairs],
            "dst": [ids[b % len(ids)] for _, b in pairs],
            "weight": [0.5] * len(pairs),
        },
        schema={"src": pl.String, "dst": pl.String, "weight": pl.Float64},
    )
    plan = plan_sleep(SleepInputs(frame, edges), now=now, config=SleepConfig(max_episodes=cap))
    assert plan is not None
    return plan


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    st.lists(memory, min_size=1, max_size=40),
    st.data(),
    st.lists(st.tuples(st.integers(0, 99), st.integers(0, 99)), max_size=60),
    st.integers(0, 999_999),
    st.sampled_from([None, 1, 3, 50]),
)
def test_encoded_events_are_the_events_encoded_one_by_one(specs, data, pairs, micros, cap):
    suffixes = data.draw(st.lists(st.one_of(st.just(""), NASTY), min_size=len(specs), max_size=len(specs)))
    now = NOW + timedelta(microseconds=micros)
    columns = plan_of(specs, suffixes, pairs, now, cap)
    events = plan_of(specs, suffixes, pairs, now, cap)  # the same plan, read event by event
    encoded = columns.encoded()
    expected = list(events.events())
    assert encoded.seq.to_pylist() == list(range(len(expected)))
    assert encoded.kind.to_pylist() == [type(e).__name__ for e in expected]
    assert encoded.memory_id.to_pylist() == [getattr(e, "memory_id", None) for e in expected]
    assert encoded.body.to_pylist() == [encode_lifecycle(e).decode() for e in expected]
    assert columns.report == events.report  # the compact sizes the report sums, both ways
    start = data.draw(st.integers(0, len(expected) + 1))
    resumed = columns.encoded(start)
    assert resumed.seq.to_pylist() == list(range(start, len(expected)))
    assert resumed.body.to_pylist() == [encode_lifecycle(e).decode() for e in expected[start:]]


def test_the_bulk_kinds_are_encoded_as_columns_and_cover_every_field():
    specs = [
        {
            "agent": "a",
            "layer": "hippocampus",
            "age_s": 40 * 86_400,
            "micros": 0,
            "idle_s": idle,
            "access": 0,
            "importance": 0.1,
            "outcome": outcome,
            "user": user,
            "edges": 0,
            "size": 900,
            "long_term": False,
            "compressed": False,
            "retention": None,
            "keys": ["tool:x"],
            "domain": "",
            "long_id": False,
        }
        for idle, outcome, user in [
            (30 * 86_400, "failure", False),
            (4 * 86_400, "failure", False),
            (60, "success", True),
            (4 * 86_400, "partial", False),
        ]
    ]
    plan = plan_of(specs, [""] * len(specs), [], NOW, None)
    columnar = {type(e).__name__ for e in plan.events()} & {
        "MemoryProtected",
        "MemoryCompressed",
        "MemoryPruned",
        "MemoryRescored",
        "ReviewScheduled",
    }
    assert columnar == {"MemoryProtected", "MemoryCompressed", "MemoryPruned", "MemoryRescored", "ReviewScheduled"}
    encoded = plan.encoded()
    assert encoded.body.to_pylist() == [encode_lifecycle(e).decode() for e in plan.events()]
    assert sum(s.encode is not None for s in plan.segments) == 5  # none of them event by event
