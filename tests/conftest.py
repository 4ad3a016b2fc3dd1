"""Shared fixtures. Integration tests get a real broker from one session-scoped fixture:
``KAFKA_BOOTSTRAP`` if set; else testcontainers when a Docker engine answers; else the project's
own local KRaft broker (started here, stopped at the end)."""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

from somnus.config import Settings

DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"

# Hypothesis: CI (the CI environment variable set, as CI services do) runs every property test with
# its own example count; a local run caps each at LOCAL_MAX_EXAMPLES, so the unit tier stays quick.
# HYPOTHESIS_PROFILE=ci locally runs the CI counts.
LOCAL_MAX_EXAMPLES = 10
hypothesis_settings.register_profile("ci", hypothesis_settings())
hypothesis_settings.register_profile("dev", hypothesis_settings(max_examples=LOCAL_MAX_EXAMPLES))
IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if IN_CI else "dev"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under the dev profile, cap the example count a test sets itself (``@settings(max_examples=N)``),
    which a profile alone does not override. Hypothesis reads a test's settings from this attribute
    of its wrapper when the test runs (the same one ``@settings`` sets)."""
    if hypothesis_settings.default.max_examples > LOCAL_MAX_EXAMPLES:
        return
    for item in items:
        test = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
        own = getattr(test, "_hypothesis_internal_use_settings", None)
        if own is not None and own.max_examples > LOCAL_MAX_EXAMPLES:
            test._hypothesis_internal_use_settings = hypothesis_settings(own, max_examples=LOCAL_MAX_EXAMPLES)


def _testcontainers_bootstrap() -> tuple[object, str] | None:
    """A Kafka container when a Docker engine answers; None otherwise (the constructor raises then)."""
    try:
        from testcontainers.kafka import KafkaContainer

        container = KafkaContainer("apache/kafka:3.9.1")
        container.start()
    except Exception as exc:  # no Docker engine, no image, no network: use the local broker
        print(f"testcontainers unavailable ({type(exc).__name__}: {str(exc)[:120]}); using the local broker")
        return None
    return container, container.get_bootstrap_server()


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if os.environ.get("KAFKA_BOOTSTRAP"):
        yield os.environ["KAFKA_BOOTSTRAP"]
        return
    found = _testcontainers_bootstrap()
    if found is not None:
        container, bootstrap = found
        yield bootstrap
        container.stop()  # type: ignore[attr-defined]
        return
    from somnus import broker

    settings = Settings.resolve(home=tmp_path_factory.mktemp("broker-home"))
    info = broker.start(settings)
    try:
        yield info.bootstrap
    finally:
        broker.stop(settings)


@pytest.fixture()
def pipeline_settings(kafka_bootstrap: str, tmp_path: Path) -> Settings:
    """Settings of an isolated pipeline: its own topics, consumer group, state folder and DuckDB file."""
    run = uuid.uuid4().hex[:10]
    base = Settings.resolve(env={}, home=tmp_path / "home")
    return dataclasses.replace(
        base,
        bootstrap=kafka_bootstrap,
        db_path=tmp_path / "somnus.duckdb",
        topic_prefix=f"t{run}.",
        app_id=f"somnus-test-{run}",
        partitions=4,
        session_timeout_s=6.0,
        otlp_port=0,
        mcp_port=0,
    )  # `somnus up` in a test starts no OTLP receiver (shared port 4318) nor MCP
    # server (8765) unless it asks


@pytest.fixture()
def tau_bench_path() -> Path:
    path = DATASETS / "tau-bench-airline" / "gpt-4o-airline.json"
    if not path.exists():
        pytest.skip(f"dataset missing: {path}")
    return path
