"""somnus.schemas.briefing: the briefing and swarm records round-trip through JSON and reject bad values."""

from __future__ import annotations

import doctest
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

import somnus.schemas.briefing
from somnus.schemas.briefing import (
    BRIEFING_SCHEMA_VERSION,
    BriefingGenerated,
    BriefingServed,
    FactPromoted,
    FactUsed,
    PromotionReason,
    ServedFact,
)

names = st.text(min_size=1, max_size=30)
times = st.datetimes(
    min_value=datetime(2000, 1, 1),
    max_value=datetime(2100, 1, 1),
    timezones=st.sampled_from([timezone.utc, timezone(timedelta(hours=-5))]),
)
confidences = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
counts = st.integers(min_value=0, max_value=10**9)

served_facts = st.builds(
    ServedFact,
    triple_id=names,
    source=names,
    predicate=names,
    target=names,
    scope=names,
    confidence=confidences,
    source_name=names,
    target_name=names,
)
generated = st.builds(
    BriefingGenerated,
    schema_version=st.just(BRIEFING_SCHEMA_VERSION),
    briefing_id=names,
    agent=names,
    generated_at=times,
    budget=counts,
    markdown=st.text(),
    chars=counts,
    lessons=counts,
    facts=st.lists(served_facts, max_size=3),
    strategies=counts,
    dropped_lessons=counts,
    dropped_facts=counts,
    dropped_strategies=counts,
)
served = st.builds(
    BriefingServed,
    schema_version=st.just(BRIEFING_SCHEMA_VERSION),
    briefing_id=names,
    agent=names,
    session_id=names,
    served_at=times,
    facts=st.lists(served_facts, max_size=3),
)
used = st.builds(
    FactUsed,
    schema_version=st.just(BRIEFING_SCHEMA_VERSION),
    agent=names,
    session_id=names,
    briefing_id=names,
    triple_id=names,
    source=names,
    predicate=names,
    target=names,
    scope=names,
    confidence=confidences,
    entity=names,
    seq=counts,
    used_at=times,
)
promoted = st.builds(
    FactPromoted,
    schema_version=st.just(BRIEFING_SCHEMA_VERSION),
    promotion_id=st.uuids(),
    source=names,
    predicate=names,
    target=names,
    from_scope=names,
    to_scope=names,
    reason=st.sampled_from(PromotionReason),
    promoted_at=times,
    confidence=confidences,
    learning_rate=st.none() | st.sampled_from(["conservative", "moderate", "aggressive"]),
    threshold=st.none() | st.integers(min_value=1, max_value=10),
    users=st.lists(names, max_size=3),
    teams=st.lists(names, max_size=3),
)


@given(st.one_of(generated, served, used, promoted))
def test_every_record_round_trips_through_json(record):
    raw = msgspec.json.encode(record)
    back = msgspec.json.decode(raw, type=type(record))
    assert back == record
    assert msgspec.json.encode(back) == raw


def test_records_are_frozen():
    p = FactPromoted(
        schema_version=1,
        promotion_id=uuid.UUID(int=1),
        source="s",
        predicate="p",
        target="t",
        from_scope="agent:a",
        to_scope="team:l",
        reason=PromotionReason.MANUAL,
        promoted_at=datetime(2024, 5, 1, tzinfo=timezone.utc),
        confidence=0.9,
    )
    with pytest.raises(AttributeError):
        p.to_scope = "global"  # type: ignore[misc]


def test_promotion_reasons_are_manual_and_utilisation():
    assert {r.value for r in PromotionReason} == {"manual", "utilisation"}


def _used(**overrides: Any) -> dict[str, Any]:
    base = {
        "schema_version": 1,
        "agent": "a",
        "session_id": "s",
        "briefing_id": "b",
        "triple_id": "t",
        "source": "tool:x",
        "predicate": "calls",
        "target": "api:y",
        "scope": "agent:a",
        "confidence": 0.9,
        "entity": "x",
        "seq": 3,
        "used_at": "2024-05-01T00:00:00Z",
    }
    base.update(overrides)
    return base


@pytest.mark.parametrize(
    ("overrides", "path"),
    [
        ({"confidence": 1.5}, "$.confidence"),
        ({"confidence": -0.1}, "$.confidence"),
        ({"seq": -1}, "$.seq"),
        ({"agent": ""}, "$.agent"),
        ({"used_at": "2024-05-01T00:00:00"}, "$.used_at"),  # event time must carry its offset
        ({"schema_version": 2}, "$.schema_version"),
        ({"schema_version": 0}, "$.schema_version"),
    ],
)
def test_bad_values_are_rejected_naming_the_field(overrides, path):
    with pytest.raises(msgspec.ValidationError, match=path.replace("$", r"\$").replace(".", r"\.")):
        msgspec.json.decode(msgspec.json.encode(_used(**overrides)), type=FactUsed)


def test_a_good_record_decodes():
    assert msgspec.json.decode(msgspec.json.encode(_used()), type=FactUsed).seq == 3


def test_an_unknown_promotion_reason_is_rejected():
    raw = {
        "schema_version": 1,
        "promotion_id": str(uuid.UUID(int=1)),
        "source": "s",
        "predicate": "p",
        "target": "t",
        "from_scope": "agent:a",
        "to_scope": "team:l",
        "reason": "vibes",
        "promoted_at": "2024-05-01T00:00:00Z",
        "confidence": 0.5,
    }
    with pytest.raises(msgspec.ValidationError, match=r"\$\.reason"):
        msgspec.convert(raw, FactPromoted)


def test_the_docstring_examples_run():
    assert doctest.testmod(somnus.schemas.briefing).failed == 0
