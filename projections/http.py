"""The read API over HTTP: one aiohttp handler per ``api.Route``, every request checked by ``auth.guard``.

Served by the projector (every route) and by the briefing server (``briefing`` and ``inject``);
``serve`` starts them (and the OTLP receiver) with bounded connections: a connection without a
request in progress, silent or sending its headers byte by byte, is closed after ``IDLE_TIMEOUT_S``,
and at ``MAX_CONNECTIONS`` the oldest open connection is closed for each new one. Without them one
local process held every connection it opened for an hour (aiohttp's ``AppRunner`` keeps an idle
connection 3,630 s) and, with as many connections as the server's file limit, made it refuse every
client and every file it opens (SECURITY.md, "Tested attacks").
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

import duckdb
from aiohttp import web

from somnus.projections import api, auth, queries

IDLE_TIMEOUT_S = 10.0  # a connection with no request in progress (before its first one too) is closed then
MAX_CONNECTIONS = 512  # open at once; a new one beyond closes the oldest (well under the process's file limit)
OFFLOOP_THREADS = 4  # analysts' queries that run at once (projections/sql_sandbox.py); more wait their turn


def route_handler(
    service: api.ReadService, route: api.Route, write_lock: asyncio.Lock | None = None, offloop: Executor | None = None
) -> Any:
    """The aiohttp handler of ``route`` on ``service``: parameters from the query (and a POST's JSON
    body), errors as 400/404 with the message; reads of a fold's in-memory state take ``write_lock``
    so they never see a batch half applied; a route that may run long (``Route.offloop``: analysts'
    SQL) runs in ``offloop``'s threads, so the event loop keeps answering (and the writer's threads
    are not taken)."""

    async def handle(request: web.Request) -> web.Response:
        params: dict[str, Any] = dict(request.query)
        if route.method == "POST":
            try:
                body = await auth.json_body(request)  # bounded in size and depth; read once by the guard
            except auth.Refused as exc:
                return exc.response()
            if not isinstance(body, dict):
                return web.json_response({"error": "the body must be a JSON object"}, status=400)
            params.update(body)
        try:
            if route.stateful and write_lock is not None:  # not while a batch changes the state
                async with write_lock:
                    result = api.call(service, route, request.match_info.get("agent"), params)
            elif route.offloop:  # its JSON is made there too: a large answer does not hold the loop either
                text = await asyncio.get_running_loop().run_in_executor(
                    offloop, lambda: dumps(api.call(service, route, request.match_info.get("agent"), params))
                )
                return web.Response(text=text, content_type="application/json")
            else:
                result = api.call(service, route, request.match_info.get("agent"), params)
        except api.NotFound as exc:
            return web.json_response({"error": str(exc)}, status=404)
        except (api.BadRequest, queries.NotReadOnly, duckdb.Error) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        except RecursionError:  # a JSON parameter (filters, args) nested too deep for the parser
            return web.json_response({"error": "a parameter is nested too deep"}, status=400)
        return web.json_response(result, dumps=dumps)

    return handle


def make_app(
    service: api.ReadService,
    routes: list[api.Route],
    write_lock: asyncio.Lock | None = None,
    *,
    tokens: auth.TokenStore,
) -> web.Application:
    """An aiohttp app answering ``routes`` on ``service`` (``route_handler``) and ``GET /openapi.json``,
    every request checked by ``auth.guard`` against ``tokens`` (the bearer token, Host, content type, body)."""

    async def openapi(request: web.Request) -> web.Response:
        return web.json_response(api.openapi())

    app = web.Application(middlewares=[auth.guard(tokens)], client_max_size=auth.MAX_BODY_BYTES)
    pool = ThreadPoolExecutor(OFFLOOP_THREADS, thread_name_prefix="somnus-sql")

    async def stop_offloop(app: web.Application) -> None:  # a stopping server interrupts analysts' queries
        if getattr(service, "sandbox", None) is not None:
            service.sandbox.interrupt()
        pool.shutdown(wait=False, cancel_futures=True)

    app.on_cleanup.append(stop_offloop)
    app.add_routes([web.route(r.method, r.path, route_handler(service, r, write_lock, pool)) for r in routes])
    app.add_routes([web.get("/openapi.json", openapi)])
    return app


def dumps(obj: Any) -> str:
    return json.dumps(obj, default=str)


class BoundedSite(web.TCPSite):
    """A ``TCPSite`` holding at most ``max_connections``: each connection accepted beyond closes the
    oldest one still open. A slow client's connections are the oldest, so a client that sends its
    request when it connects is served while they last; a request in progress on the oldest connection
    is lost only when ``max_connections`` newer connections arrive before it ends.

    It replaces ``TCPSite.start`` (aiohttp 3.14) to wrap the runner's protocol factory: it relies on
    ``_host``, ``_port``, ``_backlog``, ``_server`` and ``_bound_port`` (pinned by
    ``tests/projections/test_http.py``)."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, max_connections: int = MAX_CONNECTIONS) -> None:
        super().__init__(runner, host, port)
        self.max_connections = max_connections

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None

        def admit() -> Any:
            open_now = [h for h in server.connections if h.transport is not None]  # not closing already
            for oldest in open_now[: max(0, len(open_now) - self.max_connections + 1)]:
                oldest.force_close()
            return server()

        self._server = await asyncio.get_running_loop().create_server(
            admit, self._host, self._port, backlog=self._backlog
        )
        self._bound_port = self._server.sockets[0].getsockname()[1]


async def serve(
    app: web.Application,
    host: str,
    port: int,
    *,
    idle_timeout_s: float = IDLE_TIMEOUT_S,
    max_connections: int = MAX_CONNECTIONS,
) -> tuple[web.AppRunner, int]:
    """``app`` served on ``host:port`` (0: any free port) with bounded connections (module docstring):
    the runner (``cleanup()`` stops it) and the bound port."""
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=idle_timeout_s)
    await runner.setup()
    site = BoundedSite(runner, host, port, max_connections)
    await site.start()
    return runner, site.port
