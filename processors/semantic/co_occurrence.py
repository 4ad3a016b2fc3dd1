"""Co-occurrence of topics across sessions: the Angular Gyrus's statistical associations from
conversations. Pure: no I/O, no clock (``now`` is an argument).

The Maxim seed's Angular Gyrus holds cross-modal, statistical knowledge (``MathRecord``: name,
category, domain, verbal, confidence). Tool traces feed it through the statistician (trends, phase
locks and correlations of call outcomes); a conversation has no tool calls. What it does have is
topics (dream phase B's abstracted keys, ATL concepts of category ``topic``) and the sessions
(domains) each came back in. Two topics of the same agent that come back in the same sessions more
often than chance are a statistical association: a ``CORRELATION`` record in the domain
``topic_co_occurrence``, which INFORMS both topic concepts.

**The test.** For topics *a* and *b* of one agent, seen in ``|A|`` and ``|B|`` of the ``N`` sessions
that agent's topics span, sharing ``k``: under independence ``k`` is hypergeometric, and the
association is confirmed when ``k >= CO_MIN_SHARED`` (2) and ``P(K >= k) < CO_ALPHA`` (0.05).
Its confidence is ``1 - p``. The test is about the agent's own sessions, not a dataset: a fleet
whose topics span a handful of domains (every tool in every domain) confirms nothing, as chance
explains its overlaps; a long conversation whose topics each come back in a few of its many
sessions confirms the pairs that travel together.

Only pairs with one topic in ``keys`` (the topics the request brought) are tested: new evidence
re-confirms an association, and an association no new topic touches ages out of the layer like any
other pattern (``AG_MAX_AGE_DAYS``).

>>> from datetime import datetime, timezone
>>> from somnus.processors.semantic.layers import MemoryLayers
>>> from somnus.processors.semantic.concepts import find_or_create
>>> m, t = MemoryLayers("global"), datetime(2024, 5, 1, tzinfo=timezone.utc)
>>> sessions = {"pottery": ["s1", "s4", "s7"], "kiln": ["s1", "s4", "s7"], "dog": ["s2", "s9"], "rain": ["s3", "s5", "s6", "s8"]}
>>> for key, ds in sessions.items():
...     _ = find_or_create(m, key, t, category="topic", properties={"key": key, "domains": ds, "source_agents": ["a"]})
>>> [r.name for r in topic_co_occurrences(m, ["kiln"])]
['cooc:topic:kiln+pottery']
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from scipy.stats import hypergeom

from somnus.processors.prediction.patterns import math_id_for, pattern_events
from somnus.processors.semantic.concepts import SOURCE_AGENTS
from somnus.processors.semantic.layers import MemoryLayers
from somnus.schemas.semantic import CrossEdgeType, CrossLayerEdgeFormed, Layer, MathCategory, MathRecord, SemanticEvent

CO_OCCURRENCE_DOMAIN = "topic_co_occurrence"
CO_MIN_SHARED = 2  # sessions two topics must share: one shared session is a single conversation turn's worth
CO_ALPHA = 0.05  # the hypergeometric test's level
TOPIC = "topic"
SESSION = "session:"  # a topic concept's evidence key per session (``promotion.concept_spec``)


def _topics(memory: MemoryLayers) -> dict[str, tuple[str, frozenset[str]]]:
    """Topic key -> (agent, sessions), from the ATL's topic concepts."""
    out: dict[str, tuple[str, frozenset[str]]] = {}
    for cid in memory.atl.by_category(TOPIC):
        c = memory.atl.get(cid)
        if c is None:
            continue
        agents = c.properties.get(SOURCE_AGENTS) or [""]
        # every session it was promoted from (its evidence); ``domains`` holds the last abstraction's only
        sessions = {k.removeprefix(SESSION) for k in c.evidence if k.startswith(SESSION)}
        sessions.update(map(str, c.properties.get("domains", ())))
        out[str(c.properties.get("key", c.name))] = (str(agents[0]), frozenset(sessions))
    return out


