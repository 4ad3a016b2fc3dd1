"""``somnus up``'s supervisor and a start before the broker, with the real broker and processes:
a worker or projector that is SIGKILLed is started again and the pipeline carries on; a worker and
a projector started while no broker answers wait for it instead of exiting."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from somnus import procs
from somnus.client import publish
from somnus.config import Settings
from somnus.reads import sql, wait_idle
from somnus.sample import generate
from somnus.streams.topics import ensure_topics
from tests.pipeline import Pipeline, wait_until

pytestmark = pytest.mark.integration


def _cli(settings: Settings, *args: str, timeout_s: float = 180) -> subprocess.CompletedProcess:
    env = procs.child_env(settings, settings.bootstrap)  # type: ignore[arg-type]
    return subprocess.run(
        [sys.executable, "-m", "somnus.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )


def _episodes(settings: Settings) -> int:
    return sql(Path(settings.db_path), "SELECT count(*) FROM episodes")["rows"][0][0]  # type: ignore[arg-type]


def _sessions(events: list[dict]) -> int:
    return len({e["session_id"] for e in events if e["type"] == "session_end"})


def test_up_restarts_a_killed_worker_and_projector_and_down_stops_everything(pipeline_settings: Settings) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        otlp_port = probe.getsockname()[1]
    s = dataclasses.replace(pipeline_settings, otlp_port=otlp_port)  # the OTLP receiver too
    try:
        done = _cli(s, "up", "--detach")
        assert done.returncode == 0, done.stdout + done.stderr
        sup = procs.running(s, "supervisor")
        assert sup is not None
        first = list(generate(sessions=40, seed=21))
        publish(first, s.bootstrap, s.traces_topic)  # type: ignore[arg-type]
        for role in ("worker", "projector"):
            pid = procs.running(s, role)
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            wait_until(
                lambda: procs.running(s, role) not in (None, pid),
                timeout_s=30,
                what=f"{role} started again after SIGKILL",
            )
        second = [{**e, "session_id": f"after-{e['session_id']}"} for e in generate(sessions=40, seed=22)]
        publish(second, s.bootstrap, s.traces_topic)  # type: ignore[arg-type]
        wait_idle(s, s.bootstrap, timeout_s=240)  # type: ignore[arg-type]
        assert _episodes(s) == _sessions(first) + _sessions(second)
        log = (s.run_dir / "supervisor.log").read_text()
        assert "worker exited (signal 9)" in log and "projector exited (signal 9)" in log
        assert procs.running(s, "supervisor") == sup
        shown = _cli(s, "status", "--json")
        assert shown.returncode == 0, shown.stderr
        ps = json.loads(shown.stdout)["processes"]
        assert ps["supervisor"] == sup
        for role in ("worker", "projector"):
            assert ps[role] == procs.running(s, role) == ps["supervised"][role]["pid"]
            assert ps["supervised"][role]["restarts"] == 1 and ps["supervised"][role]["last_exit"] == "signal 9"
        assert ps["otlp"] == procs.running(s, "otlp") == ps["supervised"]["otlp"]["pid"] is not None
        wait_until(
            lambda: f"receiver on http://127.0.0.1:{otlp_port}" in (s.run_dir / "otlp.log").read_text(),
            60,
            what="the OTLP receiver listening",
        )
    finally:
        down = _cli(s, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "supervisor: stopped" in down.stdout
    for role in ("supervisor", "worker", "projector", "otlp"):
        assert procs.running(s, role) is None, role


class Forwarder:
    """A TCP port that refuses connections until ``open()``, then forwards each to ``target``: a
    bootstrap address whose broker is not there yet (the broker's own address is in its metadata,
    so clients connect to it directly after bootstrapping)."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server: asyncio.base_events.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def open(self) -> None:
        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await reader.read(1 << 16):
                    writer.write(data)
                    await writer.drain()
            writer.close()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

        async def serve() -> None:
            self.server = await asyncio.start_server(handle, "127.0.0.1", self.port, reuse_address=True)

        asyncio.run_coroutine_threadsafe(serve(), self.loop).result(10)

    def close(self) -> None:
        if self.server is not None:
            self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture()
def forwarder(kafka_bootstrap: str) -> Iterator[Forwarder]:
    f = Forwarder(kafka_bootstrap)
    yield f
    f.close()


