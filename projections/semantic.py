"""Semantic memory (ATL concepts, Angular Gyrus patterns, cross-layer edges) folded by the projector.

Inputs arrive on the one-partition ``semantic`` topic, each self-contained so that folding the
topic again (a replay) decides exactly the same:

- ``KnowledgeIngested`` (``somnus ingest-knowledge``): concepts from a document, added as
  DIRECT_INGESTION (deduplicated by name);
- ``PromotionRequested`` (``somnus consolidate``, and the sleep job's promotion step): a snapshot of
  the promotion inputs taken when it was requested — the NAc causal links that are candidates
  (with their observation times, episodes and counts) and the call outcomes the statistician
  reads — and the event time it runs at. The fold runs the statistician (patterns), then the
  promoter (randomness gate, concepts, relationships, cross-layer edges) over the owner's memory.

Every resulting ``SemanticEvent`` is appended to ``semantic_log`` in the batch's transaction and
projected into ``concepts``, ``concept_relationships``, ``math_patterns``, ``cross_layer_edges`` and
``promotion_audit``; the in-memory layers (``processors/layers.MemoryLayers`` per owner) are rebuilt
from the log at start.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import duckdb
import msgspec
import pyarrow as pa

from somnus.processors.semantic.co_occurrence import co_occurrence_events
from somnus.processors.semantic.layers import MemoryLayers
from somnus.processors.prediction.causal_links import DEFAULT_ALPHA, alphas_for, confidence_of
from somnus.processors.semantic.promotion import (
    AbstractionPromotionSource,
    NacPromotionSource,
    SemanticPromoter,
    StatisticianPromotionSource,
)
from somnus.schemas.semantic import CausalLinkView
from somnus.processors.semantic.concepts import ingest_knowledge
from somnus.processors.prediction.patterns import Statistician, pattern_events
from somnus.schemas.semantic import CallOutcome
from somnus.schemas.semantic import (
    CandidateRejected,
    ConceptCreated,
    ConceptPromoted,
    ConceptReinforced,
    CrossLayerEdgeFormed,
    PatternConfirmed,
    RecordRemoved,
    RelationshipFormed,
    SemanticEvent,
    decode_semantic,
    encode_semantic,
)
from somnus.schemas.facts import GLOBAL_SCOPE
from somnus.schemas.agents import AgentSpec
from somnus.schemas.semantic import (
    KIND_INGEST,
    KIND_PROMOTE,
    SLEEP_REQUEST_PREFIX,
    KnowledgeIngested,
    PromotionRequested,
    TopicView,
)
from somnus.schemas.codec import Rejection
from somnus.schemas.sealed import FORGOTTEN, KeyRing, open_shared, seal_shared
from somnus.projections.frames import registered


log = logging.getLogger(__name__)

_ingest_decoder = msgspec.json.Decoder(KnowledgeIngested)
_promote_decoder = msgspec.json.Decoder(PromotionRequested)
_topic_decoder = msgspec.json.Decoder(TopicView)


class SemanticProjection:
    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.layers: dict[str, MemoryLayers] = {}
        self.next_ord = 0
        self.forgotten_topics = 0  # sealed topics a forget shredded (skipped)
        self.rejected_topics = 0  # sealed topics that did not open (left out, logged)
        self.requests: set[str] = set()
        self.reload(con)

    def reload(self, con: duckdb.DuckDBPyConnection) -> None:
        self.layers = {}
        self.requests = {r for (r,) in con.execute("SELECT request_id FROM semantic_requests").fetchall()}
        rows = con.execute("SELECT body, ord FROM semantic_log ORDER BY ord").fetchall()
        for body, _ in rows:
            ev = decode_semantic(body.encode() if isinstance(body, str) else body)
            self._owner(ev.owner).apply(ev)
        self.next_ord = rows[-1][1] + 1 if rows else 0  # a forget leaves gaps: never reuse an ord

    def _owner(self, owner: str) -> MemoryLayers:
        m = self.layers.get(owner)
        if m is None:
            m = self.layers[owner] = MemoryLayers(owner)
        return m

    def write(
        self,
        con: duckdb.DuckDBPyConnection,
        records: Sequence[tuple[bytes | None, Any]],
        keys: Mapping[str, bytes] | None = None,
    ) -> tuple[int, set[str]]:
        """Fold ``(kind, record)`` pairs in order; write the events they made (caller's transaction).
        ``keys`` (key id -> data key) open a request's sealed topics. Returns how many events, and the
        owners (scopes) whose memory changed."""
        events: list[tuple[SemanticEvent, int]] = []
        requests: list[dict[str, Any]] = []
        # (sleep run id, what its promotion and consolidation did to each layer): counted at the
        # request, not at the batch's end, where they would depend on where the batch was cut
        sleeps: list[tuple[str, dict[str, dict[str, int]]]] = []
        for kind, rec in records:
            if kind == KIND_INGEST:
                req = _ingest_decoder.decode(rec.value)
                made = ingest_knowledge(self._owner(req.owner), req.concepts, req.source, req.at)
            elif kind == KIND_PROMOTE:
                preq = _promote_decoder.decode(rec.value)
                if preq.sealed_topics:
                    preq = self.opened(preq, keys)
                if preq.request_id is not None:
                    if preq.request_id in self.requests:
                        continue  # a copy of a request already run
                    self.requests.add(preq.request_id)
                    requests.append(
                        {
                            "request_id": preq.request_id,
                            "owner": preq.owner,
                            "requested_at": preq.at,
                            "src_offset": rec.offset,
                        }
                    )
                sleep = preq.request_id is not None and preq.request_id.startswith(SLEEP_REQUEST_PREFIX)
                before = layer_sizes(self.layers) if sleep else {}
                had = pattern_ids(self.layers) if sleep else set()
                made = self.promote(preq)
                if sleep:
                    made += self.consolidate(preq.at)
                    sleeps.append(
                        (
                            str(preq.request_id).removeprefix(SLEEP_REQUEST_PREFIX),
                            layer_changes(before, layer_sizes(self.layers), had, made),
                        )
                    )
            else:
                continue
            events += [(ev, rec.offset) for ev in made]
        if requests:
            with registered(con, frame=pa.Table.from_pylist(requests)):
                con.execute("INSERT INTO semantic_requests SELECT * FROM frame")
        if events:
            self._insert(con, events)
        if sleeps:
            _report_layers(con, sleeps)
        return len(events), {ev.owner for ev, _ in events}

    def opened(self, req: PromotionRequested, keys: Mapping[str, bytes] | None) -> PromotionRequested:
        """``req`` with its sealed topics opened and appended to its topics. A topic one of whose source
        sessions was forgotten opens as nothing (``forgotten_topics``); one that does not open (altered)
        is left out and counted (``rejected_topics``): the rest of the request still runs, as a replay
        with the same keys would run it."""
        topics = list(req.topics)
        for value in req.sealed_topics:
            got = open_shared(value, keys or {})
            if got is FORGOTTEN:
                self.forgotten_topics += 1
                continue
            try:
                if isinstance(got, Rejection) or not isinstance(got, bytes):
                    raise ValueError(got.reason if isinstance(got, Rejection) else "a topic that is not sealed")
                topics.append(_topic_decoder.decode(got))
            except Exception as exc:  # noqa: BLE001 - one bad topic does not stop the request
                self.rejected_topics += 1
                log.warning("promotion request %s: a sealed topic left out: %s", req.request_id, exc)
        return msgspec.structs.replace(req, topics=topics, sealed_topics=[])

    def consolidate(self, at: datetime) -> list[SemanticEvent]:
        """Deep sleep's phase 3 for the semantic layers, after the run's promotion: ATL and Angular
        Gyrus consolidation (``MemoryLayers.consolidate``: concepts not reinforced and patterns not
        re-confirmed for 30 days leave their layer) of every owner, in owner order, applied."""
        out: list[SemanticEvent] = []
        for owner in sorted(self.layers):
            m = self.layers[owner]
            for ev in m.consolidate(at):
                m.apply(ev)
                out.append(ev)
        return out

    def promote(self, req: PromotionRequested) -> list[SemanticEvent]:
        """Statistician, then promoter (NAc links and confirmed patterns as sources), at ``req.at``."""
        m = self._owner(req.owner)
        records = Statistician(req.owner).analyse(req.calls) if req.calls else []
        made = pattern_events(m, records, req.at)
        made += SemanticPromoter(activity_times=sorted({c.at for c in req.calls})).promote(
            m,
            [NacPromotionSource(req.links), StatisticianPromotionSource(m.ag), AbstractionPromotionSource(req.topics)],
            req.at,
        )
        made += co_occurrence_events(m, [t.key for t in req.topics], req.at)  # the AG from conversations
        return made

    def _insert(self, con: duckdb.DuckDBPyConnection, events: list[tuple[SemanticEvent, int]]) -> None:
        log, concepts, rels, patterns, edges, audit = [], [], [], [], [], []
        removed: list[dict[str, Any]] = []
        for ev, offset in events:
            log.append(
                {
                    "ord": self.next_ord,
                    "owner": ev.owner,
                    "kind": type(ev).__name__,
                    "body": encode_semantic(ev).decode(),
                    "src_offset": offset,
                }
            )
            self.next_ord += 1
            if isinstance(ev, (ConceptCreated, ConceptReinforced)):
                c = self.layers[ev.owner].atl.get(ev.concept_id)
                if c is not None:
                    concepts.append(
                        {
                            "owner": ev.owner,
                            "concept_id": c.concept_id,
                            "name": c.name,
                            "category": c.category,
                            "definition": c.definition,
                            "provenance": c.provenance.value,
                            "reinforcement_count": c.reinforcement_count,
                            "confidence": c.confidence,
                            "properties": msgspec.json.encode(c.properties).decode(),
                            "source_episode_ids": list(c.source_episode_ids),
                            "updated_at": ev.at,
                        }
                    )
            elif isinstance(ev, RelationshipFormed):
                rels.append(
                    {
                        "owner": ev.owner,
                        "source_id": ev.source_id,
                        "relation": ev.relation,
                        "target_id": ev.target_id,
                        "weight": ev.weight,
                        "metadata": msgspec.json.encode(ev.metadata).decode(),
                        "formed_at": ev.at,
                    }
                )
            elif isinstance(ev, PatternConfirmed):
                r = ev.record
                patterns.append(
                    {
                        "owner": ev.owner,
                        "math_id": r.math_id,
                        "name": r.name,
                        "category": r.category.value,
                        "domain": r.domain,
                        "summary": r.verbal,
                        "query": r.query,
                        "confidence": r.confidence,
                        "observations": r.n_observations,
                        "confirmed_at": ev.at,
                        "source_agents": sorted(r.source_agents),
                    }
                )
            elif isinstance(ev, CrossLayerEdgeFormed):
                edges.append(
                    {
                        "owner": ev.owner,
                        "source_layer": ev.source_layer.value,
                        "source_id": ev.source_id,
                        "edge_type": ev.edge_type.value,
                        "target_layer": ev.target_layer.value,
                        "target_id": ev.target_id,
                        "weight": ev.weight,
                        "formed_at": ev.at,
                    }
                )
            elif isinstance(ev, (ConceptPromoted, CandidateRejected)):
                if isinstance(ev, ConceptPromoted):
                    promoted, concept_id, reason = True, ev.concept_id, ev.gate
                else:
                    promoted, concept_id, reason = False, None, ev.reason
                audit.append(
                    {
                        "owner": ev.owner,
                        "pattern_name": ev.pattern_name,
                        "origin": ev.origin,
                        "candidate_confidence": ev.candidate_confidence,
                        "promoted": promoted,
                        "concept_id": concept_id,
                        "reason": reason,
                        "decided_at": ev.at,
                    }
                )
            elif isinstance(ev, RecordRemoved):
                removed.append({"owner": ev.owner, "layer": ev.layer.value, "record_id": ev.record_id})
                # this batch's rows of it so far go too; a later re-creation in the batch stays
                concepts, rels, patterns, edges = _without(ev, concepts, rels, patterns, edges)
        if removed:  # first, so a record removed and made again in one batch (sleeps 30 days apart) stays
            with registered(con, gone=pa.Table.from_pylist(removed)):
                _delete_removed(con)
        latest = {(r["owner"], r["concept_id"]): r for r in concepts}  # a concept's last state in the batch
        for table, rows, select in (
            ("semantic_log", log, "ord, owner, kind, body::JSON, src_offset"),
            ("concept_relationships", rels, "owner, source_id, relation, target_id, weight, metadata::JSON, formed_at"),
            ("math_patterns", patterns, "*"),
            ("cross_layer_edges", edges, "*"),
            ("promotion_audit", audit, "*"),
        ):
            if rows:
                with registered(con, frame=pa.Table.from_pylist(rows)):
                    con.execute(f"INSERT INTO {table} SELECT {select} FROM frame")
        if latest:
            with registered(con, frame=pa.Table.from_pylist(list(latest.values()))):
                con.execute(
                    "INSERT OR REPLACE INTO concepts SELECT owner, concept_id, name, category, definition, "
                    "provenance, reinforcement_count, confidence, properties::JSON, source_episode_ids, "
                    "updated_at FROM frame"
                )


Rows = list[dict[str, Any]]


def _without(
    ev: RecordRemoved, concepts: Rows, rels: Rows, patterns: Rows, edges: Rows
) -> tuple[Rows, Rows, Rows, Rows]:
    """The batch's read-model rows without those of the record ``ev`` removes (as ``_delete_removed``)."""
    o, layer, rid = ev.owner, ev.layer.value, ev.record_id
    if layer == "atl":
        concepts = [r for r in concepts if (r["owner"], r["concept_id"]) != (o, rid)]
        rels = [r for r in rels if r["owner"] != o or rid not in (r["source_id"], r["target_id"])]
    elif layer == "angular_gyrus":
        patterns = [r for r in patterns if (r["owner"], r["math_id"]) != (o, rid)]
    edges = [
        r
        for r in edges
        if r["owner"] != o
        or (layer, rid) not in ((r["source_layer"], r["source_id"]), (r["target_layer"], r["target_id"]))
    ]
    return concepts, rels, patterns, edges


def _delete_removed(con: duckdb.DuckDBPyConnection) -> None:
    """Delete what the registered frame ``gone`` names from the layers' read models."""
    con.execute(
        "DELETE FROM concepts c USING gone g WHERE g.layer = 'atl' AND c.owner = g.owner AND c.concept_id = g.record_id"
    )
    con.execute(
        "DELETE FROM concept_relationships r USING gone g WHERE g.layer = 'atl' "
        "AND r.owner = g.owner AND (r.source_id = g.record_id OR r.target_id = g.record_id)"
    )
    con.execute(
        "DELETE FROM math_patterns p USING gone g WHERE g.layer = 'angular_gyrus' "
        "AND p.owner = g.owner AND p.math_id = g.record_id"
    )
    con.execute(
        "DELETE FROM cross_layer_edges e USING gone g WHERE e.owner = g.owner AND "
        "((e.source_layer = g.layer AND e.source_id = g.record_id) "
        "OR (e.target_layer = g.layer AND e.target_id = g.record_id))"
    )


def layer_sizes(layers: Mapping[str, MemoryLayers]) -> dict[str, int]:
    """Records in the ATL and the Angular Gyrus, summed over owners."""
    return {"atl": sum(len(m.atl) for m in layers.values()), "angular_gyrus": sum(len(m.ag) for m in layers.values())}


def pattern_ids(layers: Mapping[str, MemoryLayers]) -> set[tuple[str, str]]:
    """(owner, math id) of every Angular Gyrus record: what a re-confirmation finds already there."""
    return {(owner, r.math_id) for owner, m in layers.items() for r in m.ag}


LAYER_COUNTS = ("before", "added", "reinforced", "removed", "after")


def layer_changes(
    before: Mapping[str, int], after: Mapping[str, int], had: set[tuple[str, str]], events: Sequence[SemanticEvent]
) -> dict[str, dict[str, int]]:
    """Per layer, what one sleep run's promotion and consolidation did: records ``before`` and
    ``after``, ``added`` (a concept created, a pattern confirmed for the first time), ``reinforced``
    (an existing concept given new evidence, a pattern re-confirmed: distinct records) and
    ``removed`` (decayed by consolidation: not reinforced, or not re-confirmed, within the window).

    >>> from datetime import datetime, timezone
    >>> from somnus.schemas.semantic import Layer, RecordRemoved
    >>> t = datetime(2024, 5, 1, tzinfo=timezone.utc)
    >>> gone = RecordRemoved(owner="o", layer=Layer.ATL, record_id="c1", at=t, reason="idle")
    >>> layer_changes({"atl": 2, "angular_gyrus": 0}, {"atl": 1, "angular_gyrus": 0}, set(), [gone])["atl"]
    {'before': 2, 'added': 0, 'reinforced': 0, 'removed': 1, 'after': 1}
    """
    added: dict[str, set[tuple[str, str]]] = {"atl": set(), "angular_gyrus": set()}
    reinforced: dict[str, set[tuple[str, str]]] = {"atl": set(), "angular_gyrus": set()}
    removed = {"atl": 0, "angular_gyrus": 0}
    for ev in events:
        if isinstance(ev, ConceptCreated):
            added["atl"].add((ev.owner, ev.concept_id))
        elif isinstance(ev, ConceptReinforced):
            reinforced["atl"].add((ev.owner, ev.concept_id))
        elif isinstance(ev, PatternConfirmed):
            key = (ev.owner, ev.record.math_id)
            (reinforced if key in had else added)["angular_gyrus"].add(key)
        elif isinstance(ev, RecordRemoved) and ev.layer.value in removed:
            removed[ev.layer.value] += 1
    return {
        layer: {
            "before": before[layer],
            "added": len(added[layer]),
            "reinforced": len(reinforced[layer] - added[layer]),
            "removed": removed[layer],
            "after": after[layer],
        }
        for layer in ("atl", "angular_gyrus")
    }


def _report_layers(con: duckdb.DuckDBPyConnection, runs: Sequence[tuple[str, Mapping[str, Mapping[str, int]]]]) -> None:
    """The semantic layers' part of sleep runs (``sleep_layer_reports``, see ``layer_changes``),
    summed over owners, each ``(run id, changes)``. A table of its own, not a patch of the run's row
    in ``sleep_runs``: the memory fold writes that row from another topic, so whether it exists yet
    depends on how the topics interleave, which a replay does not repeat. One statement for all the
    rows (a statement per row cost more than the rows); a (run, layer) given twice keeps its last
    counts, as one statement per row in order did."""
    rows = {(run_id, layer): counts for run_id, changes in runs for layer, counts in changes.items()}
    if not rows:
        return
    one = f"(?, ?, {', '.join('?' * len(LAYER_COUNTS))})"
    con.execute(
        f"INSERT OR REPLACE INTO sleep_layer_reports (run_id, layer, {', '.join(LAYER_COUNTS)}) "
        f"VALUES {', '.join([one] * len(rows))}",
        [x for (run_id, layer), counts in rows.items() for x in (run_id, layer, *(counts[c] for c in LAYER_COUNTS))],
    )


# Promotion reads the newest PROMOTION_WINDOW_CALLS tool calls, and the candidate links' observations
# since the oldest of them. With all of history, a request grew with the stream: past ~750k sample
# events it exceeded the producer's 8 MB and every later promotion after a sleep failed (24 of 51 in
# a 1M-event run), and each one re-read everything (the semantic stage grew 24x for 3.3x the events).
# 32,768 calls are ~5.6 days of the sample fleet (>= the statistician's 3-5 days minimums), ~4 MB.
PROMOTION_WINDOW_CALLS = 32_768


def scope_agents(owner: str, agents: Mapping[str, AgentSpec] | None = None) -> frozenset[str] | None:
    """The agents whose data belongs to ``owner``'s scope: ``agent:<name>``: that agent; ``team:<lead>``:
    the declared agents reporting to the lead (``somnus.schemas.agents.scope_chain``'s team); ``global``: None
    (every agent). A team is only known from the registry: without ``agents`` it has no member.

    >>> fleet = {"lead": AgentSpec(name="lead"), "a": AgentSpec(name="a", reports_to="lead")}
    >>> scope_agents("global"), sorted(scope_agents("agent:a")), sorted(scope_agents("team:lead", fleet))
    (None, ['a'], ['a'])
    """
    if owner == GLOBAL_SCOPE:
        return None
    if owner.startswith("agent:"):
        return frozenset({owner[len("agent:") :]})
    if owner.startswith("team:"):
        lead = owner[len("team:") :]
        return frozenset(a for a, spec in (agents or {}).items() if spec.reports_to == lead)
    raise ValueError(f"unknown owner {owner!r}: expected global, team:<lead> or agent:<name>")


def promotion_inputs(
    con: duckdb.DuckDBPyConnection,
    owner: str = "global",
    min_observations: int = 3,
    min_confidence: float = 0.6,
    window_calls: int | None = PROMOTION_WINDOW_CALLS,
    agents: Mapping[str, AgentSpec] | None = None,
    as_of: datetime | None = None,
) -> PromotionRequested:
    """A snapshot of what promotion reads, taken from the projections (``at`` is filled by the caller):
    the tool-level NAc links that are candidates, with their observation times, episodes, counts,
    the agents they were observed for and the base rate of their valence; and the tool calls'
    outcomes (for the statistician).

    Only the data of ``owner``'s scope is read (``scope_agents``; ``agents`` is the registry, needed
    for a team owner): an agent's memory learns from that agent's calls alone, a team's from its
    members', so a concept in it never carries another agent's tools or errors. The global owner
    reads every agent's (its concepts name their ``source_agents``). For a scoped owner the links are
    rebuilt from the scope's ``causal_link_updates`` with the NAc's own rule (``scoped_links``).

    Calls are the newest ``window_calls`` (all with None), oldest first; a link's observations are
    those since the oldest of them, so the IPS gate compares a link with the activity of the same
    span. Counts, strengths and base rates are the links' totals (over the scope).

    With ``as_of`` (a scheduled sleep's time), only what was observed by then is read, and the fleet's
    links are their state as the worker learned them up to their first observation after it
    (``links_as_of``): a function of the input alone, however far the link updates have been folded
    when it is taken (docs/design/scale-out.md, cause 3). The topics are then the caller's to choose."""
    members = scope_agents(owner, agents)
    where, params = "", list[Any]()
    if members is not None:
        where, params = "AND agent IN (SELECT unnest(?::VARCHAR[])) ", [sorted(members)]
    if as_of is not None:
        where, params = where + "AND observed_at <= ? ", [*params, as_of]
    newest = (
        "SELECT tool, valence, observed_at, episode_id::VARCHAR, agent FROM causal_link_updates "
        f"WHERE level = 'tool' {where}ORDER BY observed_at DESC, episode_id DESC, idx DESC"
    )
    if window_calls is None:
        rows = con.execute(newest, params).fetchall()
    else:
        rows = con.execute(newest + " LIMIT ?", [*params, window_calls]).fetchall()
    calls = [
        CallOutcome(tool, valence == "positive", at, episode, agent)
        for tool, valence, at, episode, agent in reversed(rows)
    ]
    since = [calls[0].at] if window_calls is not None and calls else []
    base = dict(
        con.execute(
            f"SELECT valence, count(*) / (SELECT count(*) FROM causal_link_updates WHERE level = 'tool' {where}) "
            f"FROM causal_link_updates WHERE level = 'tool' {where}GROUP BY 1",
            params * 2,
        ).fetchall()
    )
    if members is None and as_of is not None:
        candidates = [c for c in links_as_of(con, as_of) if c[6] >= min_observations and c[8] >= min_confidence]
    elif members is None:
        candidates = con.execute(
            "SELECT event_signature, outcome_signature, tool, outcome, valence, strength, observations, "
            "event_observations, confidence FROM causal_links WHERE level = 'tool' AND observations >= ? "
            "AND confidence >= ? ORDER BY tool, outcome_signature",
            [min_observations, min_confidence],
        ).fetchall()
    else:
        candidates = [
            c for c in scoped_links(con, members, agents, as_of) if c[6] >= min_observations and c[8] >= min_confidence
        ]
    seen: dict[tuple[str, str], list[tuple[datetime, str]]] = {(c[0], c[1]): [] for c in candidates}
    if seen:  # every candidate's observations in the window, in one scan
        for sig, osig, at, episode in con.execute(
            "SELECT event_signature, outcome_signature, observed_at, episode_id::VARCHAR "
            f"FROM causal_link_updates WHERE level = 'tool' {where}{'AND observed_at >= ? ' if since else ''}"
            "ORDER BY event_signature, outcome_signature, observed_at, episode_id",
            [*params, *since],
        ).fetchall():
            got = seen.get((sig, osig))
            if got is not None:
                got.append((at, episode))
    # Every agent a candidate's event was ever observed for: each of its calls moved the link's
    # strength and counts (an observation of another outcome too), so all are its provenance.
    observed: dict[str, list[str]] = {}
    if seen:
        events = sorted({sig for sig, _ in seen})
        for sig, who in con.execute(
            "SELECT event_signature, list(DISTINCT agent ORDER BY agent) FROM causal_link_updates "
            f"WHERE level = 'tool' {where}AND event_signature IN (SELECT unnest(?::VARCHAR[])) GROUP BY 1",
            [*params, events],
        ).fetchall():
            observed[sig] = list(who)
    links = [
        CausalLinkView(
            event_signature=sig,
            tool=tool,
            outcome=outcome,
            valence=valence,
            strength=float(strength),
            confidence=float(confidence),
            observation_count=int(obs),
            observation_times=[t for t, _ in seen[(sig, osig)]],
            source_episode_ids=[e for _, e in seen[(sig, osig)]],
            event_observations=int(event_obs),
            base_rate=float(base.get(valence, 0.0)),
            source_agents=observed.get(sig, []),
        )
        for sig, osig, tool, outcome, valence, strength, obs, event_obs, confidence in candidates
    ]
    return PromotionRequested(
        owner=owner,
        at=datetime.fromtimestamp(0, tz=timezone.utc),
        links=links,
        calls=calls,
        topics=sleep_topics(con, members) if as_of is None else [],
    )


def links_as_of(con: duckdb.DuckDBPyConnection, as_of: datetime) -> list[tuple[Any, ...]]:
    """The fleet's tool-level causal links as of ``as_of``, as rows of ``causal_links`` (event_signature,
    outcome_signature, tool, outcome, valence, strength, observations, event_observations, confidence),
    ordered by tool and outcome signature.

    Each observation of an event left one update row with the strengths of all the event's outcomes
    after it, numbered by ``event_observations`` (1, 2, ... in the order the worker learned them). An
    event's state as of ``as_of`` is the one after its last observation before the first one observed
    later than ``as_of``: a prefix of its own order, so the same rows give the same links whenever
    they were folded, and exactly the worker's strengths (its learning rates included)."""
    rows = con.execute(
        "WITH u AS (SELECT * FROM causal_link_updates WHERE level = 'tool' AND target = 1.0), "
        "cut AS (SELECT event_signature, min(event_observations) AS after FROM u WHERE observed_at > ? GROUP BY 1), "
        "kept AS (SELECT u.* FROM u LEFT JOIN cut USING (event_signature) "
        "WHERE cut.after IS NULL OR u.event_observations < cut.after), "
        "last AS (SELECT event_signature, arg_max(strengths, event_observations)::VARCHAR AS strengths, "
        "max(event_observations) AS n FROM kept GROUP BY 1) "
        "SELECT k.event_signature, k.outcome_signature, arg_min(k.tool, k.event_observations), "
        "arg_min(k.outcome, k.event_observations), arg_min(k.valence, k.event_observations), count(*), "
        "any_value(last.strengths), any_value(last.n) FROM kept k JOIN last USING (event_signature) GROUP BY 1, 2",
        [as_of],
    ).fetchall()
    out = []
    for sig, osig, tool, outcome, valence, obs, strengths, n in rows:
        strength = float(msgspec.json.decode(strengths).get(osig, 0.0)) if strengths else 0.0
        out.append((sig, osig, tool, outcome, valence, strength, int(obs), int(n), confidence_of(int(n))))
    return sorted(out, key=lambda r: (r[2], r[1], r[0]))


def sleep_topics(con: duckdb.DuckDBPyConnection, members: frozenset[str] | None = None) -> list[TopicView]:
    """The patterns deep sleep abstracted (``PatternAbstracted`` in ``lifecycle_log``) since the last
    sleep's promotion request was folded (``semantic_requests``: a request's ``at`` is its run's time),
    of ``members``' agents (None: all), in decision order: what the next request promotes to the ATL.
    Each pattern is abstracted once (``SleepState.patterns``), so each is promoted once and its concept
    then lives or decays by the ATL's own rule."""
    where, params = (
        ("", []) if members is None else ("AND body->>'agent' IN (SELECT unnest(?::VARCHAR[])) ", [sorted(members)])
    )
    rows = con.execute(
        "SELECT body FROM lifecycle_log WHERE kind = 'PatternAbstracted' AND decided_at > coalesce(("
        "SELECT max(requested_at) FROM semantic_requests WHERE starts_with(request_id, ?)), "
        f"'-infinity'::TIMESTAMPTZ) {where}ORDER BY decided_at, run_id, seq",
        [SLEEP_REQUEST_PREFIX, *params],
    ).fetchall()
    return _topic_views(rows)


def run_topics(con: duckdb.DuckDBPyConnection, run_id: str) -> list[TopicView]:
    """The patterns the sleep run ``run_id`` abstracted, in decision order: what its promotion request
    promotes to the ATL (``Projector._promote``). Each pattern is abstracted by one run
    (``SleepState.patterns``), and each run is requested once (its id), so each is promoted once,
    whenever the request goes."""
    rows = con.execute(
        "SELECT body FROM lifecycle_log WHERE kind = 'PatternAbstracted' AND run_id = ? ORDER BY decided_at, seq",
        [run_id],
    ).fetchall()
    return _topic_views(rows)


def _topic_views(rows: Sequence[tuple[Any, ...]]) -> list[TopicView]:
    out = []
    for (body,) in rows:
        ev = msgspec.json.decode(body)
        out.append(
            TopicView(
                pattern_id=ev["pattern_id"],
                agent=ev["agent"],
                key=ev["key"],
                domains=ev["domains"],
                support=ev["support"],
                source_ids=[s["memory_id"] for s in ev.get("sources", [])],
            )
        )
    return out


def sealed_request(con: duckdb.DuckDBPyConnection, req: PromotionRequested, ring: KeyRing | None) -> PromotionRequested:
    """``req`` as it is published: its topics sealed (``seal_shared``) under the data keys of the
    sessions their source memories came from, so that forgetting any of them shreds the topic's key
    word on the semantic topic (docs/design/forget.md, "Topic keys on the semantic topic"). A source
    memory of a session published in plaintext adds a plaintext share; when no source has a key (the
    whole fleet publishes in plaintext, ``SOMNUS_ENCRYPT=0``), the topics stay as they are."""
    if ring is None or not req.topics:
        return req
    ids = sorted({m for t in req.topics for m in t.source_ids})
    sessions = dict(
        (
            (m, (a, r))
            for m, a, r in con.execute(
                "SELECT body->>'$.unit.memory_id', body->>'$.unit.agent', body->>'$.unit.run_id' FROM memory_log "
                "WHERE kind = 'CaptureDecided' AND body->>'$.unit.memory_id' IN (SELECT unnest(?::VARCHAR[])) "
                "UNION ALL SELECT memory_id, agent, run_id FROM memories WHERE memory_id IN (SELECT unnest(?::VARCHAR[]))",
                [ids, ids],
            ).fetchall()
        )
    )
    sealed, plain = [], []
    for t in req.topics:
        keys = [ring.key_for(*sessions[m]) if m in sessions else None for m in t.source_ids]
        if any(k is not None for k in keys):
            sealed.append(seal_shared(keys, msgspec.json.encode(t)))
        else:
            plain.append(t)
    return msgspec.structs.replace(req, topics=plain, sealed_topics=[*req.sealed_topics, *sealed])


def scoped_links(
    con: duckdb.DuckDBPyConnection,
    members: frozenset[str],
    agents: Mapping[str, AgentSpec] | None = None,
    as_of: datetime | None = None,
) -> list[tuple[Any, ...]]:
    """The tool-level causal links learned from ``members``' observations alone, as rows of
    ``causal_links`` (event_signature, outcome_signature, tool, outcome, valence, strength,
    observations, event_observations, confidence), ordered by tool and outcome signature.

    ``causal_links`` is the fleet's; this folds the members' ``causal_link_updates`` (those observed
    by ``as_of`` when given; one row per observation, its outcome's link) again with ``somnus.processors.prediction.causal_links``'s rule: per event, in stream
    order, every known outcome k moves by ``max(α, 1/n) (λ_k - V_k)``, a new outcome starting at 0,
    α the observing agent's learning rate; confidence from the event's observations."""
    alphas = alphas_for(agents or {})
    rows = con.execute(
        "SELECT event_signature, outcome_signature, tool, outcome, valence, agent FROM causal_link_updates "
        "WHERE level = 'tool' AND target = 1.0 AND agent IN (SELECT unnest(?::VARCHAR[])) "
        f"{'AND observed_at <= ? ' if as_of is not None else ''}"
        "ORDER BY observed_at, src_partition, src_offset, idx, event_signature, outcome_signature",
        [sorted(members), *([as_of] if as_of is not None else [])],
    ).fetchall()
    events: dict[str, dict[str, list[Any]]] = {}  # event -> outcome signature -> [tool, outcome, valence, V, obs]
    n: dict[str, int] = {}
    for sig, osig, tool, outcome, valence, agent in rows:
        links = events.setdefault(sig, {})
        n[sig] = n.get(sig, 0) + 1
        a_n = max(alphas.get(agent, DEFAULT_ALPHA), 1.0 / n[sig])
        link = links.setdefault(osig, [tool, outcome, valence, 0.0, 0])
        link[4] += 1
        for k, other in links.items():
            target = 1.0 if k == osig else 0.0
            other[3] = min(1.0, max(0.0, other[3] + a_n * (target - other[3])))
    out = [
        (sig, osig, tool, outcome, valence, v, obs, n[sig], confidence_of(n[sig]))
        for sig, links in events.items()
        for osig, (tool, outcome, valence, v, obs) in links.items()
    ]
    return sorted(out, key=lambda r: (r[2], r[1]))
