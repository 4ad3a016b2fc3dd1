"""``somnus otlp``: an OTLP/HTTP receiver, ``POST /v1/traces`` (protobuf and JSON), that turns GenAI
spans into trace events on the traces topic (``python -m somnus.otlp.receiver``; ``somnus up`` runs it
under the supervisor).

What it answers, per the OTLP/HTTP specification:

- 200 with an ``ExportTraceServiceResponse`` (protobuf or JSON, as the request), with
  ``partial_success`` naming the spans it rejected (invalid ids, a span of a trace already mapped,
  a span naming another agent than the token's, a name too long or too many links to map);
- 400 with a ``google.rpc.Status`` for a body that cannot be decoded (malformed protobuf or JSON,
  nested too deep, larger than ``max_body`` compressed or decompressed, bad gzip): not retryable;
- 401 / 403 for a missing or invalid bearer token (the tokens of the HTTP API, ``somnus token``);
- 415 for a ``Content-Type`` other than ``application/x-protobuf`` / ``application/json``, or a
  ``Content-Encoding`` other than ``gzip`` / ``identity``;
- 503 with ``Retry-After`` when the broker did not acknowledge the events of a complete trace in
  time: the spans are held in the journal (``somnus.otlp.buffer``) and the exporter's retry finds
  them there, so a retry loses nothing and duplicates nothing.

A span is acknowledged once it is in the fsynced journal; a trace is published when its root span
has arrived, or ``trace_timeout_s`` after its last span when no root comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from somnus.otlp.buffer import TraceBuffer
from somnus.otlp.mapping import agent_name, oversized, trace_events
from somnus.otlp.spans import Decoded, ShapeError, Span, from_json, from_proto
from somnus.projections.auth import Principal, Refused, TokenStore, _principal
from somnus.projections.http import serve as serve_bounded
from somnus.schemas.codec import MAX_DEPTH, check_json

log = logging.getLogger("somnus.otlp")

PROTOBUF, JSON = "application/x-protobuf", "application/json"
MAX_BODY = 8 << 20  # bytes of a request body, compressed and decompressed (SOMNUS_OTLP_MAX_BODY)
PUBLISH_TIMEOUT_S = 10.0
RETRY_AFTER_S = 2
TRACE_TIMEOUT_S = 300.0  # a trace whose root never arrives is published this long after its last span
# Spans held at once, waiting for their roots: beyond, a request is a 503 (retryable) until traces complete
# or time out. Without a bound, rootless spans (16,384 a request) filled memory and the journal for 300 s.
MAX_HELD_SPANS = 250_000
_GRPC = {400: 3, 401: 16, 403: 7, 413: 8, 415: 3, 503: 14}  # google.rpc.Code of each HTTP status


class Unavailable(Exception):
    """The broker did not acknowledge in time: a 503 with Retry-After."""


# ---- responses ---------------------------------------------------------------------------------


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def rpc_status(code: int, message: str) -> bytes:
    """A ``google.rpc.Status`` message (code = 1, message = 2), encoded by hand: the OTLP error body.

    >>> rpc_status(3, "bad")
    b'\\x08\\x03\\x12\\x03bad'
    """
    text = message.encode()
    return b"\x08" + varint(code) + b"\x12" + varint(len(text)) + text


def error_response(status: int, message: str, proto: bool, retry_after: int | None = None) -> web.Response:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="somnus"'
    code = _GRPC.get(status, 2)
    if proto:
        return web.Response(status=status, body=rpc_status(code, message), content_type=PROTOBUF, headers=headers)
    return web.Response(
        status=status, body=orjson.dumps({"code": code, "message": message}), content_type=JSON, headers=headers
    )


def success_response(rejected: list[str], proto: bool) -> web.Response:
    message = "; ".join(rejected[:5]) + (f"; and {len(rejected) - 5} more" if len(rejected) > 5 else "")
    if proto:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTracePartialSuccess,
            ExportTraceServiceResponse,
        )

        resp = ExportTraceServiceResponse()
        if rejected:
            resp.partial_success.CopyFrom(
                ExportTracePartialSuccess(rejected_spans=len(rejected), error_message=message)
            )
        return web.Response(body=resp.SerializeToString(), content_type=PROTOBUF)
    body = {"partialSuccess": {"rejectedSpans": len(rejected), "errorMessage": message}} if rejected else {}
    return web.Response(body=orjson.dumps(body), content_type=JSON)


# ---- bodies --------------------------------------------------------------------------------------


def decompress(raw: bytes, encoding: str, limit: int) -> bytes:
    """The body as sent, ungzipped within ``limit`` bytes (``Refused`` 400 / 415 otherwise). Every gzip
    member is read, as ``gzip.decompress`` does (a body of two members lost the second's spans without
    a word); bytes after the last member other than NUL padding are not gzip (400)."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding != "gzip":
        raise Refused(415, f"Content-Encoding {encoding!r} is not supported (gzip or none)")
    out, rest = bytearray(), raw
    while True:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out += d.decompress(rest, limit + 1 - len(out))
        except zlib.error as exc:
            raise Refused(400, f"the body is not valid gzip: {exc}") from None
        if len(out) > limit:
            raise Refused(400, f"the body is larger than {limit} bytes once decompressed")
        if not d.eof:
            raise Refused(400, "the gzip body is truncated")
        rest = d.unused_data
        if not rest.strip(b"\0"):
            return bytes(out)