def co_occurrence_p(shared: int, sessions: int, a: int, b: int) -> float:
    """P(K >= shared) for K hypergeometric: ``b`` draws from ``sessions`` of which ``a`` are marked.

    >>> round(co_occurrence_p(3, 30, 3, 3), 5), round(co_occurrence_p(2, 4, 2, 2), 3)
    (0.00025, 0.167)
    """
    return float(hypergeom.sf(shared - 1, sessions, a, b))


def topic_co_occurrences(memory: MemoryLayers, keys: Iterable[str]) -> list[MathRecord]:
    """The confirmed associations of the topics ``keys`` with the agent's other topics, by name."""
    topics = _topics(memory)
    span: dict[str, set[str]] = {}
    for agent, ds in topics.values():
        span.setdefault(agent, set()).update(ds)
    out: dict[str, MathRecord] = {}
    for key in sorted(set(keys) & topics.keys()):
        agent, da = topics[key]
        for other in sorted(topics):
            ob, db = topics[other]
            shared = len(da & db)
            if other == key or ob != agent or shared < CO_MIN_SHARED:
                continue
            p = co_occurrence_p(shared, len(span[agent]), len(da), len(db))
            if p >= CO_ALPHA:
                continue
            rec = _record(memory.owner, agent, sorted((key, other)), shared, len(span[agent]), (da, db), p)
            out[rec.name] = rec
    return [out[n] for n in sorted(out)]


def _record(
    owner: str,
    agent: str,
    pair: Sequence[str],
    shared: int,
    sessions: int,
    sets: tuple[frozenset[str], frozenset[str]],
    p: float,
) -> MathRecord:
    a, b = pair
    union = len(sets[0] | sets[1])
    o, qa, qb = (x.replace("'", "''") for x in (owner, a, b))  # SQL string literals in ``query``
    return MathRecord(
        math_id=math_id_for(owner, MathCategory.CORRELATION, f"topic:{agent}:{a}~{b}"),
        name=f"cooc:topic:{a}+{b}",
        category=MathCategory.CORRELATION,
        domain=CO_OCCURRENCE_DOMAIN,
        subjects=[a, b],
        verbal=f"'{a}' and '{b}' come back in the same sessions: {shared} shared of {sessions} "
        f"(p={p:.2g} under independence).",
        query=(
            "SELECT name, properties->'domains' AS sessions FROM concepts "
            f"WHERE owner = '{o}' AND category = 'topic' AND name IN ('{qa}', '{qb}')"
        ),
        confidence=round(1.0 - p, 6),
        n_observations=sessions,
        statistics={
            "shared": float(shared),
            "sessions": float(sessions),
            "jaccard": round(shared / union, 6),
            "p_value": p,
        },
        source_agents=[agent] if agent else [],
    )


def co_occurrence_events(memory: MemoryLayers, keys: Iterable[str], now: datetime) -> list[SemanticEvent]:
    """``PatternConfirmed`` for each new or changed association of ``keys``, and an INFORMS edge from
    it to both topic concepts. Applied to ``memory`` as they are made; a second call adds nothing."""
    records = topic_co_occurrences(memory, keys)
    out = pattern_events(memory, records, now)
    for rec in records:
        for key in rec.subjects:
            cid = memory.atl.find(key)
            if cid is None:
                continue
            src, dst = (Layer.ANGULAR_GYRUS, rec.math_id), (Layer.ATL, cid)
            if memory.cross.get(src, CrossEdgeType.INFORMS, dst) is not None:
                continue
            out.append(
                CrossLayerEdgeFormed(
                    owner=memory.owner,
                    source_layer=src[0],
                    source_id=src[1],
                    edge_type=CrossEdgeType.INFORMS,
                    target_layer=dst[0],
                    target_id=cid,
                    weight=rec.confidence,
                    at=now,
                )
            )
            memory.apply(out[-1])
    return out
