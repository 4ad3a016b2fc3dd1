"""The read API (projections/api.py) served as the projector serves it (``make_app``: the guard, the
route handlers) over a real ``ReadService`` on a small projected fleet: every route's status codes
and JSON shape, what each kind of token gets, and bad input answered 4xx, never 500.

The fleet is the isolation test's (tests/projections/test_isolation.py): agents ``aga`` and ``agb``
of separate teams, sessions of users ``up`` and ``uq`` and of no user, each carrying a marker
``mk<agent><user>k`` in its text.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from somnus.projections import api, auth, schema
from somnus.projections.projector import make_app
from somnus.schemas.agents import AgentSpec
from tests.projections.test_isolation import marker, project

AGENTS = {"aga": AgentSpec(name="aga"), "agb": AgentSpec(name="agb")}
# (agent index, user index or None, day, private tool fails, search fails, ends)
SESSIONS = [(i, u, d, d % 2 == 0, True, True) for i in (0, 1) for u in (None, 0, 1) for d in range(2)]
ENTITY = "tool:search"
# What each route needs to answer 200, and what its answer looks like: (JSON type, keys it always has).
VALID: dict[str, dict[str, Any]] = {
    "inject": {"prompt": "You are helpful."},
    "history": {"entity": ENTITY},
    "recall": {"query": "search upstream"},
    "episodic_context": {"query": "search upstream"},
    "context": {"query": "search upstream"},
    "predict": {"tool": "search"},
    "sql": {"sql": "SELECT count(*) AS n FROM episodes"},
    "advise": {"task": "search upstream"},
}
SHAPES: dict[str, tuple[type, set[str]]] = {
    "briefing": (dict, {"agent", "briefing"}),
    "inject": (dict, {"agent", "briefing_id", "prompt"}),
    "facts": (list, {"triple_id", "source", "predicate", "target", "scope", "confidence", "valid_from"}),
    "entities": (list, {"entity_id", "name", "type", "attributes", "facts"}),
    "history": (list, {"ordinal", "triple_id", "change", "episode_id", "source", "predicate", "target"}),
    "sql": (dict, {"columns", "rows"}),
    "recall": (dict, {"agent", "query", "people", "hits"}),
    "episodic_context": (dict, {"agent", "query", "entries", "text"}),
    "context": (dict, {"text", "session_id"}),
    "knowledge_context": (list, set()),
    "stream_time": (dict, {"scope", "agents", "at"}),
    "promotion_inputs": (dict, set()),
    "predict": (dict, set()),
    "tools": (list, {"tool", "calls", "errors", "error_rate"}),
    "rhythms": (list, set()),
    "oscillators": (list, set()),
    "memory": (dict, {"episodes", "graph", "briefings", "utilisation", "delegations"}),
    "summary": (dict, {"counts", "offsets"}),
    "checksum": (dict, {"checksum", "tables"}),
    "advise": (dict, set()),
    "kafka_positions": (dict, set()),
    "export_parquet": (dict, set()),
    "goals": (dict, {"agent", "goals"}),
    "wander": (dict, {"agent", "goals", "steps"}),
}
# Answered only inside a running projector (it asks Kafka on its own loop): 404 here, saying so.
PROJECTOR_ONLY = {"kafka_positions"}
HIT_KEYS = {"memory_id", "rank", "score", "kind", "agent", "run_id", "occurred_at", "text", "source_event_ids"}


class Served:
    """The fleet's DuckDB file, its read service and a token store with one token per kind."""

    def __init__(self, tmp: Path) -> None:
        self.con = duckdb.connect(str(tmp / "api.duckdb"))
        schema.init(self.con)
        seen = project(self.con, {"agents": AGENTS, "users": 2, "sessions": SESSIONS})
        self.service = api.ReadService(
            con=self.con,
            agents=AGENTS,
            briefings=seen.briefings.current,
            episodic=seen.memory,
            semantic=seen.semantic,
            top_facts=seen.top_facts,
        )
        store = auth.TokenStore(tmp)
        self.operator = auth.ensure_operator_token(tmp)
        self.agent = store.create(agent="aga")[0]
        self.user = store.create(agent="aga", user="up")[0]
        self.index = seen.memory.state.index
        self.store = store


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    s = Served(tmp_path_factory.mktemp("api"))
    yield s
    s.con.close()


