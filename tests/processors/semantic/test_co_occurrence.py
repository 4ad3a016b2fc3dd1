from datetime import datetime, timedelta, timezone

from somnus.processors.semantic.co_occurrence import (
    CO_ALPHA,
    CO_MIN_SHARED,
    CO_OCCURRENCE_DOMAIN,
    co_occurrence_events,
    co_occurrence_p,
    topic_co_occurrences,
)
from somnus.processors.semantic.concepts import find_or_create
from somnus.processors.semantic.layers import MemoryLayers
from somnus.processors.semantic.promotion import StatisticianPromotionSource
from somnus.schemas.semantic import CrossEdgeType, Layer, MathCategory, PatternConfirmed, RecordRemoved

T0 = datetime(2024, 5, 1, tzinfo=timezone.utc)


def memory(topics: dict[str, tuple[str, list[str]]]) -> MemoryLayers:
    m = MemoryLayers("global")
    for key, (agent, sessions) in topics.items():
        find_or_create(
            m, key, T0, category="topic", properties={"key": key, "domains": sessions, "source_agents": [agent]}
        )
    return m


def conversation() -> MemoryLayers:
    # one conversation of 20 sessions: pottery and kiln travel together, dog is elsewhere
    return memory(
        {
            "pottery": ("c", ["s1", "s4", "s7", "s12"]),
            "kiln": ("c", ["s1", "s4", "s12"]),
            "dog": ("c", ["s2", "s9"]),
            "rain": ("c", [f"s{i}" for i in range(3, 21, 2)]),
        }
    )


def test_constants_pinned():
    assert (CO_MIN_SHARED, CO_ALPHA, CO_OCCURRENCE_DOMAIN) == (2, 0.05, "topic_co_occurrence")
    assert abs(co_occurrence_p(3, 20, 4, 3) - 1 / 285) < 1e-12  # C(4,3)/C(20,3) = 4/1140


def test_topics_that_come_back_in_the_same_sessions_are_an_association():
    [rec] = topic_co_occurrences(conversation(), ["kiln", "pottery", "dog", "rain"])
    assert (rec.name, rec.category, rec.domain, rec.subjects) == (
        "cooc:topic:kiln+pottery",
        MathCategory.CORRELATION,
        CO_OCCURRENCE_DOMAIN,
        ["kiln", "pottery"],
    )
    assert rec.statistics["shared"] == 3 and rec.n_observations == 13 and rec.confidence > 0.95  # 13 sessions spanned
    assert rec.source_agents == ["c"]


def test_a_fleet_whose_topics_span_a_few_domains_confirms_nothing():
    # tool traces: every tool in most of the fleet's 4 domains, so overlaps are what chance gives
    fleet = memory({t: ("agent-1", ["travel", "retail", "support"]) for t in ("parse_html", "http_get", "api.x.com")})
    assert topic_co_occurrences(fleet, ["parse_html", "http_get", "api.x.com"]) == []


def test_only_the_same_agents_topics_and_only_pairs_the_request_touches():
    m = memory(
        {
            "pottery": ("c", ["s1", "s4", "s7"]),
            "kiln": ("d", ["s1", "s4", "s7"]),
            "x": ("c", [f"s{i}" for i in range(10, 30)]),
        }
    )
    assert topic_co_occurrences(m, ["pottery", "kiln"]) == []
    assert topic_co_occurrences(conversation(), ["dog"]) == []  # kiln+pottery is not re-confirmed by dog


def test_events_feed_the_angular_gyrus_inform_the_topics_and_run_once():
    m = conversation()
    evs = co_occurrence_events(m, ["kiln"], T0)
    [pc] = [e for e in evs if isinstance(e, PatternConfirmed)]
    assert len(m.ag) == 1
    node = (Layer.ANGULAR_GYRUS, pc.record.math_id)
    assert sorted(m.atl.name_of(e.target[1]) for e in m.cross.edges(node, CrossEdgeType.INFORMS)) == ["kiln", "pottery"]
    assert co_occurrence_events(m, ["kiln"], T0 + timedelta(days=1)) == []
    # the statistician's promotion source leaves it alone (it is about concepts already there)
    assert StatisticianPromotionSource(m.ag).get_promotion_candidates() == []
    # not re-confirmed for 30 days: it leaves the layer like any pattern
    assert [type(e) for e in m.consolidate(T0 + timedelta(days=31)) if e.layer is Layer.ANGULAR_GYRUS] == [
        RecordRemoved
    ]


def test_its_query_reads_the_concepts_even_for_a_key_with_a_quote():
    import duckdb

    m = memory(
        {
            "o'brien": ("c", ["s1", "s4", "s7"]),
            "kiln": ("c", ["s1", "s4", "s7"]),
            "x": ("c", [f"s{i}" for i in range(10, 30)]),
        }
    )
    [rec] = topic_co_occurrences(m, ["kiln"])
    con = duckdb.connect()
    con.execute("CREATE TABLE concepts (owner VARCHAR, name VARCHAR, category VARCHAR, properties JSON)")
    con.execute("""INSERT INTO concepts VALUES ('global', 'o''brien', 'topic', '{"domains": ["s1"]}')""")
    assert [r[0] for r in con.execute(rec.query).fetchall()] == ["o'brien"]
