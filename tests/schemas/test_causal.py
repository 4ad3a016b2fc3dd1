"""somnus.schemas.causal: signatures (what makes two calls "the same call") and the NAc / SCN records."""

from __future__ import annotations

import doctest
import hashlib
import json
import random
import re
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from somnus.schemas import causal
from somnus.schemas.causal import (
    MAX_DEPTH,
    MAX_ITEMS,
    MAX_KEYS,
    MAX_TOKEN,
    SIGNATURE_BYTES,
    CausalLinkUpdated,
    LinkLevel,
    OutcomeObserved,
    PredictedOutcome,
    Prediction,
    TemporalBinCounted,
    ToolCount,
    Valence,
    event_signature,
    normalise_params,
    outcome_signature,
    tool_signature,
)

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_the_module_examples_run():
    assert doctest.testmod(causal).failed == 0


def test_pinned_limits():
    assert (SIGNATURE_BYTES, MAX_DEPTH, MAX_KEYS, MAX_ITEMS, MAX_TOKEN) == (8, 6, 64, 16, 32)
    assert {v.value for v in Valence} == {"positive", "neutral", "negative"}
    assert {v.value for v in LinkLevel} == {"call", "tool"}


# ---- normalisation: one rule per row ----------------------------------------------------------


class _Opaque:
    """A value of no JSON type, with a stable repr (test ids must not hold an address: pytest-xdist)."""

    def __repr__(self) -> str:
        return "<opaque>"


@pytest.mark.parametrize(
    ("params", "template"),
    [
        ({"n": 3, "x": 2.5, "flag": True, "none": None}, {"n": "<n>", "x": "<n>", "flag": True, "none": None}),
        (
            {"reservation_id": "ABCDEF", "user_id": "mia_li_3668", "id": 7, "api_key": "k", "token": "t"},
            {"reservation_id": "<id>", "user_id": "<id>", "id": "<id>", "api_key": "<id>", "token": "<id>"},
        ),
        (
            {"first_name": "Mia", "last_name": "Li", "dob": "1990-04-05", "email": "mia@x.io", "userName": "mia"},
            {"first_name": "<id>", "last_name": "<id>", "dob": "<id>", "email": "<id>", "user_name": "<id>"},
        ),
        ({"cmd": "kubectl rollout status deploy/web"}, {"cmd": "<cmd:kubectl>"}),
        ({"command": "FOO=1 BAR=2 /usr/local/bin/helm upgrade"}, {"command": "<cmd:helm>"}),
        ({"script": "   "}, {"script": ""}),
        ({"url": "https://API.instantly.ai/v1/leads?page=2"}, {"url": "<url:api.instantly.ai>"}),
        ({"target": "mailto-less://"}, {"target": "<url>"}),
        ({"contact": "ops@acme.io"}, {"contact": "<email>"}),
        ({"ref": "6f1c1a6e-7d0c-4a43-9a55-0c7f2d1f4b1e"}, {"ref": "<id>"}),
        (
            {"at": "2024-05-15T15:00:00Z", "day": "2024-05-20", "us": "5/20/2024", "clock": "9:30 am"},
            {"at": "<time>", "day": "<date>", "us": "<date>", "clock": "<time>"},
        ),
        ({"amount": "1,250.00", "pct": "15%", "neg": "-3"}, {"amount": "<n>", "pct": "<n>", "neg": "<n>"}),
        (
            {"cabin": "economy", "kind": "one_way", "sel": "table.pricing", "m": "basic-economy"},
            {"cabin": "economy", "kind": "one_way", "sel": "table.pricing", "m": "basic-economy"},
        ),
        (
            {"flight_number": "HAT136", "payment": "gift_card_7815826", "code": "0x1f"},
            {"flight_number": "<id>", "payment": "<id>", "code": "<id>"},
        ),
        (
            {"origin": "JFK", "q": "rate limits of the instantly api", "word": "Hello"},
            {"origin": "<text>", "q": "<text>", "word": "<text>"},
        ),
        ({"long": "a" * (MAX_TOKEN + 1)}, {"long": "<text>"}),
        ({"empty": ""}, {"empty": ""}),
        ({"flights": [{"n": "HAT1"}, {"n": "HAT2"}, {"n": "HAT3"}]}, {"flights": [{"n": "<id>"}]}),
        ({"tags": ["b", "a", "b"]}, {"tags": ["a", "b"]}),
        ({"user_1": "Xavier", "user_2": "Yan"}, {"<key>": "<text>"}),
        ({"cmd": "/usr/bin/python3 -m x"}, {"cmd": "<cmd:python#>"}),
        ({"k": 1, "user_1": "a b", "user_2": 3}, {"k": "<n>", "<key>": ["<n>", "<text>"]}),
        ({"dryRun": False, "HTTPMethod": "get"}, {"dry_run": False, "httpmethod": "get"}),
        ({"obj": _Opaque()}, {"obj": "<value>"}),
    ],
    ids=lambda v: json.dumps(v, default=str)[:40] if isinstance(v, dict) else None,
)
def test_normalisation_rules(params, template):
    assert normalise_params(params) == template