def decode_body(raw: bytes, content_type: str) -> Decoded:
    """The spans of a request body (``Refused`` 400 naming what is wrong; never another exception)."""
    try:
        if content_type == PROTOBUF:
            return from_proto(raw)
        why = check_json(raw, None, MAX_DEPTH, None)
        if why is not None:
            raise Refused(400, f"the JSON body is refused: {why}")
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise Refused(400, f"the body is not JSON: {exc}") from None
        return from_json(doc)
    except ShapeError as exc:
        raise Refused(400, str(exc)) from None
    except Refused:
        raise
    except Exception as exc:  # noqa: BLE001 - the boundary: whatever a decoder raises is a 400, not a 500
        raise Refused(400, f"the body could not be decoded ({type(exc).__name__}: {exc})") from None


def foreign_agent(span: Span, principal: Principal) -> str | None:
    """Why an agent token may not send this span (the mapping would give it another agent), or None.

    The agent is found as the mapping finds it (``agent_name``: ``gen_ai.agent.name``, ``agent.name``,
    OpenLLMetry's entity name, a span name ``invoke_agent X``), the token's agent standing in for none."""
    if principal.operator:
        return None
    named = agent_name(span, principal.agent)
    if named != principal.agent:
        return f"span {span.span_id}: agent {named[:64]!r} is not this token's agent {principal.agent!r}"
    return None


def foreign_trace(span: Span, principal: Principal, buffer: TraceBuffer) -> str | None:
    """Why an agent token may not add this span to its trace: spans sent with another token are held
    for it (a span whose parent is another agent's span would join that agent's session), or None."""
    if principal.operator:
        return None
    owners = buffer.owners(span.trace_id)
    if owners and owners != {principal.agent}:
        return f"span {span.span_id}: trace {span.trace_id} holds spans sent with another token"
    return None


# ---- the receiver ----------------------------------------------------------------------------------

Publish = Callable[[list[dict[str, Any]]], Awaitable[None]]


@dataclass
class Receiver:
    """The handler's state: the journal, how events are published, the token store."""

    buffer: TraceBuffer
    publish: Publish
    tokens: TokenStore
    max_body: int = MAX_BODY
    trace_timeout_s: float = TRACE_TIMEOUT_S
    publish_timeout_s: float = PUBLISH_TIMEOUT_S
    max_held: int = MAX_HELD_SPANS

    def __post_init__(self) -> None:
        self.lock = asyncio.Lock()

    async def handle(self, request: web.Request) -> web.Response:
        proto = request.content_type != JSON
        try:
            principal = _principal(request, self.tokens, datetime.now(timezone.utc))
            if principal.user is not None:  # its spans could write memories of no user, which every user reads
                raise Refused(
                    403,
                    f"a token bound to a user ({principal.describe()}) reads that user's memories; "
                    "it may not send spans (use the agent's token)",
                )
            if request.content_type not in (PROTOBUF, JSON):
                raise Refused(415, f"Content-Type {request.content_type!r} is not supported ({PROTOBUF} or {JSON})")
            if request.content_length is not None and request.content_length > self.max_body:
                raise Refused(400, f"the body is {request.content_length} bytes; at most {self.max_body} are accepted")
            try:
                raw = await request.read()
            except web.HTTPRequestEntityTooLarge:
                raise Refused(400, f"the body is larger than {self.max_body} bytes") from None
            raw = decompress(raw, request.headers.get("Content-Encoding", ""), self.max_body)
            decoded = decode_body(raw, request.content_type)
        except Refused as exc:
            return error_response(exc.status, exc.message, proto)
        return await self.accept(decoded, principal, proto)

    async def accept(self, decoded: Decoded, principal: Principal, proto: bool) -> web.Response:
        rejected = list(decoded.rejected)
        spans = []
        async with self.lock:
            for span in decoded.spans:
                why = oversized(span) or foreign_agent(span, principal) or foreign_trace(span, principal, self.buffer)
                (rejected.append(why) if why else spans.append(span))
            if self.buffer.held_spans() + len(spans) > self.max_held:
                return error_response(
                    503,
                    f"{self.buffer.held_spans()} spans are held waiting for their root spans "
                    f"(at most {self.max_held}); send them again later",
                    proto,
                    RETRY_AFTER_S,
                )
            try:
                _, _, late = self.buffer.add(spans, time.time_ns(), None if principal.operator else principal.agent)
            except OSError as exc:  # the journal's disk: nothing was acknowledged, the exporter tries again
                return error_response(
                    503, f"the spans could not be written to the journal: {exc}", proto, RETRY_AFTER_S
                )
            rejected += late
            try:
                await self.flush(self.buffer.complete())
            except Unavailable as exc:
                return error_response(503, f"{exc}; the spans are held, send them again", proto, RETRY_AFTER_S)
        return success_response(rejected, proto)

    def events_of(self, trace_ids: list[str]) -> list[dict[str, Any]]:
        """The events of these traces; a trace the mapping fails on, or whose events cannot be encoded,
        is logged and left out (marked done with the others: held, it would fail again on every request
        and hold every other trace in 503)."""
        out: list[dict[str, Any]] = []
        for t in trace_ids:
            try:
                events = trace_events(self.buffer.spans(t), self.buffer.owner(t))
                for e in events:
                    orjson.dumps(e)  # what the publisher will do: a failure here is this trace's alone
                out += events
            except Exception:  # noqa: BLE001 - one trace's defect must not stop the others (nor be a 500)
                log.exception("trace %s could not be mapped; its %d spans are left out", t, len(self.buffer.spans(t)))
        return out

    async def flush(self, trace_ids: list[str]) -> int:
        """Publish these held traces' events and mark them done; how many events (``Unavailable``)."""
        if not trace_ids:
            return 0
        events = self.events_of(trace_ids)
        try:
            await asyncio.wait_for(self.publish(events), self.publish_timeout_s)
        except Exception as exc:  # noqa: BLE001 - a timeout or a Kafka error: retryable, nothing is lost
            raise Unavailable(
                f"the broker did not acknowledge {len(events)} events ({type(exc).__name__}: {exc})"
            ) from None
        self.buffer.mark_done(trace_ids)
        log.info("published %d events of %d traces", len(events), len(trace_ids))
        return len(events)

    async def tick(self) -> None:
        """What the periodic task does: publish complete traces left over (the broker was down, or a
        restart), and the traces whose root never came."""
        async with self.lock:
            with contextlib.suppress(Unavailable):
                await self.flush(self.buffer.complete())
                await self.flush(self.buffer.stale(time.time_ns(), self.trace_timeout_s))

    def app(self) -> web.Application:
        # auto_decompress off: the body is ungzipped here, within max_body (aiohttp's own has no bound)
        app = web.Application(client_max_size=self.max_body + 1, handler_args={"auto_decompress": False})
        app.router.add_post("/v1/traces", self.handle)
        return app


