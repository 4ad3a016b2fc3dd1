"""somnus.config: one frozen, typed Settings resolved as arguments > environment (SOMNUS_*) > defaults."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from somnus.config import Settings

# A value other than the default for every setting: (argument value, environment variable, env text, typed value)
NON_DEFAULT = {
    "home": ("/srv/somnus", "SOMNUS_HOME", "/srv/somnus", Path("/srv/somnus")),
    "db_path": ("/data/x.duckdb", "SOMNUS_DB", "/data/x.duckdb", Path("/data/x.duckdb")),
    "bootstrap": ("kafka:9092", "KAFKA_BOOTSTRAP", "kafka:9092", "kafka:9092"),
    "cache": ("/var/cache/s", "SOMNUS_CACHE", "/var/cache/s", Path("/var/cache/s")),
    "partitions": (12, "SOMNUS_PARTITIONS", "12", 12),
    "workers": (3, "SOMNUS_WORKERS", "3", 3),
    "replication_factor": (3, "SOMNUS_REPLICATION_FACTOR", "3", 3),
    "topic_prefix": ("prod.", "SOMNUS_TOPIC_PREFIX", "prod.", "prod."),
    "max_event_bytes": (2048, "SOMNUS_MAX_EVENT_BYTES", "2048", 2048),
    "max_json_depth": (16, "SOMNUS_MAX_JSON_DEPTH", "16", 16),
    "batch_size": (50, "SOMNUS_BATCH_SIZE", "50", 50),
    "batch_within_s": (0.5, "SOMNUS_BATCH_WITHIN_S", "0.5", 0.5),
    "agents_dir": ("/etc/agents", "SOMNUS_AGENTS_DIR", "/etc/agents", Path("/etc/agents")),
    "app_id": ("somnus-prod", "SOMNUS_APP_ID", "somnus-prod", "somnus-prod"),
    "session_timeout_s": (30.0, "SOMNUS_SESSION_TIMEOUT_S", "30", 30.0),
    "llm_extractor": (True, "SOMNUS_LLM_EXTRACTOR", "true", True),
    "working_memory_max_tokens": (32000, "SOMNUS_WORKING_MEMORY_MAX_TOKENS", "32000", 32000),
    "model_context_tokens": (128000, "SOMNUS_MODEL_CONTEXT_TOKENS", "128000", 128000),
    "sleep_schedule": ("0 */6 * * *", "SOMNUS_SLEEP_SCHEDULE", "0 */6 * * *", "0 */6 * * *"),
    "fact_retire_days": (30.0, "SOMNUS_FACT_RETIRE_DAYS", "30", 30.0),
    "oscillators": (True, "SOMNUS_OSCILLATORS", "true", True),
    "multipart_records": (True, "SOMNUS_MULTIPART_RECORDS", "true", True),
    "session_retention_s": (3600.0, "SOMNUS_SESSION_RETENTION_S", "3600", 3600.0),
    "session_idle_s": (7200.0, "SOMNUS_SESSION_IDLE_S", "7200", 7200.0),
    "max_clock_skew_s": (60.0, "SOMNUS_MAX_CLOCK_SKEW_S", "60", 60.0),
    "broker_wait_s": (30.0, "SOMNUS_BROKER_WAIT_S", "30", 30.0),
    "sql_timeout_s": (2.5, "SOMNUS_SQL_TIMEOUT_S", "2.5", 2.5),
    "sql_memory_limit": ("256MB", "SOMNUS_SQL_MEMORY_LIMIT", "256MB", "256MB"),
    "sql_threads": (1, "SOMNUS_SQL_THREADS", "1", 1),
    "db_memory_limit": ("1GB", "SOMNUS_DB_MEMORY_LIMIT", "1GB", "1GB"),
    "max_batch_bytes": (8 << 20, "SOMNUS_MAX_BATCH_BYTES", "8388608", 8 << 20),
    "kafka_security_protocol": ("SASL_SSL", "KAFKA_SECURITY_PROTOCOL", "SASL_SSL", "SASL_SSL"),
    "kafka_sasl_mechanism": ("SCRAM-SHA-256", "KAFKA_SASL_MECHANISM", "SCRAM-SHA-256", "SCRAM-SHA-256"),
    "kafka_sasl_username": ("somnus", "KAFKA_SASL_USERNAME", "somnus", "somnus"),
    "kafka_sasl_password": ("s3cret", "KAFKA_SASL_PASSWORD", "s3cret", "s3cret"),
    "kafka_ssl_cafile": ("/etc/kafka/ca.pem", "KAFKA_SSL_CAFILE", "/etc/kafka/ca.pem", Path("/etc/kafka/ca.pem")),
    "otlp_host": ("0.0.0.0", "SOMNUS_OTLP_HOST", "0.0.0.0", "0.0.0.0"),
    "otlp_port": (0, "SOMNUS_OTLP_PORT", "0", 0),
    "otlp_max_body": (1024, "SOMNUS_OTLP_MAX_BODY", "1024", 1024),
    "otlp_trace_timeout_s": (60.0, "SOMNUS_OTLP_TRACE_TIMEOUT_S", "60", 60.0),
    "mcp_host": ("0.0.0.0", "SOMNUS_MCP_HOST", "0.0.0.0", "0.0.0.0"),
    "mcp_port": (0, "SOMNUS_MCP_PORT", "0", 0),
}


def test_the_table_above_covers_every_setting():
    assert set(NON_DEFAULT) == {f.name for f in dataclasses.fields(Settings)}


def test_defaults_are_pinned():
    s = Settings.resolve(env={})
    assert s.home == Path.home() / ".somnus"
    assert s.db_path == Path.home() / ".somnus" / "somnus.duckdb"
    assert s.cache == Path.home() / ".cache" / "somnus"
    assert (s.bootstrap, s.agents_dir) == (None, None)
    assert (
        s.partitions,
        s.topic_prefix,
        s.max_event_bytes,
        s.batch_size,
        s.batch_within_s,
        s.app_id,
        s.session_timeout_s,
    ) == (4, "somnus.", 1_048_576, 500, 0.1, "somnus", 10.0)
    assert s.session_retention_s == 7 * 86400.0 and s.session_idle_s == 0.0 and s.max_clock_skew_s == 300.0
    assert s.replication_factor == 1  # the local single broker; 3 in the compose `scale` profile
    assert s.max_json_depth == 64
    assert s.workers == 1
    assert (s.sql_timeout_s, s.sql_memory_limit, s.sql_threads) == (10.0, "1GB", 2)
    assert s.db_memory_limit == "384MB"  # the projector's DuckDB: its buffer pool grew with the file
    assert s.max_batch_bytes == 64 << 20  # what one fetched record batch may decompress to
    assert (
        s.kafka_security_protocol,
        s.kafka_sasl_mechanism,
        s.kafka_sasl_username,
        s.kafka_sasl_password,
        s.kafka_ssl_cafile,
    ) == ("PLAINTEXT", None, None, None, None)


@pytest.mark.parametrize("name", sorted(NON_DEFAULT))
def test_each_setting_comes_from_its_environment_variable_converted_to_its_type(name):
    _, var, text, typed = NON_DEFAULT[name]
    value = getattr(Settings.resolve(env={var: text}), name)
    assert value == typed
    assert type(value) is type(typed)


@pytest.mark.parametrize("name", sorted(NON_DEFAULT))
def test_an_argument_beats_the_environment(name):
    arg, var, _, typed = NON_DEFAULT[name]
    env = {var: "/elsewhere" if isinstance(typed, Path) else ("99" if isinstance(typed, (int, float)) else "other")}
    assert getattr(Settings.resolve(env=env, **{name: arg}), name) == typed


def test_a_none_argument_falls_through_to_the_environment_then_the_default():
    assert Settings.resolve(env={"SOMNUS_PARTITIONS": "8"}, partitions=None).partitions == 8
    assert Settings.resolve(env={}, partitions=None).partitions == 4


def test_an_empty_environment_variable_is_unset():
    assert Settings.resolve(env={"SOMNUS_PARTITIONS": "", "KAFKA_BOOTSTRAP": ""}) == Settings.resolve(env={})


def test_unrelated_environment_variables_are_ignored():
    assert Settings.resolve(env={"SOMNUS_NOPE": "1", "PATH": "/bin"}) == Settings.resolve(env={})


def test_the_process_environment_is_read_when_no_mapping_is_given(monkeypatch):
    monkeypatch.setenv("SOMNUS_BATCH_SIZE", "77")
    assert Settings.resolve().batch_size == 77
    assert Settings.resolve(env={}).batch_size == 500


def test_db_path_defaults_under_home_wherever_home_comes_from(tmp_path):
    assert Settings.resolve(env={}, home=tmp_path).db_path == tmp_path / "somnus.duckdb"
    assert Settings.resolve(env={"SOMNUS_HOME": str(tmp_path)}).db_path == tmp_path / "somnus.duckdb"
    assert Settings.resolve(env={"SOMNUS_HOME": str(tmp_path)}, db_path=tmp_path / "o.db").db_path == tmp_path / "o.db"
    assert Settings.resolve(env={"SOMNUS_DB": "/x/y.db"}, home=tmp_path).db_path == Path("/x/y.db")


def test_paths_expand_the_home_directory():
    s = Settings.resolve(env={"SOMNUS_CACHE": "~/c"}, home="~/h")
    assert (s.home, s.cache, s.db_path) == (Path.home() / "h", Path.home() / "c", Path.home() / "h" / "somnus.duckdb")


def test_string_arguments_are_converted_like_the_environment():
    s = Settings.resolve(env={}, partitions="6", batch_within_s="0.25", agents_dir="/a")
    assert (s.partitions, s.batch_within_s, s.agents_dir) == (6, 0.25, Path("/a"))


def test_a_malformed_number_is_an_error():
    with pytest.raises(ValueError):
        Settings.resolve(env={"SOMNUS_PARTITIONS": "four"})


def test_settings_are_frozen():
    s = Settings.resolve(env={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.partitions = 9  # type: ignore[misc]


def test_topic_names_follow_the_prefix():
    s = Settings.resolve(env={}, topic_prefix="t1.")
    assert (s.traces_topic, s.episodes_topic, s.dead_letter_topic) == ("t1.traces", "t1.episodes", "t1.dead-letters")
    assert s.projected_topics == (
        "t1.traces",
        "t1.episodes",
        "t1.dead-letters",
        "t1.facts",
        "t1.link-updates",
        "t1.memory",
        f"{s.app_id}-working_memory-changelog",
        "t1.semantic",
    )
    assert s.run_dir == s.home / "run"


def test_as_env_gives_a_child_process_the_same_settings():
    every = {name: arg for name, (arg, *_rest) in NON_DEFAULT.items()}
    for s in (Settings.resolve(env={}), Settings.resolve(env={}, **every)):
        env = s.as_env()
        assert all(isinstance(v, str) for v in env.values())
        assert Settings.resolve(env=env) == s


def test_an_unknown_argument_is_an_error():
    with pytest.raises(TypeError):
        Settings.resolve(env={}, partitons=8)


@pytest.mark.parametrize("text,value", [("1", True), ("on", True), ("TRUE", True), ("0", False), ("off", False)])
def test_boolean_settings_read_the_usual_spellings(text, value):
    assert Settings.resolve(env={"SOMNUS_LLM_EXTRACTOR": text}).llm_extractor is value


def test_a_boolean_setting_that_is_not_one_is_an_error_naming_the_value():
    with pytest.raises(ValueError, match="'maybe'"):
        Settings.resolve(env={"SOMNUS_LLM_EXTRACTOR": "maybe"})


# ---- Kafka security: one helper (kafka_options), passed to every client Somnus makes ----------------

SASL_SSL = {
    "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
    "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
    "KAFKA_SASL_USERNAME": "somnus",
    "KAFKA_SASL_PASSWORD": "s3cret",
}


def _cafile() -> str:
    return pytest.importorskip("certifi").where()  # any PEM bundle: the CA file is only loaded


def test_plaintext_needs_no_options():
    from somnus.streams.connection import kafka_options

    assert kafka_options(Settings.resolve(env={})) == {}
    assert kafka_options(Settings.resolve(env={"KAFKA_SECURITY_PROTOCOL": "plaintext"})) == {}


def test_sasl_ssl_options_carry_the_mechanism_the_user_and_a_context_with_the_ca_file():
    import ssl

    from somnus.streams.connection import kafka_options

    opts = kafka_options(Settings.resolve(env={**SASL_SSL, "KAFKA_SSL_CAFILE": _cafile()}))
    assert {k: v for k, v in opts.items() if k != "ssl_context"} == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "somnus",
        "sasl_plain_password": "s3cret",
    }
    assert isinstance(opts["ssl_context"], ssl.SSLContext) and opts["ssl_context"].verify_mode == ssl.CERT_REQUIRED
    assert opts["ssl_context"].get_ca_certs()  # the CA file was loaded


def test_ssl_alone_gives_a_context_and_no_sasl():
    from somnus.streams.connection import kafka_options

    opts = kafka_options(Settings.resolve(env={"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CAFILE": _cafile()}))
    assert set(opts) == {"security_protocol", "ssl_context"} and opts["security_protocol"] == "SSL"


@pytest.mark.parametrize(
    "env,match",
    [
        ({"KAFKA_SECURITY_PROTOCOL": "TLS"}, "KAFKA_SECURITY_PROTOCOL"),
        (
            {
                "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                "KAFKA_SASL_MECHANISM": "GSSAPI",
                "KAFKA_SASL_USERNAME": "u",
                "KAFKA_SASL_PASSWORD": "p",
            },
            "KAFKA_SASL_MECHANISM",
        ),
        ({"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "KAFKA_SASL_USERNAME": "u"}, "KAFKA_SASL_PASSWORD"),
    ],
)
def test_an_incomplete_or_unknown_security_setting_is_an_error_naming_it(env, match):
    from somnus.streams.connection import kafka_options

    with pytest.raises(ValueError, match=match):
        kafka_options(Settings.resolve(env=env))


def test_the_password_is_not_in_the_settings_repr():
    assert "s3cret" not in repr(Settings.resolve(env=SASL_SSL))


class _Stop(Exception):
    """Raised by a recorded client's start: the construction was all the test wanted."""