def serve(s: Served, body: Callable[[TestClient], Awaitable[None]]) -> None:
    async def run() -> None:
        app = make_app(s.service, api.all_routes(), tokens=s.store)  # an app lives on one event loop
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            await body(client)

    asyncio.run(run())


async def call(
    client: TestClient, route: api.Route, token: str | None, params: dict[str, Any] | None = None, agent: str = "aga"
) -> tuple[int, Any]:
    path = route.path.replace("{agent}", agent)
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    if route.method == "GET":
        resp = await client.get(path, params=params or {}, headers=headers)
    else:
        resp = await client.post(path, json=params or {}, headers=headers)
    async with resp:
        assert resp.content_type == "application/json", (route.path, resp.content_type)
        return resp.status, json.loads(await resp.text())


def route(handler: str) -> api.Route:
    return next(r for r in api.all_routes() if r.handler == handler)


def check_shape(handler: str, got: Any) -> None:
    kind, keys = SHAPES[handler]
    assert isinstance(got, kind), (handler, got)
    items = got if isinstance(got, list) else [got]
    for item in items:
        assert isinstance(item, dict) and keys <= set(item), (handler, sorted(keys - set(item)))


def test_every_route_has_a_shape_and_is_described_in_openapi() -> None:
    assert {r.handler for r in api.all_routes()} == set(SHAPES)
    spec = api.openapi()
    for r in api.all_routes():
        op = spec["paths"][r.path][r.method.lower()]
        assert op["operationId"] == r.handler
        described = {p["name"] for p in op.get("parameters", []) if p["in"] == "query"} | set(
            op.get("requestBody", {})
            .get("content", {})
            .get("application/json", {})
            .get("schema", {})
            .get("properties", {})
        )
        assert described == {p[0] for p in r.params}, r.path


def test_every_route_answers_the_operator_200_with_its_json_shape(served: Served) -> None:
    async def body(client: TestClient) -> None:
        for r in api.all_routes():
            params = VALID.get(r.handler)
            if r.handler == "export_parquet":  # a new folder each time
                params = {"dir": str(Path(tempfile.mkdtemp()) / "export")}
            status, got = await call(client, r, served.operator, params)
            if r.handler in PROJECTOR_ONLY:
                assert status == 404 and "running projector" in got["error"], (r.path, got)
                continue
            assert status == 200, (r.path, got)
            check_shape(r.handler, got)
        status, got = await call(
            client, route("recall"), served.operator, {"query": "search upstream", "user_id": "up"}
        )
        assert got["hits"] and all(HIT_KEYS <= set(h) for h in got["hits"])
        status, got = await call(client, route("sql"), served.operator, VALID["sql"])
        assert got["columns"] == ["n"] and got["rows"][0][0] > 0
        assert (await client.get("/openapi.json", headers={"Authorization": f"Bearer {served.operator}"})).status == 200

    serve(served, body)


def test_recall_without_a_signal_fuses_the_others_alone(served: Served) -> None:
    """``without``: an ablation (``somnus eval locomo --without graph``); each hit's fused score is the
    weighted reciprocal ranks of the signals left in."""
    from somnus.processors.episodic.recall import DEFAULT_WEIGHTS, RRF_K

    async def body(client: TestClient) -> None:
        params = {"query": "search upstream", "user_id": "up", "explain": "true", "without": "lexical, graph"}
        status, got = await call(client, route("recall"), served.operator, params)
        assert status == 200 and got["hits"]
        for h in got["hits"]:
            left = sum(DEFAULT_WEIGHTS[n] / (RRF_K + r) for n, r in h["ranks"].items() if n not in ("lexical", "graph"))
            assert h["score"] == pytest.approx(left, abs=1e-6)

    serve(served, body)


def test_no_token_401_another_agent_403_own_agent_200(served: Served) -> None:
    async def body(client: TestClient) -> None:
        for r in api.all_routes():
            params = VALID.get(r.handler)
            assert (await call(client, r, None, params))[0] == 401, r.path
            assert (await call(client, r, "forged", params))[0] == 401, r.path
            status, got = await call(client, r, served.agent, params)
            if auth.whole_store(r):
                assert status == 403 and "operator" in got["error"], r.path
                continue
            assert status == 200, (r.path, got)
            check_shape(r.handler, got)
            status, got = await call(client, r, served.agent, params, agent="agb")
            assert status == 403 and "'aga' only" in got["error"], r.path

    serve(served, body)