class KafkaPublisher:
    """Events to the traces topic with one idempotent producer, started on first use (a broker that is
    down at start is a 503, not a crash)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.producer: Any = None

    async def __call__(self, events: list[dict[str, Any]]) -> None:
        from somnus.client import _send_bundles, make_producer, to_bytes

        if self.producer is None:
            producer = make_producer(self.bootstrap, request_timeout_ms=int(PUBLISH_TIMEOUT_S * 1000))
            await producer.start()
            self.producer = producer
        await _send_bundles(self.producer, self.topic, [to_bytes(e) for e in events], 64)

    async def close(self) -> None:
        if self.producer is not None:
            await self.producer.stop()


def journal_path(home: Path) -> Path:
    return Path(home) / "otlp" / "spans.journal"


async def serve(
    home: Path,
    bootstrap: str,
    topic: str,
    host: str,
    port: int,
    max_body: int = MAX_BODY,
    trace_timeout_s: float = TRACE_TIMEOUT_S,
    tick_s: float = 2.0,
    started: Callable[[int], None] | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT."""
    publisher = KafkaPublisher(bootstrap, topic)
    receiver = Receiver(TraceBuffer(journal_path(home)), publisher, TokenStore(home), max_body, trace_timeout_s)
    runner, bound = await serve_bounded(receiver.app(), host, port)  # idle and slow connections bounded
    log.info("OTLP/HTTP receiver on http://%s:%d/v1/traces (%d spans held)", host, bound, receiver.buffer.held_spans())
    if started is not None:
        started(bound)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        while not stop.is_set():
            await receiver.tick()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), tick_s)
    finally:
        await runner.cleanup()
        await publisher.close()
        receiver.buffer.close()


def main(argv: list[str] | None = None) -> None:
    """``python -m somnus.otlp.receiver [--host H] [--port P]`` (settings from the environment)."""
    from somnus import procs

    run(*procs.server_process("somnus-otlp", argv))


def run(settings: Any, host: str | None = None, port: int | None = None, bootstrap: str | None = None) -> None:
    from somnus import broker as broker_mod
    from somnus.projections.auth import ensure_operator_token

    ensure_operator_token(settings.home)
    boot = bootstrap or broker_mod.bootstrap_for(settings, start_if_missing=False)
    asyncio.run(
        serve(
            settings.home,
            boot,
            settings.traces_topic,
            host or settings.otlp_host,
            settings.otlp_port if port is None else port,
            settings.otlp_max_body,
            settings.otlp_trace_timeout_s,
        )
    )


if __name__ == "__main__":
    main()
