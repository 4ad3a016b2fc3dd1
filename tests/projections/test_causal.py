"""somnus.projections.causal: link updates read off the topic as text and raw JSON, written with DuckDB's casts;
the SCN's bins counted by DuckDB as ``somnus.processors.prediction.rhythms`` counts them (a real DuckDB file, no broker)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import duckdb
import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from somnus.processors.prediction.rhythms import index_of, marks_of_episode
from somnus.projections import schema
from somnus.projections.causal import UPDATE_COLUMNS, CausalProjection, UpdateRow, add_temporal_bins
from somnus.schemas.causal import CausalLinkUpdated, LinkLevel, Valence
from somnus.schemas.episodes import CallSeen, EpisodeDistilled
from somnus.schemas.events import Outcome


def test_the_projectors_row_has_every_field_of_the_update_in_the_tables_order():
    # The projector decodes updates into UpdateRow: a field added to CausalLinkUpdated but not here
    # would be dropped without a word, so the two must name the same fields.
    row_names = [f.encode_name for f in msgspec.structs.fields(UpdateRow)]
    assert sorted(row_names) == sorted(f.encode_name for f in msgspec.structs.fields(CausalLinkUpdated))
    assert [f.name for f in msgspec.structs.fields(UpdateRow)] == list(UPDATE_COLUMNS)


texts = st.text(min_size=1, max_size=12)
instants = st.datetimes(
    min_value=datetime(2000, 1, 1),
    max_value=datetime(2100, 1, 1),
    timezones=st.sampled_from([timezone.utc, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-7))]),
)
updates = st.builds(
    CausalLinkUpdated,
    event_signature=texts,
    level=st.sampled_from(list(LinkLevel)),
    tool=texts,
    outcome_signature=texts,
    outcome=texts,
    valence=st.sampled_from(list(Valence)),
    agent=texts,
    episode_id=st.uuids(),
    observed_at=instants,
    src_partition=st.integers(0, 63),
    src_offset=st.integers(0, 2**40),
    index=st.integers(0, 1000),
    target=st.sampled_from([0.0, 1.0]),
    alpha=st.floats(0, 1),
    strength_before=st.floats(0, 1),
    strength=st.floats(0, 1),
    observations=st.integers(0, 10**6),
    event_observations=st.integers(0, 10**6),
    confidence=st.floats(0, 1),
    strengths=st.dictionaries(texts, st.floats(0, 1), max_size=4),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(updates, min_size=1, max_size=8, unique_by=lambda u: (u.event_signature, u.src_partition)))
def test_written_updates_read_back_as_the_typed_updates_were(tmp_path_factory, ups):
    con = duckdb.connect(str(tmp_path_factory.mktemp("causal") / "c.duckdb"))
    schema.init(con)
    proj = CausalProjection(con)
    assert proj.write(con, [msgspec.json.encode(ups)]) == len(ups)
    got = con.execute(f"SELECT {', '.join(UPDATE_COLUMNS)} FROM causal_link_updates").fetchall()
    want = [
        (
            u.event_signature,
            u.outcome_signature,
            u.level.value,
            u.tool,
            u.outcome,
            u.valence.value,
            u.agent,
            u.episode_id,
            u.observed_at,
            u.src_partition,
            u.src_offset,
            u.index,
            u.target,
            u.alpha,
            u.strength_before,
            u.strength,
            u.observations,
            u.event_observations,
            u.confidence,
            u.strengths,
        )
        for u in ups
    ]
    got = [(*g[:7], uuid.UUID(str(g[7])), g[8], *g[9:19], msgspec.json.decode(g[19])) for g in got]
    assert got == want  # the instants compare equal whatever zone DuckDB returns them in
    for sig, osig, v, at in con.execute(
        "SELECT event_signature, outcome_signature, strength, updated_at FROM causal_links"
    ).fetchall():
        # every link of an event as of the event's latest update; one that update does not name, as of
        # the latest update of that link itself (updates are in order)
        last = [u for u in ups if u.event_signature == sig][-1]
        if osig in last.strengths:
            assert (at, v) == (last.observed_at, last.strengths[osig])
        else:
            u = [u for u in ups if (u.event_signature, u.outcome_signature) == (sig, osig)][-1]
            assert (at, v) == (u.observed_at, u.strength)
    con.close()  # a failing example's connection (and its DuckDB threads) is not kept while shrinking


# Offsets as runtimes write them, the extremes included, so a mark's local day, weekday and month can
# differ from its UTC ones; instants cover days 28-31 (week_of_month's last bin) and leap days.
zones = st.sampled_from(
    [
        timezone.utc,
        timezone(timedelta(hours=14)),
        timezone(timedelta(hours=-12)),
        timezone(timedelta(hours=5, minutes=45)),
        timezone(timedelta(hours=-3, minutes=-30)),
        timezone(timedelta(hours=23, minutes=59)),
    ]
)
local_instants = st.datetimes(min_value=datetime(1999, 12, 1), max_value=datetime(2031, 3, 1), timezones=zones)
calls = st.builds(
    CallSeen,
    tool=st.sampled_from(["search", "book", "pay"]),
    ok=st.sampled_from([True, False, None]),
    at=st.none() | local_instants,
)


@st.composite
def episodes(draw):
    start = draw(local_instants)
    return EpisodeDistilled(
        episode_id=uuid.uuid4(),
        schema_version=1,
        agent=draw(st.sampled_from(["airline", "support", "ops"])),
        session_id="s",
        task="t",
        goal=None,
        user_id=None,
        summary="",
        outcome=draw(st.sampled_from(list(Outcome))),
        started_at=start,
        ended_at=draw(local_instants),
        duration_s=0.0,
        event_count=1,
        tool_calls=0,
        tools=[],
        errors=[],
        lessons=[],
        delegations=[],
        first_event_id=uuid.uuid4(),
        last_event_id=uuid.uuid4(),
        calls=draw(st.lists(calls, max_size=4)),
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(episodes(), max_size=5), min_size=1, max_size=3))
def test_temporal_bins_count_what_the_scn_index_counts(tmp_path_factory, batches):
    # The projector bins marks in SQL; somnus.processors.prediction.rhythms (bins_of, in Python) is the definition. Every
    # batch is added to the counts already stored, as the projector's batches are.
    con = duckdb.connect(str(tmp_path_factory.mktemp("scn") / "s.duckdb"))
    schema.init(con)
    for batch in batches:
        marks = add_temporal_bins(con, batch)
        assert marks == sum(len(marks_of_episode(ep)) for ep in batch)
    want = index_of(m for batch in batches for ep in batch for m in marks_of_episode(ep)).deltas()
    got = con.execute(
        "SELECT agent, kind, bin_kind, bin, count, successes, failures FROM temporal_bins "
        "ORDER BY agent, kind, bin_kind, bin"
    ).fetchall()
    assert got == [tuple(msgspec.structs.astuple(d)) for d in want]


def test_a_naive_mark_is_refused_by_name(tmp_path):
    con = duckdb.connect(str(tmp_path / "s.duckdb"))
    schema.init(con)
    ep = EpisodeDistilled(
        episode_id=uuid.uuid4(),
        schema_version=1,
        agent="a",
        session_id="s",
        task="t",
        goal=None,
        user_id=None,
        summary="",
        outcome=Outcome.SUCCESS,
        started_at=datetime(2026, 1, 1),
        ended_at=datetime(2026, 1, 1),
        duration_s=0.0,
        event_count=1,
        tool_calls=0,
        tools=[],
        errors=[],
        lessons=[],
        delegations=[],
        first_event_id=uuid.uuid4(),
        last_event_id=uuid.uuid4(),
    )
    try:
        add_temporal_bins(con, [ep])
    except ValueError as exc:
        assert "naive datetime" in str(exc)
    else:
        raise AssertionError("a naive datetime was binned")