def test_nesting_past_the_limit_is_cut():
    deep: Any = "x"
    for _ in range(MAX_DEPTH + 2):
        deep = {"a": deep}
    out = normalise_params(deep)
    for _ in range(MAX_DEPTH):
        out = out["a"]
    assert out == "<deep>"


def test_keys_and_items_past_their_limits_are_cut():
    many = {f"k{chr(97 + i // 26)}{chr(97 + i % 26)}": 1 for i in range(MAX_KEYS + 10)}
    assert len(normalise_params(many)) == MAX_KEYS
    assert len(normalise_params({"xs": [{"k": c} for c in "abcdefghijklmnopqrstuvwxyz"]})["xs"]) == MAX_ITEMS


# ---- the same call hashes the same; different calls do not -------------------------------------

SAME_CALLS = [
    ("get_reservation_details", {"reservation_id": "JG7FMM"}, {"reservation_id": "LQ940Q"}),
    ("get_user_details", {"user_id": "mia_li_3668"}, {"user_id": "omar_davis_3817"}),
    (
        "search_direct_flight",
        {"origin": "JFK", "destination": "SEA", "date": "2024-05-20"},
        {"origin": "DEN", "destination": "IAH", "date": "2024-05-27"},
    ),
    (
        "update_reservation_flights",
        {
            "reservation_id": "JG7FMM",
            "cabin": "economy",
            "payment_id": "credit_card_2929732",
            "flights": [
                {"flight_number": "HAT028", "date": "2024-05-21"},
                {"flight_number": "HAT277", "date": "2024-05-21"},
            ],
        },
        {
            "cabin": "economy",
            "payment_id": "gift_card_3481935",
            "reservation_id": "2FBBAH",
            "flights": [
                {"flight_number": "HAT080", "date": "2024-05-28"},
                {"flight_number": "HAT076", "date": "2024-05-28"},
                {"flight_number": "HAT255", "date": "2024-05-30"},
            ],
        },
    ),
    (
        "transfer_to_human_agents",
        {"summary": "User Omar Rossi needs a name change on FQ8APE."},
        {"summary": "The user wants to cancel UDMOP1 and XAZ3C0."},
    ),
    (
        "http_get",
        {"url": "https://api.github.com/repos/acme/app/issues?page=1"},
        {"url": "https://api.github.com/repos/other/lib/pulls/7"},
    ),
    ("shell", {"cmd": "helm upgrade web ./chart"}, {"cmd": "helm rollback web 3"}),
    (
        "log",
        {"at": "2024-05-15T15:00:00Z", "request": "6f1c1a6e-7d0c-4a43-9a55-0c7f2d1f4b1e"},
        {"at": "2025-01-01T00:00:00.123+05:30", "request": "00000000-0000-0000-0000-000000000001"},
    ),
    ("send_certificate", {"user_id": "mei_brown_7075", "amount": 200}, {"amount": 50, "user_id": "noah_muller_9847"}),
]


@pytest.mark.parametrize(("tool", "a", "b"), SAME_CALLS, ids=[c[0] for c in SAME_CALLS])
def test_the_same_call_with_other_ids_times_and_text_has_one_signature(tool, a, b):
    assert event_signature(tool, a) == event_signature(tool, b)


DIFFERENT_CALLS = [
    (("get_reservation_details", {"reservation_id": "X1"}), ("cancel_reservation", {"reservation_id": "X1"})),
    (("book", {"cabin": "economy"}), ("book", {"cabin": "business"})),
    (("book", {"cabin": "economy"}), ("book", {"cabin": "economy", "insurance": "yes"})),
    (("http_get", {"url": "https://api.github.com/x"}), ("http_get", {"url": "https://api.instantly.ai/x"})),
    (("shell", {"cmd": "helm upgrade"}), ("shell", {"cmd": "kubectl apply"})),
    (("t", {"a": True}), ("t", {"a": False})),
    (("t", {"a": 1}), ("t", {"a": [1]})),
    (("t", {}), ("t", {"a": None})),
]