def test_a_worker_and_projector_started_before_the_broker_wait_for_it(
    pipeline_settings: Settings, forwarder: Forwarder
) -> None:
    real = pipeline_settings
    ensure_topics(real, real.bootstrap)  # type: ignore[arg-type]
    early = dataclasses.replace(real, bootstrap=forwarder.address)
    pipe = Pipeline(real)
    pipe.s, pipe.boot = early, early.bootstrap  # the processes know only the address with no broker yet
    pipe.start_all()
    try:
        wait_until(
            lambda: "no broker answers" in pipe.log("worker") and "no broker answers" in pipe.log("projector"),
            timeout_s=60,
            what="both waiting for the broker",
        )
        assert all(p.poll() is None for p in pipe.procs.values()), {n: pipe.log(n)[-2000:] for n in pipe.procs}
        forwarder.open()
        events = list(generate(sessions=30, seed=23))
        publish(events, real.bootstrap, real.traces_topic)  # type: ignore[arg-type]
        wait_idle(real, real.bootstrap, timeout_s=240)  # type: ignore[arg-type]
        assert _episodes(real) == _sessions(events)
        assert "answers" in pipe.log("worker").split("no broker answers", 1)[1]
    finally:
        pipe.stop_all()


def test_up_with_its_own_broker_starts_the_broker_again_when_it_dies(tmp_path: Path) -> None:
    from somnus import broker

    s = dataclasses.replace(
        Settings.resolve(env={}, home=tmp_path / "home"),
        db_path=tmp_path / "own.duckdb",
        partitions=2,
        session_timeout_s=6.0,
    )
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP"}
    env.update(s.as_env())  # no KAFKA_BOOTSTRAP: `somnus up` starts the project's own broker

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "somnus.cli", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            stdin=subprocess.DEVNULL,
        )

    try:
        done = cli("up", "--detach")
        assert done.returncode == 0, done.stdout + done.stderr
        info = broker.status(s)
        assert info is not None
        s = dataclasses.replace(s, bootstrap=info.bootstrap)  # for the test's own publishing and reads
        first = list(generate(sessions=30, seed=24))
        publish(first, info.bootstrap, s.traces_topic)
        wait_idle(s, info.bootstrap, timeout_s=240)
        os.kill(info.pid, signal.SIGKILL)
        wait_until(
            lambda: broker.status(s) is not None and broker.status(s).pid != info.pid,
            timeout_s=120,
            what="the broker started again by the supervisor",
        )
        assert broker.status(s).bootstrap == info.bootstrap  # same port, same log dir
        broker.wait_ready(info.bootstrap, 120)  # its pid file is written before it answers
        second = [{**e, "session_id": f"after-{e['session_id']}"} for e in generate(sessions=30, seed=25)]
        publish(second, info.bootstrap, s.traces_topic)
        wait_idle(s, info.bootstrap, timeout_s=240)
        assert _episodes(s) == _sessions(first) + _sessions(second)
        ps = json.loads(cli("status", "--json").stdout)["processes"]
        assert ps["supervised"]["broker"]["restarts"] == 1 and ps["broker"] == broker.status(s).pid
        assert ps["supervised"]["broker"]["last_exit"] in ("signal 9", "exit code unknown")
    finally:
        down = cli("down")
        broker.stop(s)
    assert down.returncode == 0, down.stdout + down.stderr


def test_down_stops_a_foreground_up_and_nothing_is_started_again(pipeline_settings: Settings) -> None:
    s = pipeline_settings
    fg = subprocess.Popen(
        [sys.executable, "-m", "somnus.cli", "up"],
        env=procs.child_env(s, s.bootstrap),  # type: ignore[arg-type]
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_until(
            lambda: all(procs.running(s, r) for r in ("supervisor", "worker", "projector")),
            timeout_s=90,
            what="somnus up running both",
        )
        assert procs.running(s, "supervisor") == fg.pid
        down = _cli(s, "down")
        assert down.returncode == 0, down.stdout + down.stderr
        assert fg.wait(timeout=60) == 0
        for role in ("supervisor", "worker", "projector"):
            assert procs.running(s, role) is None, role
    finally:
        if fg.poll() is None:  # the test failed before down: SIGTERM lets it stop its processes
            fg.terminate()
            try:
                fg.wait(timeout=90)
            except subprocess.TimeoutExpired:
                fg.kill()
                fg.wait()
            _cli(s, "down")  # whatever is left
