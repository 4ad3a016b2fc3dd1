"""The HTTP servers' connections are bounded (``projections/http.py``, ``serve``): a slow or silent
client cannot hold connections for long, nor more than ``MAX_CONNECTIONS`` of them."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from aiohttp import web

from somnus.projections import http
from somnus.projections.briefing_server import BriefingServer


def hello() -> web.Application:
    app = web.Application()

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.add_routes([web.get("/", ok)])
    return app


def connect(port: int, send: bytes = b"") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    if send:
        s.sendall(send)
    return s


def closed(s: socket.socket) -> bool:
    """Whether the server closed ``s`` (it sends nothing to a client that sent no complete request)."""
    s.setblocking(False)
    try:
        return s.recv(100) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


async def get(port: int) -> bytes:
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    got = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return got


def served(run: Callable[[int], Awaitable[Any]], **bounds: Any) -> Any:
    async def main() -> Any:
        runner, port = await http.serve(hello(), "127.0.0.1", 0, **bounds)
        try:
            return await run(port)
        finally:
            await runner.cleanup()

    return anyio.run(main)


def test_a_silent_or_slow_connection_is_closed_after_the_idle_timeout() -> None:
    async def run(port: int) -> tuple[bool, bool, bool, bytes]:
        silent, slow = connect(port), connect(port, b"GET / HTTP/1.1\r\nHost: x\r\n")
        await asyncio.sleep(0.3)
        early = closed(silent)
        for _ in range(12):  # a header line every 0.25 s does not keep it open
            await asyncio.sleep(0.25)
            try:
                slow.send(b"X-a: b\r\n")
            except OSError:
                break
        return early, closed(silent), closed(slow), await get(port)

    early, silent, slow, answer = served(run, idle_timeout_s=1.0)
    assert not early and silent and slow
    assert answer.startswith(b"HTTP/1.1 200")


def test_at_the_cap_a_new_connection_closes_the_oldest_and_is_served() -> None:
    async def run(port: int) -> tuple[list[bool], bytes]:
        held = [connect(port) for _ in range(8)]
        await asyncio.sleep(0.3)
        answer = await get(port)
        await asyncio.sleep(0.3)
        return [closed(s) for s in held], answer

    gone, answer = served(run, max_connections=4)
    assert answer.startswith(b"HTTP/1.1 200")
    assert gone == [True] * 5 + [False] * 3  # 4 at most: the 5 oldest closed, the newest 3 and the request kept


def test_the_briefing_server_closes_a_silent_connection(tmp_path: Any) -> None:
    """Fails on the old servers: a bare ``AppRunner`` kept a connection that never sends for 3,630 s,
    so one local process could hold as many as the server's file limit. The projector and the OTLP
    receiver start through the same ``serve``."""

    async def main() -> bool:
        server = BriefingServer(lambda r: None, tmp_path)
        port = await server.start([])
        try:
            s = connect(port)
            deadline = time.monotonic() + http.IDLE_TIMEOUT_S + 5
            while time.monotonic() < deadline:
                await asyncio.sleep(0.5)
                if closed(s):
                    return True
            return False
        finally:
            server.stop()

    assert anyio.run(main)
