"""The local broker's log-dir formatting, against Kafka's real StorageTool (jars from the Maven cache)."""

from __future__ import annotations

from pathlib import Path

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
    assert all(len(i) == 22 and set(i) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
               for i in ids)


def test_the_compose_broker_has_the_local_brokers_limits_and_topic_rules():
    # docker-compose.yml cannot run here (no Docker engine); what the pipeline relies on of a broker
    # must at least be set the same way in both: records up to 10 MB (bundles, gzipped promotion
    # requests), no auto-created topics, nothing expired.
    import yaml

    root = Path(__file__).resolve().parents[2]
    env = yaml.safe_load((root / "docker-compose.yml").read_text())["services"]["kafka"]["environment"]
    compose = {k[len("KAFKA_"):].lower().replace("_", "."): str(v) for k, v in env.items()}
    local = dict(line.split("=", 1) for line in broker._server_properties(1, 2, Path("/d")).splitlines())
    for key in ("message.max.bytes", "auto.create.topics.enable", "log.retention.hours",
                "offsets.topic.replication.factor", "group.initial.rebalance.delay.ms"):
        assert compose.get(key) == local[key], key
