"""Briefing reads from a process of their own, so ingest cannot hold them up.

The projector's HTTP server shares its process, and so its GIL, with the batches it writes: a read
waits while a fold runs Python or a C call that keeps the GIL, and on a busy machine the folding
thread may hold it while the OS has it descheduled. Briefings are what runtimes read before every
session, so they get a small server process of their own:

- the projector starts it (``BriefingServer.start``), sends it every cached briefing, then each
  briefing a refresh changed, over a pipe (``publish``);
- it answers ``GET /agents/{agent}/briefing`` and ``POST /agents/{agent}/inject`` with the same
  ``somnus.projections.api`` routes and code as the projector's own server, from its copy of the cache;
- an injection for a named session is sent back over a second pipe as a ``BriefingServed``, which
  the projector publishes on the facts topic as it does for its own server (utilisation is counted
  from the log, whoever served it);
- its port is written to the projector's endpoint file as ``briefing_port``; ``somnus.reads`` sends
  those two reads there. The projector's own server answers them too (same answer);
- it checks every request as the projector does (``somnus.projections.auth.guard``), against the token store
  of the projector's ``SOMNUS_HOME`` (its path is the last argument).

The child exits when the pipe from the projector closes (the projector stopped or died).
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from collections.abc import Callable, Iterable
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import msgspec

from somnus.schemas.briefing import BriefingGenerated, BriefingServed
from aiohttp import web
from somnus.projections import api, auth
from somnus.projections.http import dumps, make_app, route_handler
from somnus.projections.http import serve as serve_bounded
from somnus.projections.routes import BRIEFING_SERVER_HANDLERS as ROUTES  # the api handlers it answers

log = logging.getLogger("somnus.briefing_server")
CHUNK = 500  # briefings per message on the pipe
_briefings = msgspec.json.Decoder(list[BriefingGenerated])
_served = msgspec.json.Decoder(BriefingServed)


def main(argv: list[str] | None = None) -> None:
    """The server process (``python -m somnus.projections.briefing_server UPDATES SERVED PORTS HOME``, the file
    descriptors of its pipe ends and the projector's ``SOMNUS_HOME``): an aiohttp app on 127.0.0.1 over
    the cache the projector sends."""
    logging.basicConfig(level=logging.WARNING)
    args = argv or sys.argv[1:]
    updates, served, ports = (
        Connection(int(fd), writable=w, readable=not w) for fd, w in zip(args[:3], (False, True, True))
    )
    asyncio.run(_serve(updates, served, ports, Path(args[3])))


async def _serve(updates: Connection, served: Connection, ports: Connection, home: Path) -> None:
    cache: dict[str, BriefingGenerated] = {}
    service = api.ReadService(
        con=None,  # type: ignore[arg-type]
        agents={},
        briefings=cache,
        on_served=lambda r: served.send_bytes(msgspec.json.encode(r)),
    )
    # GET is answered from bodies encoded when a briefing arrives (the route's own answer, the same
    # bytes); inject goes through the route, as it depends on the request.
    bodies: dict[str, bytes] = {}

    def encoded(agent: str) -> bytes:
        return dumps(service.briefing(agent)).encode()

    def body(agent: str) -> bytes:
        got = bodies.get(agent)
        return got if got is not None else encoded(agent)

    get = next(r for r in api.all_routes() if r.handler == "briefing")
    by_route = route_handler(service, get)

    async def get_briefing(request: web.Request) -> web.Response:
        if request.query:  # the route's parameter checks (it has none: a clear 400)
            return await by_route(request)
        return web.Response(body=body(request.match_info["agent"]), content_type="application/json")

    app = make_app(
        service, [r for r in api.all_routes() if r.handler in ROUTES and r is not get], tokens=auth.TokenStore(home)
    )
    app.router.add_get(get.path, get_briefing)
    runner, port = await serve_bounded(app, "127.0.0.1", 0)
    closed = asyncio.get_running_loop().create_future()

    def on_update() -> None:
        try:
            raw = updates.recv_bytes()
        except (EOFError, OSError):  # the projector is gone
            if not closed.done():
                closed.set_result(None)
            return
        try:
            got = _briefings.decode(raw)
        except Exception as exc:  # noqa: BLE001 - a message that does not decode is skipped, never fatal
            log.error(
                "a briefing update from the projector did not decode (%d bytes) and is skipped: %r", len(raw), exc
            )
            return
        cache.update((b.agent, b) for b in got)
        bodies.update((b.agent, encoded(b.agent)) for b in got)

    asyncio.get_running_loop().add_reader(updates.fileno(), on_update)
    ports.send(port)
    try:
        await closed
    finally:
        await runner.cleanup()


class BriefingServer:
    """The projector's handle on the briefing server process."""

    def __init__(self, on_served: Callable[[BriefingServed], None], home: Path) -> None:
        self.on_served = on_served
        self.home = Path(home)  # whose token store the server checks requests against
        self.port: int | None = None
        self._proc: Any = None
        self._updates: Connection | None = None
        self._served: Connection | None = None

    async def start(self, current: Iterable[BriefingGenerated], timeout_s: float = 60.0) -> int:
        """Start the process, send it ``current`` and return its port."""
        # A fresh interpreter (not fork: the projector has threads and DuckDB open; not multiprocessing's
        # spawn, which imports the parent's main module again), given its pipe ends by descriptor. In a
        # session of its own: Linux schedules each session as a group (autogroup), so the server, idle
        # between reads, is not charged for the projector's folding when a read wakes it.
        upd_r, upd_w = Pipe(duplex=False)
        srv_r, srv_w = Pipe(duplex=False)
        port_r, port_w = Pipe(duplex=False)
        child = (upd_r, srv_w, port_w)
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "somnus.projections.briefing_server",
                *(str(c.fileno()) for c in child),
                str(self.home.resolve()),
            ],
            pass_fds=[c.fileno() for c in child],
            cwd=str(Path(__file__).resolve().parent.parent),
            start_new_session=True,
        )
        for end in child:  # closed here so that EOF reaches each side when the other goes
            end.close()
        self._updates, self._served = upd_w, srv_r
        try:
            if not await asyncio.to_thread(port_r.poll, timeout_s):
                raise RuntimeError(f"the briefing server did not start within {timeout_s:.0f} s")
            self.port = int(port_r.recv())
        except BaseException as exc:
            code = self._proc.poll()
            self.stop()
            if isinstance(exc, EOFError):
                raise RuntimeError(
                    f"the briefing server exited at start (code {code}); its errors are in the projector's log"
                ) from None
            raise
        finally:
            port_r.close()
        self.publish(list(current))
        asyncio.get_running_loop().add_reader(srv_r.fileno(), self._on_served)
        return self.port

    def publish(self, briefings: list[BriefingGenerated]) -> None:
        """Send changed briefings to the server (from any one thread at a time)."""
        if self._updates is None or not briefings:
            return
        for i in range(0, len(briefings), CHUNK):
            try:
                self._updates.send_bytes(msgspec.json.encode(briefings[i : i + CHUNK]))
            except OSError as exc:  # the child died: the projector's own server still answers
                log.error("the briefing server is gone (%r); briefings are served by the projector only", exc)
                self._updates = None
                return

    def _on_served(self) -> None:
        assert self._served is not None
        try:
            raw = self._served.recv_bytes()
        except (EOFError, OSError):
            asyncio.get_running_loop().remove_reader(self._served.fileno())
            return
        try:
            served = _served.decode(raw)
        except Exception as exc:  # noqa: BLE001 - skipped and logged, never fatal to the projector
            log.error("a served briefing from the briefing server did not decode (%d bytes): %r", len(raw), exc)
            return
        self.on_served(served)

    def stop(self) -> None:
        if self._served is not None:
            try:
                asyncio.get_running_loop().remove_reader(self._served.fileno())
            except (RuntimeError, ValueError):
                pass
            self._served.close()
            self._served = None
        if self._updates is not None:
            self._updates.close()  # EOF: the child stops its server and exits
            self._updates = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=5)
            self._proc = None


if __name__ == "__main__":
    main()
