"""A single-node Apache Kafka 3.9 broker in KRaft mode, run from Maven Central jars.

The jars are resolved once by Maven (``somnus/data/kafka/pom.xml``) into the cache folder
(``SOMNUS_CACHE``, default ``~/.cache/somnus``), so later starts are offline. The broker's
state (config, log dirs, pid, ports) lives in ``<SOMNUS_HOME>/broker``.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from somnus import procs
from somnus.config import Settings
from somnus.procs import pid_alive

KAFKA_VERSION = "3.9.1"
POM = Path(__file__).parent / "data" / "kafka" / "pom.xml"

LOG4J = """\
log4j.rootLogger=WARN, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.server.KafkaServer=INFO
log4j.logger.kafka.server.BrokerServer=INFO
"""


class BrokerError(RuntimeError):
    """The local broker could not be fetched, formatted, started or reached."""


@dataclass(frozen=True)
class BrokerInfo:
    pid: int
    bootstrap: str
    controller_port: int
    home: str

    @property
    def alive(self) -> bool:
        return pid_alive(self.pid)


def libs_dir(settings: Settings) -> Path:
    return settings.cache / f"kafka-{KAFKA_VERSION}" / "libs"


def fetch(settings: Settings, quiet: bool = True) -> Path:
    """Resolve the broker's jars with Maven into the cache; a no-op once done."""
    libs = libs_dir(settings)
    done = libs / ".complete"
    if done.exists():
        return libs
    if shutil.which("mvn") is None:
        raise BrokerError("Maven (mvn) is not on PATH: it is needed once to fetch the Kafka jars")
    libs.mkdir(parents=True, exist_ok=True)
    cmd = [
        "mvn",
        "-B",
        "-f",
        str(POM),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={libs}",
        f"-Dkafka.version={KAFKA_VERSION}",
    ]
    if quiet:
        cmd.insert(1, "-q")
    proc = subprocess.run(cmd, capture_output=quiet, text=True)
    if proc.returncode != 0:
        raise BrokerError(f"mvn failed ({proc.returncode}): {(proc.stdout or '')[-2000:]}{(proc.stderr or '')[-2000:]}")
    if not any(libs.glob(f"kafka_2.13-{KAFKA_VERSION}.jar")):
        raise BrokerError(f"mvn ran but {libs} has no kafka_2.13-{KAFKA_VERSION}.jar")
    done.write_text(KAFKA_VERSION)
    return libs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _state_dir(settings: Settings) -> Path:
    return settings.home / "broker"


def status(settings: Settings) -> BrokerInfo | None:
    """The running local broker of this home, or None."""
    info_file = _state_dir(settings) / "broker.json"
    if not info_file.exists():
        return None
    info = BrokerInfo(**json.loads(info_file.read_text()))
    return info if info.alive else None


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise BrokerError("java is not on PATH (Java 17 runs the Kafka broker)")
    return java


def new_cluster_id() -> str:
    """A KRaft cluster id: a random UUID, base64url without padding (it may start with '-')."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def format_log_dir(java: str, cp: str, state: Path, props: Path, cluster_id: str) -> None:
    """Format the broker's log dir. The id is passed as ``--cluster-id=ID``: about one id in 32
    starts with '-', which the tool's parser would take for an option after a bare ``-t``."""
    fmt = subprocess.run(
        [
            java,
            "-Xmx256m",
            f"-Dlog4j.configuration=file:{state / 'log4j.properties'}",
            "-cp",
            cp,
            "kafka.tools.StorageTool",
            "format",
            f"--cluster-id={cluster_id}",
            "-c",
            str(props),
        ],
        capture_output=True,
        text=True,
    )
    if fmt.returncode != 0:
        raise BrokerError(f"formatting the log dir failed: {fmt.stdout}{fmt.stderr}")


