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
    "oscillators": (True, "SOMNUS_OSCILLATORS", "true", True),
    "session_retention_s": (3600.0, "SOMNUS_SESSION_RETENTION_S", "3600", 3600.0),
    "session_idle_s": (7200.0, "SOMNUS_SESSION_IDLE_S", "7200", 7200.0),
    "max_clock_skew_s": (60.0, "SOMNUS_MAX_CLOCK_SKEW_S", "60", 60.0),
    "broker_wait_s": (30.0, "SOMNUS_BROKER_WAIT_S", "30", 30.0),
}


def test_the_table_above_covers_every_setting():
    assert set(NON_DEFAULT) == {f.name for f in dataclasses.fields(Settings)}


def test_defaults_are_pinned():
    s = Settings.resolve(env={})
    assert s.home == Path.home() / ".somnus"
    assert s.db_path == Path.home() / ".somnus" / "somnus.duckdb"
    assert s.cache == Path.home() / ".cache" / "somnus"
    assert (s.bootstrap, s.agents_dir) == (None, None)
    assert (s.partitions, s.topic_prefix, s.max_event_bytes, s.batch_size, s.batch_within_s, s.app_id,
            s.session_timeout_s) == (4, "somnus.", 1_048_576, 500, 0.1, "somnus", 10.0)
    assert s.session_retention_s == 7 * 86400.0 and s.session_idle_s == 0.0 and s.max_clock_skew_s == 300.0
    assert s.max_json_depth == 64


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
    assert s.projected_topics == ("t1.traces", "t1.episodes", "t1.dead-letters", "t1.facts", "t1.link-updates",
                                  "t1.memory", f"{s.app_id}-working_memory-changelog",
                                  "t1.semantic")
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
