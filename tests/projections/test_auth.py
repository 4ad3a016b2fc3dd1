"""Authentication and scoped principals (projections/auth.py): the token store, the policy, and the guard
every HTTP server mounts (real aiohttp servers on 127.0.0.1, a recording read service, no broker)."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from somnus.projections import api, auth
from somnus.projections.auth import MAX_BODY_BYTES, MAX_DEPTH, Principal, Refused, TokenStore, authorize
from somnus.projections.http import make_app
from somnus.schemas.agents import AgentSpec, scope_chain

# ---- the token store --------------------------------------------------------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_tokens_are_stored_hashed_in_a_private_file_and_followed_by_every_reader(tmp_path: Path) -> None:
    store = TokenStore(tmp_path)
    token, record = store.create(agent="support", user="u1", label="frontend")
    raw = store.path.read_bytes()
    assert token.encode() not in raw and record.sha256.encode() in raw
    assert record.sha256 == auth.digest(token) and len(token) >= 43  # 32 random bytes
    assert _mode(store.path) == 0o600
    reader = TokenStore(tmp_path)  # another process's copy (a server)
    assert reader.principal(token) == Principal(token_id=record.id, agent="support", user="u1")
    assert reader.principal(token + "x") is None and reader.principal("") is None
    other, _ = store.create(operator=True)
    assert reader.principal(other) is not None and reader.principal(other).operator  # created later: seen
    assert [r.id for r in store.revoke(record.id[:8])] == [record.id]
    assert reader.principal(token) is None  # revoked: refused on the next request
    assert store.revoke(record.id) == []


def test_a_token_is_for_the_operator_or_an_agent_and_a_user_needs_its_agent(tmp_path: Path) -> None:
    store = TokenStore(tmp_path)
    with pytest.raises(ValueError):
        store.create()
    with pytest.raises(ValueError):
        store.create(user="u1")
    _, rec = store.create(operator=True, agent="ignored")
    assert rec.principal() == Principal(token_id=rec.id, operator=True)


def test_a_corrupt_store_refuses_every_token(tmp_path: Path) -> None:
    store = TokenStore(tmp_path)
    token, _ = store.create(agent="a")
    store.path.write_text("{not json")
    assert TokenStore(tmp_path).principal(token) is None


def test_the_operator_token_file_is_made_once_0600_and_stored_again_if_its_hash_is_lost(tmp_path: Path) -> None:
    home = tmp_path / "home"
    token = auth.ensure_operator_token(home)
    path = auth.token_file(home)
    assert path.read_text().strip() == token and _mode(path) == 0o600 and _mode(home) == 0o700
    assert auth.ensure_operator_token(home) == token  # idempotent
    assert TokenStore(home).principal(token).operator
    (home / auth.STORE_FILE).unlink()
    assert auth.ensure_operator_token(home) == token and TokenStore(home).principal(token).operator
    TokenStore(home).revoke(token)  # revoking it deletes the file: the next start makes a new one
    assert not path.exists() and auth.ensure_operator_token(home) != token


# ---- the policy -------------------------------------------------------------------------------------


def _route(handler: str) -> api.Route:
    return next(r for r in api.all_routes() if r.handler == handler)


OPERATOR = Principal(token_id="op", operator=True)
SUPPORT = Principal(token_id="a", agent="support")
SUPPORT_U1 = Principal(token_id="u", agent="support", user="u1")
# Decided (SECURITY.md): every route without {agent} reads the whole store (these, and any added later).
WHOLE_STORE = {"sql", "promotion_inputs", "predict", "tools", "memory", "summary", "checksum"}


def test_whole_store_routes_need_an_operator_token() -> None:
    assert {r.handler for r in api.all_routes() if "{agent}" not in r.path} >= WHOLE_STORE
    assert {r.handler for r in api.all_routes() if auth.whole_store(r)} == {
        r.handler for r in api.all_routes() if "{agent}" not in r.path or r.handler in auth.OPERATOR_ONLY
    }
    for handler in {r.handler for r in api.all_routes() if auth.whole_store(r)}:
        assert authorize(OPERATOR, _route(handler), None, {}) == {}
        for p in (SUPPORT, SUPPORT_U1):
            with pytest.raises(Refused) as exc:
                authorize(p, _route(handler), None, {"agent": "support"})
            assert exc.value.status == 403 and "operator" in exc.value.message


def test_an_agent_token_reads_its_own_routes_only() -> None:
    for r in api.ROUTES:
        if auth.whole_store(r):
            continue
        assert authorize(SUPPORT, r, "support", {}) == {}
        with pytest.raises(Refused) as exc:
            authorize(SUPPORT, r, "billing", {})
        assert exc.value.status == 403


def test_a_user_bound_token_reads_that_users_memories_only() -> None:
    context = _route("context")
    assert authorize(SUPPORT_U1, context, "support", {"query": "q"}) == {"user_id": "u1"}
    assert authorize(SUPPORT_U1, context, "support", {"user_id": "u1"}) == {"user_id": "u1"}
    assert authorize(SUPPORT_U1, context, "support", {"user_id": ""}) == {"user_id": "u1"}
    with pytest.raises(Refused) as exc:
        authorize(SUPPORT_U1, context, "support", {"user_id": "u2"})
    assert exc.value.status == 403 and "u2" in exc.value.message
    # Every agent route filters by user (issue 25: a user token reads that user's items, not a 403) ...
    for r in api.all_routes():
        if not auth.whole_store(r):
            assert "user_id" in {p[0] for p in r.params}, r.path
            assert authorize(SUPPORT_U1, r, "support", {}) == {"user_id": "u1"}, r.path
    # ... and one added later that cannot could carry other users' memories: refused.
    later = api.Route("GET", "/agents/{agent}/later", "later", "a read without user_id", (("q", "string", ""),))
    with pytest.raises(Refused) as exc:
        authorize(SUPPORT_U1, later, "support", {})
    assert exc.value.status == 403 and "does not filter by user" in exc.value.message
    assert authorize(SUPPORT, later, "support", {}) == {}


# A random fleet: agents with reportsTo (teams) and knowledgeScopes, users, and every principal.
NAMES = st.lists(st.text("abcdefgh", min_size=1, max_size=3), min_size=1, max_size=6, unique=True)


@st.composite
def fleets(draw: Any) -> tuple[dict[str, AgentSpec], list[str]]:
    names = draw(NAMES)
    agents: dict[str, AgentSpec] = {}
    for i, name in enumerate(names):
        lead = draw(st.none() | st.sampled_from(names[:i])) if i else None  # earlier agents only: no cycles
        extra = draw(st.lists(st.sampled_from(names), max_size=2, unique=True))
        agents[name] = AgentSpec(name=name, reports_to=lead, knowledge_scopes=extra)
    users = draw(st.lists(st.text("uvwxyz", min_size=1, max_size=2), max_size=3, unique=True))
    return agents, users


def _principals(agents: dict[str, AgentSpec], users: list[str]) -> list[Principal]:
    return [
        OPERATOR,
        *(Principal(token_id=a, agent=a) for a in agents),
        *(Principal(token_id=f"{a}/{u}", agent=a, user=u) for a in agents for u in users),
    ]


def _in_scope(
    agents: dict[str, AgentSpec], p: Principal, route: api.Route, agent: str | None, params: dict[str, Any]
) -> bool:
    """The oracle, written from the rules, not from the code: what a grant may read."""
    if p.operator:
        return True
    if "{agent}" not in route.path or route.handler in {"sql", "promotion_inputs"}:
        return False
    reads = set(scope_chain(agents, agent))  # type: ignore[arg-type]
    if not reads <= set(scope_chain(agents, p.agent)):  # type: ignore[arg-type]
        return False
    takes = {x[0] for x in route.params}
    if p.user is not None and ("user_id" not in takes or params.get("user_id") != p.user):
        return False
    return "agent" not in takes or params.get("agent") in (None, "", p.agent)


def _requests(agents: dict[str, AgentSpec], users: list[str]) -> Iterator[tuple[api.Route, str | None, dict]]:
    readers = [*agents, "stranger"]
    for route in api.all_routes():
        for agent in readers if "{agent}" in route.path else [None]:
            for user in [None, "", *users, "someone-else"]:
                yield route, agent, ({} if user is None else {"user_id": user})
            yield route, agent, {"agent": readers[0]}


@settings(max_examples=150, deadline=None)
@given(fleets())
def test_no_principal_is_granted_anything_outside_its_scope_in_any_fleet(fleet: Any) -> None:
    agents, users = fleet
    out_of_scope, own_denied = [], []
    for p in _principals(agents, users):
        for route, agent, params in _requests(agents, users):
            try:
                forced = authorize(p, route, agent, params)
            except Refused as exc:
                assert exc.status == 403
                own = (
                    not p.operator
                    and agent == p.agent
                    and p.user is None
                    and not auth.whole_store(route)
                    and params.get("agent") in (None, p.agent)
                )
                if own or p.operator:
                    own_denied.append((p, route.path, agent, params))
                continue
            if not _in_scope(agents, p, route, agent, {**params, **forced}):
                out_of_scope.append((p, route.path, agent, params))
    assert out_of_scope == []
    assert own_denied == []  # and nothing an agent may read of its own is refused


# ---- the guard, over HTTP ---------------------------------------------------------------------------


class Recorder:
    """A read service that answers every handler with what it was called with."""

    sandbox = None  # no SQL sandbox to interrupt when the server stops

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None, dict[str, Any]]] = []

    def __getattr__(self, handler: str) -> Any:
        def call(*args: Any, **params: Any) -> dict[str, Any]:
            agent = args[0] if args else None
            self.calls.append((handler, agent, params))
            return {"handler": handler, "agent": agent, "params": params}

        return call


class Fleet:
    """A guarded app on 127.0.0.1 over a Recorder, with one token per principal."""

    def __init__(self, home: Path) -> None:
        self.store = TokenStore(home)
        self.operator = auth.ensure_operator_token(home)
        self.tokens: dict[tuple[str | None, str | None], str] = {}
        self.service = Recorder()
        self.app = make_app(self.service, api.all_routes(), tokens=self.store)  # type: ignore[arg-type]

    def token(self, agent: str, user: str | None = None) -> str:
        if (agent, user) not in self.tokens:
            self.tokens[agent, user] = self.store.create(agent=agent, user=user)[0]
        return self.tokens[agent, user]


def _serve(home: Path, body: Any) -> Any:
    async def run() -> Any:
        fleet = Fleet(home)
        async with TestClient(TestServer(fleet.app, host="127.0.0.1")) as client:
            return await body(fleet, client)

    return asyncio.run(run())


async def _call(
    client: TestClient,
    route: api.Route,
    agent: str | None,
    token: str | None,
    params: dict[str, Any] | None = None,
    **kw: Any,
) -> tuple[int, Any]:
    path = route.path.replace("{agent}", agent or "")
    headers = {**({"Authorization": f"Bearer {token}"} if token is not None else {}), **kw.pop("headers", {})}
    if route.method == "GET":
        resp = await client.get(path, params=params or {}, headers=headers, **kw)
    else:
        resp = await client.post(path, json=params or {}, headers=headers, **kw)
    async with resp:
        text = await resp.text()
        return resp.status, json.loads(text) if text.startswith("{") else text


def test_every_route_answers_401_without_a_valid_token(tmp_path: Path) -> None:
    async def body(fleet: Fleet, client: TestClient) -> None:
        assert api.all_routes()
        for route in api.all_routes():
            for token in (None, "", "not-a-token", fleet.operator + "x"):
                status, got = await _call(client, route, "support", token)
                assert status == 401, (route.path, token, got)
            resp = await client.request(
                route.method, route.path.replace("{agent}", "a"), headers={"Authorization": f"Basic {fleet.operator}"}
            )
            assert resp.status == 401 and resp.headers["WWW-Authenticate"].startswith("Bearer")
        for path in ("/openapi.json", "/no-such-route"):
            assert (await client.get(path)).status == 401
        assert (await client.get("/openapi.json", headers={"Authorization": f"Bearer {fleet.operator}"})).status == 200
        assert fleet.service.calls == []

    _serve(tmp_path, body)


def test_an_agent_token_gets_403_on_every_route_of_another_agent_and_on_whole_store_routes(tmp_path: Path) -> None:
    async def body(fleet: Fleet, client: TestClient) -> None:
        token = fleet.token("support")
        for route in api.all_routes():
            if auth.whole_store(route):
                status, got = await _call(client, route, None, token)
                assert status == 403 and "operator" in got["error"], route.path
                assert (await _call(client, route, None, fleet.operator))[0] == 200
                continue
            for other in ("billing", "support2", "Support", "support/../billing"):
                status, _ = await _call(client, route, other, token)
                assert status in (403, 404), (route.path, other)  # 404: a path that names no route
            assert (await _call(client, route, "billing", token))[0] == 403
            status, got = await _call(client, route, "support", token)
            assert status == 200 and got["agent"] == "support", route.path
        assert {a for _, a, _ in fleet.service.calls if a is not None} == {"support"}

    _serve(tmp_path, body)


def test_a_user_bound_token_has_user_id_forced_and_another_users_refused(tmp_path: Path) -> None:
    async def body(fleet: Fleet, client: TestClient) -> None:
        token = fleet.token("support", "u1")
        context = _route("context")
        for params in ({"query": "q"}, {"query": "q", "user_id": "u1"}, {"query": "q", "user_id": ""}):
            status, got = await _call(client, context, "support", token, params)
            assert status == 200 and got["params"]["user_id"] == "u1", params
        status, got = await _call(client, context, "support", token, {"query": "q", "user_id": "u2"})
        assert status == 403 and "u2" in got["error"]
        resp = await client.get(
            "/agents/support/context?query=q&user_id=u1&user_id=u2", headers={"Authorization": f"Bearer {token}"}
        )
        assert resp.status == 403 or (await resp.json())["params"]["user_id"] == "u1"
        for route in api.all_routes():  # every agent route: 200 with the user forced; whole-store ones: 403
            params = {"prompt": "p"} if route.method == "POST" else {}
            status, got = await _call(client, route, "support", token, params)
            if auth.whole_store(route):
                assert status == 403, route.path
            else:
                assert status == 200 and got["params"]["user_id"] == "u1", (route.path, got)
        # An agent token without a user reads any user of its agent; another agent's user-bound token nothing here.
        assert (await _call(client, context, "support", fleet.token("support"), {"user_id": "u2"}))[1]["params"] == {
            "user_id": "u2"
        }
        assert (await _call(client, context, "support", fleet.token("billing", "u1"), {"query": "q"}))[0] == 403

    _serve(tmp_path, body)


def test_requests_through_another_host_name_or_from_another_origin_are_refused(tmp_path: Path) -> None:
    async def body(fleet: Fleet, client: TestClient) -> None:
        port = client.server.port
        route = _route("summary")
        ok = {"Authorization": f"Bearer {fleet.operator}"}
        for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1:{port + 1}", f"127.0.0.1.nip.io:{port}", ""):
            status, _ = await _call(client, route, None, fleet.operator, headers={"Host": host})
            assert status == 421, host
        assert (await _call(client, route, None, fleet.operator, headers={"Host": f"localhost:{port}"}))[0] == 200
        for origin in ("http://evil.example", f"http://evil.example:{port}", "null", f"https://127.0.0.1:{port}"):
            status, _ = await _call(client, route, None, fleet.operator, headers={"Origin": origin})
            assert status == 403, origin
        assert (await _call(client, route, None, fleet.operator, headers={"Origin": f"http://127.0.0.1:{port}"}))[
            0
        ] == 200
        # A rebound name is refused before the token is looked at (a page has none anyway).
        assert (await client.get(route.path, headers={**ok, "Host": f"evil.example:{port}"})).status == 421

    _serve(tmp_path, body)


def test_a_post_must_be_json_and_bounded_in_size_and_depth(tmp_path: Path) -> None:
    async def body(fleet: Fleet, client: TestClient) -> None:
        url = "/agents/support/inject"
        ok = {"Authorization": f"Bearer {fleet.token('support')}"}
        for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""):
            resp = await client.post(url, data=b'{"prompt": "p"}', headers={**ok, "Content-Type": ctype})
            assert resp.status == 415, ctype
        sql = {"Authorization": f"Bearer {fleet.operator}"}
        resp = await client.post("/sql", data=b'{"sql": "SELECT 1"}', headers={**sql, "Content-Type": "text/plain"})
        assert resp.status == 415  # no CSRF through a simple request

        async def post(raw: bytes) -> tuple[int, str]:
            resp = await client.post(url, data=raw, headers={**ok, "Content-Type": "application/json"})
            return resp.status, await resp.text()

        assert (await post(b'{"prompt": "p", "n": ' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}"))[0] == 400
        for depth in (MAX_DEPTH + 1, 1000, 100_000):
            status, text = await post(b'{"prompt": "p", "n": ' + b"[" * depth + b"]" * depth + b"}")
            assert status == 400 and "deeper" in text, depth
        assert (await post(b"[" * 300_000))[0] == 400  # unbalanced and deep: still a clean 400
        assert (await post(b'{"prompt": "' + b"[" * 5000 + b'"}'))[0] == 200  # brackets in a string are text
        fleet.service.calls.clear()
        for bad in (b'{"prompt": "\xff"}', b'{"prompt": "\\ud800"}', b'{"prompt": NaN}', b"", b"not json"):
            status, text = await post(bad)
            assert status == 400 and "JSON" in text, bad
        status, text = await post(b'{"prompt": "' + b"x" * (MAX_BODY_BYTES + 10) + b'"}')
        assert status == 400 and "bytes" in text

        async def chunks() -> Any:  # no Content-Length: bounded while it is read
            for _ in range(40):
                yield b"x" * 65536

        resp = await client.post(url, data=chunks(), headers={**ok, "Content-Type": "application/json"})
        assert resp.status == 400
        assert fleet.service.calls == []
        status, text = await post(json.dumps({"prompt": "p", "session_id": "s"}).encode())
        assert status == 200 and fleet.service.calls == [("inject", "support", {"prompt": "p", "session_id": "s"})]

    _serve(tmp_path, body)


def test_a_json_parameter_nested_too_deep_gets_400_not_500(tmp_path: Path) -> None:
    async def run() -> None:
        service = api.ReadService(con=None, agents={}, briefings={})  # type: ignore[arg-type]
        app = make_app(service, api.all_routes(), tokens=TokenStore(tmp_path))
        token = auth.ensure_operator_token(tmp_path)
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            resp = await client.get(
                "/agents/a/recall",
                params={"query": "q", "filters": "[" * 2000 + "]" * 2000},
                headers={"Authorization": f"Bearer {token}"},
            )
            assert resp.status == 400
            # And a real route behind the guard still answers (the body read once, by the guard).
            resp = await client.post(
                "/agents/a/inject", json={"prompt": "You are helpful."}, headers={"Authorization": f"Bearer {token}"}
            )
            assert resp.status == 200 and (await resp.json())["prompt"] == "You are helpful."

    asyncio.run(run())


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fleets())
def test_over_http_no_principal_reads_out_of_scope_in_any_fleet(
    tmp_path_factory: pytest.TempPathFactory, fleet: Any
) -> None:
    """Every route as every principal, through the guard: what reached the read service is in scope."""
    agents, users = fleet
    home = tmp_path_factory.mktemp("fleet")

    async def body(f: Fleet, client: TestClient) -> None:
        principals = {
            f.operator: OPERATOR,
            **{
                f.token(p.agent, p.user): p  # type: ignore[arg-type]
                for p in _principals(agents, users)
                if not p.operator
            },
        }
        for token, p in principals.items():
            for route, agent, params in _requests(agents, users):
                before = len(f.service.calls)
                status, got = await _call(client, route, agent, token, params)
                assert status in (200, 400, 403), (status, got)  # 400: a parameter the route does not take
                if status == 200:
                    ((handler, seen_agent, seen),) = f.service.calls[before:]
                    assert _in_scope(agents, p, route, seen_agent, seen), (p, route.path, agent, params, seen)
                else:
                    assert len(f.service.calls) == before

    _serve(home, body)


# ---- the clients send the token ---------------------------------------------------------------------


def test_a_json_parameter_holding_a_lone_surrogate_gets_400_naming_it_not_500(tmp_path: Path) -> None:
    # issue 25, 2026-11-27: "\\ud800" is valid JSON (a POST body's strict parser refuses it, a query
    # parameter's did not): GET /predict?args={"\\ud800": 1} was a 500 when the arguments were encoded
    import duckdb

    from somnus.projections import schema

    con = duckdb.connect()
    schema.init(con)

    async def run() -> None:
        service = api.ReadService(con=con.cursor(), agents={})
        app = make_app(service, api.all_routes(), tokens=TokenStore(tmp_path))
        headers = {"Authorization": f"Bearer {auth.ensure_operator_token(tmp_path)}"}
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            for path, name, value in [
                ("/predict", "args", '{"\\ud800": 1}'),
                ("/predict", "args", '{"a": ["x", "\\udfff"]}'),
                ("/agents/a/recall", "filters", '{"tool": "\\ud800"}'),
            ]:
                params = {name: value, "tool": "t"} if path == "/predict" else {name: value, "query": "q"}
                async with client.get(path, params=params, headers=headers) as resp:
                    got = await resp.json()
                    assert resp.status == 400 and f"`{name}`" in got["error"] and "surrogate" in got["error"], got
            async with client.get("/predict", params={"tool": "t", "args": '{"a": "\\u00e9"}'}, headers=headers) as ok:
                assert ok.status == 200 and "a" in (await ok.json())["params"]  # other escapes still read

    asyncio.run(run())
    con.close()


def test_reads_send_somnus_token_else_the_projectors_token_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from somnus import reads
    from somnus.projections.endpoint import endpoint_file

    db = tmp_path / "x.duckdb"
    home = tmp_path / "projector-home"
    token = auth.ensure_operator_token(home)
    monkeypatch.delenv("SOMNUS_TOKEN", raising=False)
    monkeypatch.setenv("SOMNUS_HOME", str(tmp_path / "elsewhere"))
    assert reads.token_for(db) is None and reads.auth_headers(db) == {}
    endpoint_file(db).write_text(
        json.dumps({"pid": os.getpid(), "port": 1, "briefing_port": 2, "token_file": str(auth.token_file(home))})
    )
    assert reads.auth_headers(db) == {"Authorization": f"Bearer {token}"}
    monkeypatch.setenv("SOMNUS_TOKEN", "scoped")
    assert reads.token_for(db) == "scoped" and reads.token_for(db, "given") == "given"


def test_the_read_client_gets_a_clear_error_for_401_and_403(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """somnus.reads over a guarded server: the operator's file works; a scoped SOMNUS_TOKEN gets a 403 it can read."""
    from somnus import reads
    from somnus.projections.endpoint import endpoint_file

    async def run() -> None:
        fleet = Fleet(tmp_path / "home")
        agent_token = fleet.token("support")
        server = TestServer(fleet.app, host="127.0.0.1")
        await server.start_server()
        db = tmp_path / "x.duckdb"
        endpoint_file(db).write_text(
            json.dumps({"pid": os.getpid(), "port": server.port, "token_file": str(auth.token_file(tmp_path / "home"))})
        )
        try:
            monkeypatch.delenv("SOMNUS_TOKEN", raising=False)
            got = await asyncio.to_thread(reads.read, db, "summary")
            assert got == {"handler": "summary", "agent": None, "params": {}}
            got = await asyncio.to_thread(reads.read, db, "inject", "support", prompt="p", token=agent_token)
            assert got["params"] == {"prompt": "p"}
            monkeypatch.setenv("SOMNUS_TOKEN", agent_token)
            with pytest.raises(reads.ReadError, match="operator.*HTTP 403"):
                await asyncio.to_thread(reads.read, db, "summary")
            monkeypatch.setenv("SOMNUS_TOKEN", "nope")
            with pytest.raises(reads.ReadError, match="HTTP 401"):
                await asyncio.to_thread(reads.read, db, "briefing", "support")
        finally:
            await server.close()

    asyncio.run(run())