def user_of(s: Served, memory_id: str) -> str | None:
    return s.index.units[s.index.pos[memory_id]].user_id


def test_a_user_bound_token_reads_its_users_items_on_every_route(served: Served) -> None:
    async def body(client: TestClient) -> None:
        own, other = marker(0, 0), marker(0, 1)
        for r in api.all_routes():
            params = VALID.get(r.handler)
            status, got = await call(client, r, served.user, params)
            if auth.whole_store(r):
                assert status == 403, r.path
                continue
            assert status == 200, (r.path, got)
            check_shape(r.handler, got)
            assert other not in json.dumps(got), r.path  # user uq's text, on no route
            status, got = await call(client, r, served.user, {**(params or {}), "user_id": "uq"})
            assert status == 403 and "'uq'" in got["error"], r.path
        status, got = await call(client, route("recall"), served.user, {"query": f"{own} {other} search", "k": 50})
        users = {user_of(served, h["memory_id"]) for h in got["hits"]}
        assert "up" in users and users <= {"up", None}, users
        status, got = await call(client, route("facts"), served.user, {"limit": 500})
        assert own in json.dumps(got)
        status, got = await call(client, route("briefing"), served.user)
        assert got["briefing"] is None and "several users" in got["withheld"]
        status, got = await call(client, route("inject"), served.user, {"prompt": "P"})
        assert got["prompt"] == "P" and got["briefing_id"] is None
        status, got = await call(client, route("inject"), served.agent, {"prompt": "P"})
        assert got["prompt"] != "P" and got["briefing_id"]  # the agent's token gets the briefing

    serve(served, body)


# Bad input: each gets a 400 (or 404/405) whose message names what is wrong.
BAD: list[tuple[str, dict[str, Any], str]] = [
    ("facts", {"limit": "many"}, "limit"),
    ("facts", {"limit": "0"}, "limit"),
    ("facts", {"as_of": "yesterday"}, "as_of"),
    ("entities", {"limit": "-3"}, "limit"),
    ("history", {}, "entity"),
    ("recall", {}, "query"),
    ("recall", {"query": "q", "k": "1001"}, "k"),
    ("recall", {"query": "q", "filters": "{not json"}, "filters"),
    ("recall", {"query": "q", "filters": "[1, 2]"}, "filters"),
    ("recall", {"query": "q", "without": "graph,gravity"}, "without"),
    ("recall", {"query": "q", "filters": "[" * 2000}, "nested too deep"),
    ("episodic_context", {"query": "q", "min_relevance": "2"}, "min_relevance"),
    ("episodic_context", {"query": "q", "success_only": "maybe"}, "success_only"),
    ("context", {}, "query"),
    ("context", {"query": "q", "max_tokens": "x"}, "max_tokens"),
    ("knowledge_context", {"limit": "101"}, "limit"),
    ("rhythms", {"hours": "nine"}, "hours"),
    ("rhythms", {"top": "0"}, "top"),
    ("stream_time", {"scope": "team:"}, "scope"),
    ("promotion_inputs", {"owner": "0"}, "owner"),
    ("predict", {}, "tool"),
    ("predict", {"tool": "t", "args": "[1]"}, "args"),
    ("predict", {"tool": "t", "args": "{"}, "args"),
    ("predict", {"tool": "t", "args": "[" * 1500}, "args"),  # Python's decoder recursed: a 500 before
    ("memory", {"top": "lots"}, "top"),
    ("inject", {}, "prompt"),
    ("inject", {"prompt": 3}, "prompt"),
    ("inject", {"prompt": "p", "session_id": 4}, "session_id"),
    ("inject", {"prompt": "p", "user_id": 5}, "user_id"),
    ("sql", {}, "sql"),
    ("sql", {"sql": "DELETE FROM episodes"}, ""),
    ("sql", {"sql": "SELECT 1", "params": "x"}, "params"),
    ("facts", {"colour": "red"}, "colour"),
    ("goals", {"all": "maybe"}, "all"),
    ("wander", {"steps": "101"}, "steps"),
    ("wander", {"seed": "-1"}, "seed"),
    ("recall", {"query": "q", "goals": "maybe"}, "goals"),
]