def _recorder(made: list[tuple[str, dict]], name: str) -> type:
    class Client:
        def __init__(self, *topics: str, **kwargs: object) -> None:
            made.append((name, kwargs))

        async def start(self) -> None:
            raise _Stop(name)

        async def stop(self) -> None:
            pass

        async def close(self) -> None:
            pass

    return Client


def _secured(made: list[tuple[str, dict]]) -> None:
    assert made, "no client was made"
    for name, kwargs in made:
        got = {
            k: kwargs.get(k)
            for k in ("security_protocol", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password")
        }
        assert got == {
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": "somnus",
            "sasl_plain_password": "s3cret",
        }, name


SASL_PLAIN = {**SASL_SSL, "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"}


@pytest.fixture()
def secured_env(monkeypatch) -> dict[str, str]:
    for var, value in SASL_PLAIN.items():
        monkeypatch.setenv(var, value)
    return SASL_PLAIN


def test_the_publishing_client_gets_the_security_options(secured_env, monkeypatch):
    from somnus import client

    made: list[tuple[str, dict]] = []
    monkeypatch.setattr(client, "AIOKafkaProducer", _recorder(made, "producer"))
    client.make_producer("kafka:9092")
    _secured(made)


def test_topic_creation_gets_the_security_options(secured_env, monkeypatch):
    import asyncio

    from somnus.streams import topics

    made: list[tuple[str, dict]] = []
    monkeypatch.setattr(topics, "AIOKafkaAdminClient", _recorder(made, "admin"))
    with pytest.raises(_Stop):
        asyncio.run(topics.ensure_topics_async("kafka:9092", {"t": 1}))
    _secured(made)


def test_the_projectors_consumer_and_producer_get_the_security_options(secured_env, monkeypatch, tmp_path):
    import asyncio
    from types import SimpleNamespace

    import duckdb

    from somnus.projections import projector

    settings = Settings.resolve(home=tmp_path)
    made: list[tuple[str, dict]] = []
    monkeypatch.setattr(projector, "AIOKafkaConsumer", _recorder(made, "consumer"))
    monkeypatch.setattr(projector, "AIOKafkaProducer", _recorder(made, "producer"))
    with pytest.raises(_Stop, match="consumer"):
        asyncio.run(projector.Projector(settings, "kafka:9092").run())
    seen = SimpleNamespace(
        agents={}, briefings=SimpleNamespace(current={}), memory=None, semantic=None, top_facts=None, keys=None
    )
    with pytest.raises(_Stop, match="producer"):
        asyncio.run(projector.Projector(settings, "kafka:9092")._start_server(duckdb.connect(), seen))
    assert [n for n, _ in made] == ["consumer", "producer"]
    _secured(made)


def test_status_first_record_lookup_and_the_broker_probe_get_the_security_options(secured_env, monkeypatch, tmp_path):
    import asyncio
    import socket

    import aiokafka
    import aiokafka.admin

    from somnus import broker
    from somnus.projections import positions
    from somnus.streams import app

    made: list[tuple[str, dict]] = []
    consumer = _recorder(made, "consumer")
    consumer.start = lambda self: asyncio.sleep(0)  # type: ignore[method-assign]  (then the admin client)
    # streams.app holds aiokafka's consumer under its own name (imported at the top of the file);
    # positions and the broker probe import aiokafka's classes when they run (somnus status starts at once)
    for module in (aiokafka, app):
        monkeypatch.setattr(module, "AIOKafkaConsumer", consumer)
    monkeypatch.setattr(aiokafka.admin, "AIOKafkaAdminClient", _recorder(made, "admin"))
    with pytest.raises(_Stop):
        asyncio.run(positions.kafka_positions(Settings.resolve(home=tmp_path), "kafka:9092"))
    monkeypatch.setattr(consumer, "start", _recorder([], "x").start)
    with pytest.raises(_Stop):
        asyncio.run(app.first_record_at("kafka:9092", aiokafka.TopicPartition("t", 0), 0))
    with socket.create_server(("127.0.0.1", 0)) as listening:  # the probe runs once a port accepts
        with pytest.raises(broker.BrokerError):
            broker.wait_ready(f"127.0.0.1:{listening.getsockname()[1]}", timeout_s=0.2)
    assert {n for n, _ in made} == {"consumer", "admin"} and len(made) >= 4
    _secured(made)


def test_the_faust_app_gets_the_same_credentials(secured_env, tmp_path):
    from faust.auth import SASLCredentials
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    from somnus.streams.app import create_app
    from somnus.streams.connection import kafka_options

    settings = Settings.resolve(home=tmp_path)
    app = create_app(settings, "kafka:9092")
    assert isinstance(app.conf.broker_credentials, SASLCredentials)
    # What Faust hands its consumer, producer and admin client is what every other client gets.
    assert dict(credentials_to_aiokafka_auth(app.conf.broker_credentials)) == {
        **kafka_options(settings),
        "ssl_context": None,
    }


def test_plaintext_faust_app_has_no_credentials(tmp_path, monkeypatch):
    from somnus.streams.app import create_app

    for var in SASL_SSL:
        monkeypatch.delenv(var, raising=False)
    assert create_app(Settings.resolve(env={}, home=tmp_path), "kafka:9092").conf.broker_credentials is None


def test_every_kafka_client_in_the_source_is_given_the_security_options():
    """A guard for clients added later: every AIOKafkaProducer / AIOKafkaConsumer / AIOKafkaAdminClient
    construction passes ``**kafka_options(...)``, and the Faust app its broker_credentials."""
    import ast

    root = Path(__file__).resolve().parents[2]
    clients = {"AIOKafkaProducer", "AIOKafkaConsumer", "AIOKafkaAdminClient"}
    seen = []
    for folder in ("somnus", "streams", "projections", "processors", "schemas"):
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call):
                    continue
                name = getattr(node.func, "id", getattr(node.func, "attr", None))
                where = f"{path.relative_to(root)}:{node.lineno}"
                if name in clients:
                    seen.append(where)
                    spread = [k.value for k in node.keywords if k.arg is None]
                    assert any(
                        isinstance(c, ast.Call) and getattr(c.func, "id", None) == "kafka_options"
                        for v in spread
                        for c in ast.walk(v)
                    ), f"{where}: {name} without **kafka_options()"
                elif name == "SomnusApp":
                    seen.append(where)
                    assert "broker_credentials" in {k.arg for k in node.keywords}, f"{where}: no broker_credentials"
    assert len(seen) >= 10  # the guard looked at the real constructions


def test_db_is_the_given_file_else_the_homes(tmp_path):
    from somnus.config import Settings

    assert Settings(home=tmp_path).db == tmp_path / "somnus.duckdb"
    assert Settings(home=tmp_path, db_path=tmp_path / "x.duckdb").db == tmp_path / "x.duckdb"