def test_the_token_command_creates_lists_and_revokes(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from somnus.cli import app

    runner = CliRunner()
    home = ["--home", str(tmp_path)]
    made = runner.invoke(app, ["token", "create", "--agent", "support", "--user", "u1", "--label", "web", *home])
    assert made.exit_code == 0, made.output
    token = made.stdout.strip().splitlines()[-1]
    p = TokenStore(tmp_path).principal(token)
    assert p is not None and (p.agent, p.user, p.operator) == ("support", "u1", False)
    assert _mode(tmp_path / auth.STORE_FILE) == 0o600 and token not in (tmp_path / auth.STORE_FILE).read_text()
    op = runner.invoke(app, ["token", "create", "--operator", *home]).stdout.strip().splitlines()[-1]
    assert TokenStore(tmp_path).principal(op).operator
    assert runner.invoke(app, ["token", "create", *home]).exit_code != 0  # neither --agent nor --operator
    assert runner.invoke(app, ["token", "create", "--operator", "--agent", "a", *home]).exit_code != 0
    listed = json.loads(runner.invoke(app, ["token", "list", "--json", *home]).stdout)
    assert [(r["agent"], r["user"], r["operator"]) for r in listed] == [("support", "u1", False), (None, None, True)]
    assert all("sha256" not in r and token not in json.dumps(r) for r in listed)
    assert runner.invoke(app, ["token", "revoke", p.token_id, *home]).exit_code == 0
    assert TokenStore(tmp_path).principal(token) is None
    assert runner.invoke(app, ["token", "revoke", "abc", *home]).exit_code != 0


# ---- token expiry ------------------------------------------------------------------------------------


def test_parse_duration_takes_a_positive_number_and_a_unit() -> None:
    from datetime import timedelta

    assert auth.parse_duration("30d") == timedelta(days=30)
    assert auth.parse_duration("12h") == timedelta(hours=12)
    assert auth.parse_duration("2w") == timedelta(weeks=2)
    assert auth.parse_duration("90s") == timedelta(seconds=90)
    assert auth.parse_duration("5m") == timedelta(minutes=5)
    for bad in ("", "30", "d", "0d", "-1d", "1.5d", "30 days", "1y", "9999999d"):
        with pytest.raises(ValueError, match="--expires"):
            auth.parse_duration(bad)


def test_a_token_expires_at_its_time_and_an_unreadable_expiry_counts_as_past(tmp_path: Path) -> None:
    from datetime import datetime, timedelta, timezone

    now = datetime(2026, 11, 26, 12, tzinfo=timezone.utc)
    store = TokenStore(tmp_path)
    token, record = store.create(agent="support", expires_at=now + timedelta(days=1))
    assert record.expires_at == "2026-11-27T12:00:00+00:00"
    assert store.principal(token, now=now) == Principal(token_id=record.id, agent="support")
    assert store.principal(token, now=now + timedelta(days=1)) is None  # at its expiry: refused
    forever = store.create(agent="support")[0]
    assert store.principal(forever, now=now + timedelta(days=10_000)) is not None
    assert json.loads((tmp_path / auth.STORE_FILE).read_text())["tokens"][0]["sha256"] == auth.digest(token)
    assert token not in (tmp_path / auth.STORE_FILE).read_text() and _mode(tmp_path / auth.STORE_FILE) == 0o600
    with pytest.raises(ValueError, match="time zone"):
        store.create(agent="support", expires_at=datetime(2030, 1, 1))
    for stored, expired in (("garbage", True), ("2026-11-27T12:00:00", False), ("2026-11-26T11:00:00", True)):
        assert auth.TokenRecord(id="x", sha256="y", agent="a", expires_at=stored).expired(now) is expired, stored


def test_an_expired_token_gets_401_saying_so_on_every_request(tmp_path: Path) -> None:
    from datetime import datetime, timedelta, timezone

    async def body(fleet: Fleet, client: TestClient) -> None:
        soon, record = fleet.store.create(agent="support", expires_at=datetime.now(timezone.utc) + timedelta(seconds=4))
        expired, old = fleet.store.create(agent="support", expires_at=datetime.now(timezone.utc) - timedelta(seconds=1))
        context = _route("context")
        assert (await _call(client, context, "support", soon, {"query": "q"}))[0] == 200
        for route in api.all_routes():
            status, got = await _call(client, route, "support", expired)
            assert status == 401 and f"token {old.id} expired at {old.expires_at}" in got["error"], route.path
        # until just past its expiry (4 s: the calls above take well over 1 s on a loaded machine)
        left = datetime.fromisoformat(record.expires_at) - datetime.now(timezone.utc)
        await asyncio.sleep(max(0.0, left.total_seconds()) + 0.2)
        status, got = await _call(client, context, "support", soon, {"query": "q"})
        assert status == 401 and "expired" in got["error"]  # checked on each request, not at login

    _serve(tmp_path, body)


def test_the_token_command_takes_an_expiry(tmp_path: Path) -> None:
    from datetime import datetime, timedelta, timezone

    from typer.testing import CliRunner

    from somnus.cli import app

    runner = CliRunner()
    home = ["--home", str(tmp_path)]
    before = datetime.now(timezone.utc)
    made = runner.invoke(app, ["token", "create", "--agent", "support", "--expires", "30d", *home])
    assert made.exit_code == 0, made.output
    (record,) = TokenStore(tmp_path).records()
    at = datetime.fromisoformat(record.expires_at)
    assert before + timedelta(days=30) - timedelta(seconds=1) <= at <= datetime.now(timezone.utc) + timedelta(days=30)
    listed = json.loads(runner.invoke(app, ["token", "list", "--json", *home]).stdout)
    assert listed[0]["expires_at"] == record.expires_at
    bad = runner.invoke(app, ["token", "create", "--agent", "support", "--expires", "soon", *home])
    assert bad.exit_code != 0 and "--expires 'soon'" in bad.output
    assert len(TokenStore(tmp_path).records()) == 1