@pytest.mark.parametrize(("one", "other"), DIFFERENT_CALLS)
def test_different_calls_have_different_signatures(one, other):
    assert event_signature(*one) != event_signature(*other)


def test_signature_domains_are_separate():
    assert tool_signature("t") != event_signature("t", {}) != outcome_signature("t")
    assert event_signature("t", None) == event_signature("t", {})
    assert tool_signature("a") != tool_signature("b")


def test_signatures_are_persisted_keys_and_stay_what_they_were():
    # These hashes key the NAc's table and rows: a change here re-keys every stored causal link.
    template = '{"reservation_id":"<id>"}'
    expected = hashlib.blake2b(f"call\x1fget_reservation_details\x1f{template}".encode(), digest_size=8).hexdigest()
    assert event_signature("get_reservation_details", {"reservation_id": "JG7FMM"}) == expected
    assert expected == "fea033c472654d4c"
    assert tool_signature("book_reservation") == hashlib.blake2b(b"tool\x1fbook_reservation", digest_size=8).hexdigest()
    assert outcome_signature("ok") == hashlib.blake2b(b"outcome\x1fok", digest_size=8).hexdigest()
    assert re.fullmatch(r"[0-9a-f]{16}", event_signature("x", {"y": [1, {"z": "w"}]}))


# ---- properties -------------------------------------------------------------------------------

keys = st.sampled_from(["a", "b", "cabin", "reservation_id", "q", "url", "flights", "cmd", "n"])
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(["economy", "HAT136", "2024-05-20", "https://a.io/x"])
)
json_args = st.dictionaries(
    keys,
    st.recursive(
        scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=3), max_leaves=8
    ),
    max_size=5,
)


