"""The local broker's log-dir formatting, against Kafka's real StorageTool (jars from the Maven cache)."""

from __future__ import annotations

from pathlib import Path

import pytest

from somnus import broker
from somnus.config import Settings


def _format(tmp_path: Path, cluster_id: str) -> Path:
    settings = Settings.resolve(env={}, home=tmp_path / "home")
    libs = broker.fetch(settings)
    state = tmp_path / "state"
    data = state / "data"
    data.mkdir(parents=True)
    props = state / "server.properties"
    props.write_text(broker._server_properties(broker._free_port(), broker._free_port(), data))
    (state / "log4j.properties").write_text(broker.LOG4J)
    broker.format_log_dir(broker._java(), f"{libs}/*", state, props, cluster_id)
    return data / "meta.properties"


def test_a_cluster_id_starting_with_a_dash_formats(tmp_path):
    """About one random id in 32 starts with '-'; passed after a bare ``-t`` the tool took it for an
    option and the broker failed to start (seen once in a test run)."""
    meta = _format(tmp_path, "-AbCdEfGhIjKlMnOpQrStUw")
    assert "cluster.id=-AbCdEfGhIjKlMnOpQrStUw" in meta.read_text()


def test_new_cluster_ids_are_22_base64url_characters():
    ids = {broker.new_cluster_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(
        len(i) == 22 and set(i) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") for i in ids
    )


def test_the_compose_broker_has_the_local_brokers_limits_and_topic_rules():
    # docker-compose.yml cannot run here (no Docker engine); what the pipeline relies on of a broker
    # must at least be set the same way in both: records up to 10 MB (bundles, gzipped promotion
    # requests), no auto-created topics, nothing expired.
    import yaml

    root = Path(__file__).resolve().parents[2]
    env = yaml.safe_load((root / "docker-compose.yml").read_text())["services"]["kafka"]["environment"]
    compose = {k[len("KAFKA_") :].lower().replace("_", "."): str(v) for k, v in env.items()}
    local = dict(line.split("=", 1) for line in broker._server_properties(1, 2, Path("/d")).splitlines())
    for key in (
        "message.max.bytes",
        "auto.create.topics.enable",
        "log.retention.hours",
        "offsets.topic.replication.factor",
        "group.initial.rebalance.delay.ms",
    ):
        assert compose.get(key) == local[key], key


@pytest.mark.integration
def test_a_broker_killed_and_started_again_keeps_its_port_and_its_records(tmp_path):
    """A restart within a minute of a crash found the broker's ports in TIME_WAIT, took them for taken,
    and deleted the log dir: every topic lost (and a new port)."""
    import asyncio
    import os
    import signal
    import time

    from aiokafka import AIOKafkaConsumer

    from somnus.client import publish
    from somnus.streams.topics import ensure_topics_async

    settings = Settings.resolve(env={}, home=tmp_path / "home")
    info = broker.start(settings)
    try:
        asyncio.run(ensure_topics_async(info.bootstrap, {"kept": 2}))
        events = [{"n": i, "session_id": f"s{i % 5}"} for i in range(50)]
        assert publish(events, info.bootstrap, "kept", bundle_max=1) == 50
        os.kill(info.pid, signal.SIGKILL)  # its client connections end in TIME_WAIT on its port
        while info.alive:
            time.sleep(0.1)
        again = broker.start(settings)
        assert again.bootstrap == info.bootstrap

        async def read() -> int:
            consumer = AIOKafkaConsumer(
                "kept", bootstrap_servers=again.bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
            )
            await consumer.start()
            try:
                got = 0
                deadline = time.monotonic() + 30
                while got < 50 and time.monotonic() < deadline:
                    batch = await consumer.getmany(timeout_ms=1000)
                    got += sum(len(v) for v in batch.values())
                return got
            finally:
                await consumer.stop()

        assert asyncio.run(read()) == 50
    finally:
        broker.stop(settings)