def start(settings: Settings, timeout_s: float = 90.0, heap: str = "768m") -> BrokerInfo:
    """Start (or find already running) the local KRaft broker and wait until it answers."""
    running = status(settings)
    if running is not None:
        return running
    libs = fetch(settings)
    state = _state_dir(settings)
    data = state / "data"
    procs.private_dir(state)  # the broker's log dir holds every trace: 0700, as SOMNUS_HOME
    ports_file = state / "ports.json"
    # Keep the ports of a formatted log dir: the controller quorum is stored with them, and clients
    # know the broker by its port. A port still held after a crash is waited for; one another process
    # holds is an error. (The log dir used to be deleted then: a restart within a minute of a crash,
    # its ports in TIME_WAIT, lost every topic.)
    if ports_file.exists() and data.exists():
        ports = json.loads(ports_file.read_text())
        _wait_ports_free(ports, timeout_s)
    else:
        ports = {"broker": _free_port(), "controller": _free_port()}
    ports_file.write_text(json.dumps(ports))
    props = state / "server.properties"
    props.write_text(_server_properties(ports["broker"], ports["controller"], data))
    (state / "log4j.properties").write_text(LOG4J)
    java = _java()
    cp = f"{libs}/*"
    if not (data / "meta.properties").exists():
        procs.private_dir(data)
        format_log_dir(java, cp, state, props, new_cluster_id())
    log = procs.open_private(state / "broker.log")
    proc = subprocess.Popen(
        [
            java,
            f"-Xms{heap}",
            f"-Xmx{heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            f"-Dlog4j.configuration=file:{state / 'log4j.properties'}",
            "-cp",
            cp,
            "kafka.Kafka",
            str(props),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        umask=procs.PRIVATE_UMASK,
    )  # its segments and checkpoints 0600, in folders 0700
    bootstrap = f"127.0.0.1:{ports['broker']}"
    info = BrokerInfo(pid=proc.pid, bootstrap=bootstrap, controller_port=ports["controller"], home=str(settings.home))
    (state / "broker.json").write_text(json.dumps(info.__dict__))
    try:
        wait_ready(bootstrap, timeout_s, proc=proc)
    except BrokerError:
        stop(settings)
        tail = (state / "broker.log").read_text(errors="replace")[-3000:]
        raise BrokerError(f"the broker did not become ready in {timeout_s}s; log tail:\n{tail}") from None
    return info


def _port_free(port: int) -> bool:
    """Can a server listen on ``port``? With SO_REUSEADDR, as Kafka's own sockets: connections of a
    broker that died, left in TIME_WAIT, do not keep it from listening again."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _wait_ports_free(ports: dict[str, int], timeout_s: float) -> None:
    """Wait until every port of ``ports`` is free; a BrokerError naming those still taken."""
    deadline = time.monotonic() + timeout_s
    while True:
        taken = {name: port for name, port in ports.items() if not _port_free(port)}
        if not taken:
            return
        if time.monotonic() > deadline:
            raise BrokerError(
                f"the broker's {', '.join(f'{n} port {p}' for n, p in taken.items())} "
                f"(kept with its data) is in use by another process: stop that process, or "
                f"stop any other broker of this home (`somnus broker stop`)"
            )
        time.sleep(0.5)


def _server_properties(broker_port: int, controller_port: int, data: Path) -> str:
    return f"""\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller_port}
listeners=PLAINTEXT://127.0.0.1:{broker_port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{broker_port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs={data}
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
log.retention.hours=-1
log.retention.bytes=-1
message.max.bytes=10485760
num.network.threads=2
num.io.threads=2
"""


def wait_ready(bootstrap: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    """Wait until the broker answers a metadata request."""
    import asyncio  # with the Kafka client: only here, so `somnus status` and the supervisor start at once

    from aiokafka.admin import AIOKafkaAdminClient

    from somnus.streams.connection import kafka_options

    deadline = time.monotonic() + timeout_s

    async def probe() -> bool:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000, **kafka_options())
        try:
            await admin.start()
            await admin.list_topics()
            return True
        except Exception:
            return False
        finally:
            try:
                await admin.close()
            except Exception:
                pass

    while True:  # at least one try, however short the timeout
        if proc is not None and proc.poll() is not None:
            raise BrokerError(f"the broker process exited with {proc.returncode}")
        if any(_accepts(server) for server in bootstrap.split(",")) and asyncio.run(probe()):
            return
        if time.monotonic() >= deadline:
            raise BrokerError(f"no broker answered at {bootstrap} within {timeout_s:g} s")
        time.sleep(0.3)


def _accepts(server: str) -> bool:
    """Does ``host:port`` accept a TCP connection now?"""
    host, port = server.strip().rsplit(":", 1)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1):
            return True
    except (OSError, ValueError):
        return False


def await_broker(bootstrap: str, timeout_s: float, log: Any) -> None:
    """Wait up to ``timeout_s`` for a broker to answer at ``bootstrap`` (a worker or projector started
    before its broker, or while it restarts); ``BrokerError`` naming it after that."""
    try:
        wait_ready(bootstrap, 0.0)
        return
    except BrokerError:
        pass
    log.warning("no broker answers at %s yet; waiting up to %.0f s (SOMNUS_BROKER_WAIT_S)", bootstrap, timeout_s)
    wait_ready(bootstrap, timeout_s)
    log.warning("the broker at %s answers", bootstrap)


def stop(settings: Settings, timeout_s: float = 30.0) -> bool:
    """Stop the local broker cleanly (SIGTERM, then SIGKILL after timeout_s)."""
    info_file = _state_dir(settings) / "broker.json"
    if not info_file.exists():
        return False
    info = BrokerInfo(**json.loads(info_file.read_text()))
    stopped = False
    if info.alive:
        os.kill(info.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while info.alive and time.monotonic() < deadline:
            time.sleep(0.2)
        if info.alive:
            os.kill(info.pid, signal.SIGKILL)
        stopped = True
    try:
        os.waitpid(info.pid, os.WNOHANG)
    except ChildProcessError:
        pass
    info_file.unlink(missing_ok=True)
    return stopped


def bootstrap_for(settings: Settings, start_if_missing: bool = True) -> str:
    """The bootstrap servers to use: configured, or the local broker (started if asked)."""
    if settings.bootstrap:
        return settings.bootstrap
    info = status(settings)
    if info is not None:
        return info.bootstrap
    if not start_if_missing:
        raise BrokerError("no broker: set KAFKA_BOOTSTRAP or run `somnus broker start`")
    return start(settings).bootstrap
