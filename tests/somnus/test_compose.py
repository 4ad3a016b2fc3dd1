"""docker-compose.yml's `scale` profile (issue 30): three KRaft brokers and two workers.

No Docker engine runs here, so the file is checked as data: what a three-node KRaft cluster needs
(distinct node ids, one quorum of the three, one cluster id, replication 3 with min ISR 2) and what
the two workers need (distinct names, every broker to bootstrap from, topics made with 3 replicas).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from somnus.config import Settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]


def _profile(services: dict[str, dict[str, Any]], name: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in services.items() if name in v.get("profiles", [])}


def _brokers(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {
        k: {e: str(v) for e, v in s["environment"].items()}
        for k, s in _profile(services, "scale").items()
        if s["image"].startswith("apache/kafka")
    }


def test_every_service_is_in_exactly_one_profile_so_the_two_stacks_never_run_together(services):
    assert all(len(s.get("profiles", [])) == 1 for s in services.values())
    assert set(_profile(services, "single")) == {"kafka", "worker", "projector"}
    # plain `docker compose up` keeps starting the single-node stack
    assert "COMPOSE_PROFILES=single" in (ROOT / ".env").read_text().splitlines()


def test_the_scale_profile_has_three_brokers_with_distinct_node_ids_and_one_quorum_of_three(services):
    brokers = _brokers(services)
    assert len(brokers) == 3
    ids = {env["KAFKA_NODE_ID"] for env in brokers.values()}
    assert ids == {"1", "2", "3"}
    voters = {env["KAFKA_CONTROLLER_QUORUM_VOTERS"] for env in brokers.values()}
    assert len(voters) == 1  # every node knows the same quorum
    quorum = dict(v.split("@", 1) for v in voters.pop().split(","))
    assert set(quorum) == ids
    port = {env["KAFKA_NODE_ID"]: env["KAFKA_LISTENERS"].split("CONTROLLER://:")[1] for env in brokers.values()}
    assert quorum == {i: f"{name}:{port[i]}" for name, env in brokers.items() for i in [env["KAFKA_NODE_ID"]]}
    assert len({env["CLUSTER_ID"] for env in brokers.values()}) == 1
    for name, env in brokers.items():
        assert env["KAFKA_PROCESS_ROLES"] == "broker,controller", name
        assert env["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://{name}:9092", name


def test_the_scale_brokers_replicate_internal_and_default_topics_three_times(services):
    for name, env in _brokers(services).items():
        for key in (
            "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
            "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
            "KAFKA_DEFAULT_REPLICATION_FACTOR",
        ):
            assert env[key] == "3", (name, key)
        assert env["KAFKA_MIN_INSYNC_REPLICAS"] == env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "2", name
        # what the pipeline relies on of any broker (tests/somnus/test_broker.py)
        assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false" and env["KAFKA_MESSAGE_MAX_BYTES"] == "10485760"


def test_the_scale_profile_has_two_workers_with_distinct_names_bootstrapping_from_every_broker(services):
    scale = _profile(services, "scale")
    workers = {k: s for k, s in scale.items() if "somnus.streams.worker" in s.get("command", "")}
    assert len(workers) == 2
    names = {s["command"].split("--name ")[1].split()[0] for s in workers.values()}
    assert len(names) == 2
    brokers = {f"{name}:9092" for name in _brokers(services)}
    for name, s in workers.items():
        env = {k: str(v) for k, v in s["environment"].items()}
        assert set(env["KAFKA_BOOTSTRAP"].split(",")) == brokers, name
        settings = Settings.resolve(env=env)
        assert settings.replication_factor == 3, name  # Somnus' topics and Faust's changelogs too
        assert set(s["depends_on"]) == set(_brokers(services)), name
    projectors = [s for s in scale.values() if "somnus.projections.projector" in s.get("command", "")]
    assert len(projectors) == 1  # one writer of the DuckDB file
    assert projectors[0]["environment"] == next(iter(workers.values()))["environment"]
