"""`somnus bench briefing`: briefing freshness and latency under a fleet's load, on an isolated pipeline."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path
from typing import Any

from somnus.bench.pipeline import isolated_pipeline


def _probe_session(agent: str, n: int, marker: str, at: Any) -> list[dict[str, Any]]:
    """A short failing session of ``agent`` whose failure lesson carries ``marker``."""
    from datetime import timedelta

    sid = f"{agent}-probe-{n}"
    base = {"schema_version": 1, "agent": agent, "session_id": sid}
    kinds = [
        ("session_start", {"task": f"probe {n}"}),
        ("tool_call", {"tool": "fetch", "call_id": "c0", "args": {"n": n}}),
        ("tool_result", {"call_id": "c0", "tool": "fetch", "ok": False, "error": f"Error: {marker}"}),
        ("session_end", {"outcome": "failure"}),
    ]
    return [
        {
            **base,
            "event_id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{sid}/{i}")),
            "ts": (at + timedelta(seconds=i)).isoformat(),
            "seq": i,
            "type": t,
            "payload": p,
        }
        for i, (t, p) in enumerate(kinds)
    ]


def _probe_runtime(boot: str, topic: str, t_start: Any, asks: Any, publish_times: Any) -> None:
    """Publishes the probe sessions asked for on ``asks`` (agent, n, marker) until None, and reports
    when each publish call began (the acknowledgement is part of the measured time)."""
    from somnus.client import Publisher

    with Publisher(boot, topic) as runtime:
        while (ask := asks.get()) is not None:
            agent, n, marker = ask
            t0 = time.monotonic()  # CLOCK_MONOTONIC: the same clock in every process
            runtime.send(_probe_session(agent, n, marker, t_start))
            publish_times.put((marker, t0))


def _fleet_load(boot: str, topic: str, rate: float, duration_s: float, stop: Any, ready: Any, sent: Any) -> None:
    """The sample fleet published at ``rate`` events/s in 0.1 s slices until ``stop`` (a process of its own;
    ``ready`` is set once the events are generated and the producer is connected)."""
    from somnus.client import Publisher
    from somnus.sample import generate

    events = generate(events=int(rate * duration_s * 1.5), seed=3)
    per = max(1, int(rate / 10))
    with Publisher(boot, topic) as runtime:
        ready.set()
        while not stop.is_set():
            t = time.monotonic()
            chunk = [e for _, e in zip(range(per), events)]
            if not chunk:
                return
            runtime.send(chunk)
            with sent.get_lock():
                sent.value += len(chunk)
            time.sleep(max(0.0, 0.1 - (time.monotonic() - t)))


def _floor_server(body: bytes, ports: Any) -> None:
    """The least an HTTP server in Python can do (the bench's floor): every request on a connection,
    answered with the same ``body`` by an asyncio protocol, no routing and no parsing beyond the end
    of the headers. In a session of its own, as the briefing server is (a process of its own)."""
    os.setsid()
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: {len(body)}\r\n\r\n"
    answer = head.encode() + body

    class Protocol(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport, self.buffer = transport, b""

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            while b"\r\n\r\n" in self.buffer:
                _, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
                self.transport.write(answer)

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(Protocol, "127.0.0.1", 0)
        ports.put(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(serve())


def run_briefing(
    agents: int = 10_000,
    rate: float = 1000.0,
    duration_s: float = 60.0,
    probes: int = 60,
    home: Path | None = None,
    log: Any = None,
    sleep_schedule: str = "off",
    read_rate: float = 0.0,
) -> dict[str, Any]:
    """Briefing reads under ingest: p99 of ``GET /agents/{agent}/briefing`` with ``agents`` briefings
    cached while the sample fleet is published at ``rate`` events/s, and the publish -> updated
    briefing latency of probe sessions published during that load.

    The load and the probes are published by processes of their own (as runtimes do). Reads rotate between one
    kept-alive connection (``read_*``, as an HTTP client's pool does) and a new connection each
    (``read_new_connection_*``), both to where ``somnus.reads`` sends them (the briefing server), and
    a kept-alive connection to a floor server (``floor_read_*``, ``_floor_server``: a briefing's bytes
    from the least a Python HTTP server can do, in a process of its own, under the same load in the same
    run: what this machine allows); back to back, or ``read_rate`` a second.

    Scheduled sleep is off by default: at 1,000 events/s the sample fleet's stream time passes a day
    in about 20 s, so the nightly sleep and the promotion after it (seconds each, inline in the
    projector's batches) would run every 20 s instead of once a day. ``sleep_schedule`` turns it on."""
    import http.client
    import multiprocessing
    import random
    import statistics
    import urllib.parse
    import urllib.request
    from datetime import datetime, timezone

    from somnus.client import publish
    from somnus.reads import read, status

    t_start = datetime(2025, 1, 6, 9, tzinfo=timezone.utc)
    with isolated_pipeline(home, label="brief", log=log, sleep_schedule=sleep_schedule) as (s, boot):
        db = s.db
        fill = [e for i in range(agents) for e in _probe_session(f"agent-{i:05d}", 0, f"fill {i}", t_start)]
        publish(fill, boot, s.traces_topic)
        deadline = time.monotonic() + 1800
        while not status(s, boot)["idle"]:
            if time.monotonic() > deadline:
                raise TimeoutError("the cache did not fill in 30 minutes")
            time.sleep(1)
        cached = read(db, "sql", sql="SELECT count(*) FROM briefings WHERE markdown <> ''")["rows"][0][0]
        from somnus.reads import _endpoint, auth_headers

        port = urllib.parse.urlsplit(_endpoint(db, "briefing")).port  # where somnus.reads sends briefing reads
        auth = auth_headers(db)  # the operator's bearer token, as somnus.reads sends it
        # The ingest load comes from another process, as it does from runtimes: in this one it would
        # hold the reader's GIL and time the bench client, not the server.
        ctx = multiprocessing.get_context("spawn")
        stop, ready, sent = ctx.Event(), ctx.Event(), ctx.Value("q", 0)
        loader = ctx.Process(
            target=_fleet_load, args=(boot, s.traces_topic, rate, duration_s, stop, ready, sent), daemon=True
        )
        loader.start()
        if not ready.wait(300):
            raise TimeoutError("the load process did not start in 5 minutes")
        # The probes' runtime too (one producer, as a runtime keeps one): its client's background thread
        # would otherwise take the reader's GIL now and then.
        asks, publish_times = ctx.SimpleQueue(), ctx.SimpleQueue()
        prober = ctx.Process(
            target=_probe_runtime, args=(boot, s.traces_topic, t_start, asks, publish_times), daemon=True
        )
        prober.start()
        rng = random.Random(1)
        kept = http.client.HTTPConnection("127.0.0.1", port, timeout=10)  # keep-alive, as HTTP clients pool them

        def get(conn: http.client.HTTPConnection, path: str) -> bytes:
            conn.request("GET", path, headers=auth)
            with conn.getresponse() as resp:
                return resp.read()

        sample_body = get(kept, "/agents/agent-00000/briefing")
        floor_ports = ctx.SimpleQueue()
        floor_proc = ctx.Process(target=_floor_server, args=(sample_body, floor_ports), daemon=True)
        floor_proc.start()
        floor = http.client.HTTPConnection("127.0.0.1", floor_ports.get(), timeout=10)
        lat: list[float] = []  # on the kept connection
        lat_new: list[float] = []  # on a connection of its own each (urllib)
        lat_floor: list[float] = []  # on a kept connection to the floor server
        probe_at = time.monotonic() + 2.0
        n_probe = 0
        pending: dict[str, str] = {}  # marker -> agent, until seen in its briefing
        published: dict[str, float] = {}  # marker -> when its publish call began (CLOCK_MONOTONIC)
        seen_at: dict[str, float] = {}
        t_end = time.monotonic() + duration_s
        next_read = time.monotonic()
        while time.monotonic() < t_end or (pending and time.monotonic() < t_end + 30):
            if read_rate > 0:
                next_read += 1.0 / read_rate
                time.sleep(max(0.0, next_read - time.monotonic()))
            agent = f"agent-{rng.randrange(agents):05d}"
            t = time.perf_counter()
            if len(lat_floor) < len(lat):
                get(floor, f"/agents/{agent}/briefing")
                lat_floor.append((time.perf_counter() - t) * 1000)
            elif len(lat) <= len(lat_new):
                get(kept, f"/agents/{agent}/briefing")
                lat.append((time.perf_counter() - t) * 1000)
            else:
                with urllib.request.urlopen(
                    urllib.request.Request(f"http://127.0.0.1:{port}/agents/{agent}/briefing", headers=auth), timeout=10
                ) as resp:
                    resp.read()
                lat_new.append((time.perf_counter() - t) * 1000)
            now = time.monotonic()
            if n_probe < probes and now >= probe_at and time.monotonic() < t_end:
                agent_p = f"agent-{rng.randrange(agents):05d}"
                marker = f"probe marker {uuid.uuid4().hex[:10]}"
                asks.put((agent_p, n_probe + 1, marker))
                pending[marker] = agent_p
                n_probe += 1
                probe_at = now + duration_s / probes
            for marker, agent_p in list(pending.items()):
                with urllib.request.urlopen(
                    urllib.request.Request(f"http://127.0.0.1:{port}/agents/{agent_p}/briefing", headers=auth),
                    timeout=10,
                ) as r:
                    if marker.encode() in r.read():
                        seen_at[marker] = time.monotonic()
                        del pending[marker]
        stop.set()
        asks.put(None)
        loader.join(timeout=30)
        deadline = time.monotonic() + 120
        while len(published) < n_probe:  # the publish time of every probe (its process ends after the last)
            if publish_times.empty():
                if not prober.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"the probe publisher stopped after {len(published)} of {n_probe} probes")
                time.sleep(0.05)
                continue
            marker, t0 = publish_times.get()
            published[marker] = t0
        prober.join(timeout=30)
        kept.close()
        floor.close()
        floor_proc.kill()
        fresh = [seen_at[m] - published[m] for m in seen_at]
        q = statistics.quantiles(lat, n=100, method="inclusive")
        qn = statistics.quantiles(lat_new, n=100, method="inclusive")
        qf = statistics.quantiles(lat_floor, n=100, method="inclusive")
        fq = statistics.quantiles(fresh, n=100, method="inclusive") if len(fresh) >= 2 else [float("nan")] * 99
        return {
            "agents_cached": cached,
            "sleep_schedule": sleep_schedule,
            "read_rate": read_rate or "back to back",
            "ingest_events_per_s": round(sent.value / duration_s, 1),
            "reads": len(lat),
            "read_p50_ms": round(q[49], 3),
            "read_p99_ms": round(q[98], 3),
            "reads_new_connection": len(lat_new),
            "read_new_connection_p50_ms": round(qn[49], 3),
            "read_new_connection_p99_ms": round(qn[98], 3),
            "floor_reads": len(lat_floor),
            "floor_read_p50_ms": round(qf[49], 3),
            "floor_read_p99_ms": round(qf[98], 3),
            "read_p99_over_floor": round(q[98] / qf[98], 2),
            "probes": n_probe,
            "probes_seen": len(fresh),
            "update_p50_s": round(fq[49], 3),
            "update_p99_s": round(fq[98], 3),
            "update_max_s": round(max(fresh, default=float("nan")), 3),
        }