def test_a_lone_surrogate_in_any_parameter_is_named_before_duckdb_meets_it(served: Served) -> None:
    """In process (and so for any caller but HTTP, whose query strings and bodies cannot carry one), a
    string parameter with a lone surrogate failed inside DuckDB's Python conversion."""
    routes = {r.handler: r for r in api.ROUTES}
    for handler, agent, params, name in [
        ("facts", "aga", {"entity": "\ud800"}, "entity"),
        ("entities", "aga", {"type": "x\udfff"}, "type"),
        ("history", "\ud800", {"entity": "e"}, "agent"),
    ]:
        with pytest.raises(api.BadRequest, match=f"parameter `{name}`: not valid Unicode text"):
            api.call(served.service, routes[handler], agent, params)


@pytest.mark.parametrize(("handler", "params", "names"), BAD, ids=[f"{h}-{'-'.join(p) or 'none'}" for h, p, _ in BAD])
def test_bad_input_is_a_400_naming_it(served: Served, handler: str, params: dict[str, Any], names: str) -> None:
    async def body(client: TestClient) -> None:
        status, got = await call(client, route(handler), served.operator, params)
        assert status == 400, (handler, params, got)
        assert isinstance(got["error"], str) and names in got["error"], got

    serve(served, body)


def test_malformed_requests_get_4xx_not_500(served: Served) -> None:
    async def body(client: TestClient) -> None:
        auth_header = {"Authorization": f"Bearer {served.operator}"}
        for data, ctype, want in (
            (b"[1, 2]", "application/json", 400),
            (b"{", "application/json", 400),
            (b'{"prompt": "\xff"}', "application/json", 400),
            (b"[" * 40 + b"]" * 40, "application/json", 400),
            (b'{"prompt": "p"}', "text/plain", 415),
        ):
            resp = await client.post("/agents/aga/inject", data=data, headers={**auth_header, "Content-Type": ctype})
            assert resp.status == want, (data[:20], resp.status, await resp.text())
        assert (await client.get("/agents/aga/nothing", headers=auth_header)).status == 404
        assert (await client.delete("/agents/aga/facts", headers=auth_header)).status == 405

    serve(served, body)


VALUES = st.one_of(
    st.text(max_size=30), st.integers(-(10**6), 10**6).map(str), st.sampled_from(["", "[", "{}", "0", "nan"])
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(st.sampled_from(sorted(api.all_routes(), key=lambda r: r.handler)), st.data())
def test_any_parameter_values_get_an_answer_or_a_4xx_never_a_500(served: Served, r: api.Route, data: Any) -> None:
    names = [p[0] for p in r.params if p[0] not in ("record",)]
    params = {n: data.draw(VALUES, label=n) for n in names if data.draw(st.booleans(), label=f"send {n}")}
    if r.handler == "recall":
        params["record"] = "false"  # an evaluation's look: nothing to publish

    async def body(client: TestClient) -> None:
        status, got = await call(client, r, served.operator, params)
        assert status in ((404,) if r.handler in PROJECTOR_ONLY else (200, 400)), (r.path, params, status, got)
        if status == 400:
            assert got["error"]
        else:
            check_shape(r.handler, got)

    serve(served, body)


def test_call_refuses_unknown_parameters_and_passes_the_agent_only_to_agent_routes(served: Served) -> None:
    with pytest.raises(api.BadRequest, match="unknown parameter"):
        api.call(served.service, route("summary"), None, {"agent": "aga"})
    assert api.call(served.service, route("facts"), "aga", {"limit": "2"}) == served.service.facts("aga", limit=2)
    assert api.call(served.service, route("checksum"), None, {})["checksum"]


def test_an_injection_naming_a_session_id_too_long_is_refused_and_records_nothing():
    # issue 25, 2026-11-27: an agent token's inject with a 1 MB session id made a 1 MB BriefingServed on
    # the facts topic and a 1 MB row of briefings_served, once a request (/memory reads 5,000 of them)
    from tests.projections.test_briefing_server import _briefing

    served: list[Any] = []
    svc = api.ReadService(
        con=None,  # type: ignore[arg-type]
        agents={},
        briefings={"support": _briefing("support", "check the invoice")},
        on_served=served.append,
    )
    with pytest.raises(api.BadRequest, match=f"`session_id`: 1000000 characters, at most {api.MAX_SESSION_ID}"):
        svc.inject("support", prompt="P", session_id="s" * 1_000_000)
    assert served == []
    got = svc.inject("support", prompt="P", session_id="s" * api.MAX_SESSION_ID)
    assert got["briefing_id"] and [s.session_id for s in served] == ["s" * api.MAX_SESSION_ID]