def _renumber(value: Any, rnd: random.Random) -> Any:
    """Another call of the same kind: other numbers, other digits in tokens, lists shuffled and doubled."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return rnd.randint(-(10**6), 10**6)
    if isinstance(value, str):
        return re.sub(r"\d", lambda _: str(rnd.randint(0, 9)), value)
    if isinstance(value, dict):
        return {k: _renumber(v, rnd) for k, v in value.items()}
    items = [_renumber(v, rnd) for v in value] * rnd.randint(1, 2)
    rnd.shuffle(items)
    return items


@PROPERTY
@given(json_args, st.randoms(use_true_random=False))
@example({"flights": [{"n": "HAT1", "d": "2024-01-01"}, {"n": "HAT22", "d": "2024-12-31"}]}, random.Random(1))
def test_other_numbers_digits_and_list_orders_do_not_change_the_signature(args, rnd):
    assert event_signature("tool", _renumber(args, rnd)) == event_signature("tool", args)


@PROPERTY
@given(json_args)
def test_a_template_is_plain_json_and_deterministic(args):
    template = normalise_params(args)
    assert json.loads(json.dumps(template)) == template
    assert normalise_params(json.loads(json.dumps(args))) == template
    assert event_signature("t", args) == event_signature("t", dict(reversed(list(args.items()))))


# ---- records round-trip -----------------------------------------------------------------------

aware = st.datetimes(
    min_value=datetime(1971, 1, 1),
    max_value=datetime(2200, 1, 1),
    timezones=st.integers(-23 * 60, 23 * 60).map(lambda m: timezone(timedelta(minutes=m))),
)
texts = st.text(max_size=12)
signatures = st.text("0123456789abcdef", min_size=8, max_size=64)  # the hex records carry (schemas.causal.Signature)
unit = st.floats(0, 1)

observed = st.builds(
    OutcomeObserved,
    event_signature=signatures,
    level=st.sampled_from(LinkLevel),
    tool=texts,
    outcome_signature=texts,
    outcome=texts,
    valence=st.sampled_from(Valence),
    agent=texts,
    observed_at=aware,
    context=st.dictionaries(texts, texts, max_size=3),
    episode_id=st.uuids(),
    src_partition=st.integers(0, 64),
    src_offset=st.integers(0, 2**62),
    index=st.integers(0, 999),
)
updated = st.builds(
    CausalLinkUpdated,
    event_signature=signatures,
    level=st.sampled_from(LinkLevel),
    tool=texts,
    outcome_signature=texts,
    outcome=texts,
    valence=st.sampled_from(Valence),
    agent=texts,
    episode_id=st.uuids(),
    observed_at=aware,
    src_partition=st.integers(0, 64),
    src_offset=st.integers(0, 2**62),
    index=st.integers(0, 999),
    target=st.sampled_from([0.0, 1.0]),
    alpha=unit,
    strength_before=unit,
    strength=unit,
    observations=st.integers(0, 10**6),
    event_observations=st.integers(0, 10**6),
    confidence=unit,
)
predicted = st.builds(
    Prediction,
    tool=texts,
    event_signature=texts,
    known=st.booleans(),
    basis=st.sampled_from(["call", "tool", "none"]),
    observations=st.integers(0, 100),
    outcomes=st.lists(
        st.builds(
            PredictedOutcome,
            outcome=texts,
            valence=st.sampled_from(Valence),
            strength=unit,
            confidence=unit,
            observations=st.integers(0, 99),
            in_context=st.none() | st.booleans(),
        ),
        max_size=3,
    ),
    params=st.none() | st.dictionaries(texts, texts, max_size=2),
)
records = st.one_of(
    observed,
    updated,
    predicted,
    st.builds(ToolCount, texts, st.integers(0, 999), st.integers(0, 999)),
    st.builds(
        TemporalBinCounted,
        texts,
        texts,
        st.sampled_from(["hour", "weekday"]),
        st.integers(0, 167),
        st.integers(0, 99),
        st.integers(0, 99),
        st.integers(0, 99),
    ),
)


@PROPERTY
@given(records)
def test_every_record_round_trips_byte_for_byte(record):
    raw = msgspec.json.encode(record)
    back = msgspec.json.decode(raw, type=type(record))
    assert back == record and msgspec.json.encode(back) == raw


def test_the_prediction_json_is_the_issues_list_shape():
    p = Prediction(
        tool="t",
        event_signature="s",
        known=True,
        basis="call",
        observations=4,
        outcomes=[
            PredictedOutcome(outcome="ok", valence=Valence.POSITIVE, strength=0.75, confidence=4 / 6, observations=3),
            PredictedOutcome(
                outcome="http:429",
                valence=Valence.NEUTRAL,
                strength=0.25,
                confidence=4 / 6,
                observations=1,
                in_context=False,
            ),
        ],
    )
    assert p.outcomes_json() == [
        {"outcome": "ok", "valence": "positive", "strength": 0.75, "confidence": 4 / 6, "observations": 3},
        {
            "outcome": "http:429",
            "valence": "neutral",
            "strength": 0.25,
            "confidence": 4 / 6,
            "observations": 1,
            "in_context": False,
        },
    ]
    assert p.to_json()["known"] is True and p.to_json()["outcomes"] == p.outcomes_json()


def test_tool_count_error_rate():
    assert ToolCount("t", 104, 42).error_rate == 42 / 104
    assert ToolCount("t", 0, 0).error_rate == 0.0


def test_records_are_frozen():
    with pytest.raises(AttributeError):
        ToolCount("t", 1, 0).calls = 2  # type: ignore[misc]
    ob = OutcomeObserved(event_signature="e", **_OBSERVED)
    with pytest.raises(AttributeError):
        ob.index = 1  # type: ignore[misc]


@pytest.mark.parametrize("signature", ["support|lookup", "", "0123456", "0123456789ABCDEF", "g" * 16, "0" * 65])
def test_a_record_whose_event_signature_is_not_hex_is_rejected(signature):
    """Its first 8 characters pick its partition (``signature_partition``): anything else is a schema error."""
    good = msgspec.json.encode(OutcomeObserved(**{**_OBSERVED, "event_signature": "0123456789abcdef"}))
    assert msgspec.json.decode(good, type=OutcomeObserved).event_signature == "0123456789abcdef"
    with pytest.raises(msgspec.ValidationError, match="event_signature"):
        msgspec.json.decode(good.replace(b"0123456789abcdef", signature.encode()), type=OutcomeObserved)


_OBSERVED = dict(
    level=LinkLevel.CALL,
    tool="lookup",
    outcome_signature="fedcba9876543210",
    outcome="ok",
    valence=Valence.POSITIVE,
    agent="a",
    observed_at=datetime(2026, 1, 1, tzinfo=timezone.utc),
    episode_id=uuid.UUID(int=1),
    src_partition=0,
    src_offset=0,
    index=0,
)
