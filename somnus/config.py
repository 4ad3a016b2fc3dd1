"""One frozen, typed configuration object: arguments > environment (SOMNUS_*) > defaults.

>>> cfg = Settings.resolve(home="/tmp/somnus-doc", env={})
>>> cfg.db_path.name
'somnus.duckdb'
>>> Settings.resolve(env={"SOMNUS_PARTITIONS": "8"}).partitions
8
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPERVISOR_STATE_FILE = "supervisor.json"  # in run_dir: what the supervisor runs (somnus status, /metrics)

# Environment variable for each setting; the field's type converts the string.
_ENV = {
    "home": "SOMNUS_HOME",
    "db_path": "SOMNUS_DB",
    "bootstrap": "KAFKA_BOOTSTRAP",
    "cache": "SOMNUS_CACHE",
    "partitions": "SOMNUS_PARTITIONS",
    "workers": "SOMNUS_WORKERS",
    "replication_factor": "SOMNUS_REPLICATION_FACTOR",
    "topic_prefix": "SOMNUS_TOPIC_PREFIX",
    "max_event_bytes": "SOMNUS_MAX_EVENT_BYTES",
    "max_json_depth": "SOMNUS_MAX_JSON_DEPTH",
    "batch_size": "SOMNUS_BATCH_SIZE",
    "batch_within_s": "SOMNUS_BATCH_WITHIN_S",
    "agents_dir": "SOMNUS_AGENTS_DIR",
    "app_id": "SOMNUS_APP_ID",
    "session_timeout_s": "SOMNUS_SESSION_TIMEOUT_S",
    "llm_extractor": "SOMNUS_LLM_EXTRACTOR",
    "working_memory_max_tokens": "SOMNUS_WORKING_MEMORY_MAX_TOKENS",
    "model_context_tokens": "SOMNUS_MODEL_CONTEXT_TOKENS",
    "sleep_schedule": "SOMNUS_SLEEP_SCHEDULE",
    "fact_retire_days": "SOMNUS_FACT_RETIRE_DAYS",
    "oscillators": "SOMNUS_OSCILLATORS",
    "multipart_records": "SOMNUS_MULTIPART_RECORDS",
    "session_retention_s": "SOMNUS_SESSION_RETENTION_S",
    "session_idle_s": "SOMNUS_SESSION_IDLE_S",
    "max_clock_skew_s": "SOMNUS_MAX_CLOCK_SKEW_S",
    "broker_wait_s": "SOMNUS_BROKER_WAIT_S",
    "sql_timeout_s": "SOMNUS_SQL_TIMEOUT_S",
    "sql_memory_limit": "SOMNUS_SQL_MEMORY_LIMIT",
    "sql_threads": "SOMNUS_SQL_THREADS",
    "db_memory_limit": "SOMNUS_DB_MEMORY_LIMIT",
    "max_batch_bytes": "SOMNUS_MAX_BATCH_BYTES",
    "kafka_security_protocol": "KAFKA_SECURITY_PROTOCOL",
    "kafka_sasl_mechanism": "KAFKA_SASL_MECHANISM",
    "kafka_sasl_username": "KAFKA_SASL_USERNAME",
    "kafka_sasl_password": "KAFKA_SASL_PASSWORD",
    "kafka_ssl_cafile": "KAFKA_SSL_CAFILE",
    "otlp_host": "SOMNUS_OTLP_HOST",
    "otlp_port": "SOMNUS_OTLP_PORT",
    "otlp_max_body": "SOMNUS_OTLP_MAX_BODY",
    "otlp_trace_timeout_s": "SOMNUS_OTLP_TRACE_TIMEOUT_S",
    "mcp_host": "SOMNUS_MCP_HOST",
    "mcp_port": "SOMNUS_MCP_PORT",
}


@dataclass(frozen=True)
class Settings:
    home: Path = Path.home() / ".somnus"
    db_path: Path | None = None  # default: <home>/somnus.duckdb
    bootstrap: str | None = None  # None: the project's own local broker (see somnus.broker)
    cache: Path = Path.home() / ".cache" / "somnus"
    partitions: int = 4
    # Worker processes `somnus up` runs (one Faust app id: Kafka splits the trace partitions among them).
    workers: int = 1
    # Replicas of every topic Somnus creates (its own and Faust's changelogs): 1 for the local broker,
    # 3 on a three-broker cluster (docker-compose.yml, profile `scale`), where one broker may fail.
    replication_factor: int = 1
    topic_prefix: str = "somnus."
    max_event_bytes: int = 1_048_576
    # JSON nesting a record may have (somnus.schemas.codec.check_json): deeper is a dead letter, never parsed.
    max_json_depth: int = 64
    batch_size: int = 500
    batch_within_s: float = 0.1
    agents_dir: Path | None = None
    app_id: str = "somnus"
    # How long the group waits for a silent worker before handing its partitions to the others.
    session_timeout_s: float = 10.0
    # Entity extraction by an LLM (streams/llm_extractor.py; its key and model come from SOMNUS_LLM_*).
    # Off by default: the write path is deterministic and offline unless this is turned on.
    llm_extractor: bool = False
    # Working memory (processors/working/session_buffer.py): -1 = 60% of the model's context, within [16K, 600K].
    working_memory_max_tokens: int = -1
    model_context_tokens: int = 200_000
    # Deep sleep (projections/sleep.py): cron, evaluated on stream time (event time), UTC.
    sleep_schedule: str = "0 3 * * *"
    # Sleep retires a live fact neither reinforced nor used for this many days of stream time
    # (processors/sleep/scoring.idle_triples); 0: never.
    fact_retire_days: float = 90.0
    # Coupled oscillators of the SCN (processors/prediction/oscillators.py): optional, off by default.
    oscillators: bool = False
    # A batch's observations and link updates of one partition in one multi-part record (each session's
    # part sealed under its key) rather than one record per session: the worker's CPU per event falls a
    # third; off by default because the e2e rate did not rise (BENCHMARKS.md, "Multi-part records").
    multipart_records: bool = False
    # How long the worker remembers a closed session (stream time, per partition: processors/sessions/session_retention.py);
    # 0 keeps every marker forever.
    session_retention_s: float = 7 * 86400.0
    # A session with no event for this long (stream time, per partition) is closed as abandoned: an
    # episode with outcome failure (processors/sessions/session_retention.py). 0 (the default) leaves it open forever.
    session_idle_s: float = 0.0
    # How far an event's time may be ahead of its record's broker time and still move its partition's
    # stream time (processors/sessions/session_retention.py): a runtime's clock that runs ahead is bounded. 0: no bound.
    max_clock_skew_s: float = 300.0
    # How long a starting worker or projector waits for its broker to answer before it exits (then
    # `somnus up`'s supervisor starts it again after a back-off).
    broker_wait_s: float = 300.0
    # Analysts' SQL (projections/sql_sandbox.py): a query still running after this is interrupted; the
    # memory its sorts and hash tables may hold; its threads where DuckDB allows (a file opened for
    # the query alone; in the projector the thread count is the database's, shared with the writer).
    sql_timeout_s: float = 10.0
    sql_memory_limit: str = "1GB"
    sql_threads: int = 2
    # DuckDB's memory_limit for the projector's database (writer and analysts together). Without one
    # (DuckDB's default: 80% of RAM) its buffer pool kept every table block it read or wrote: 495 MB
    # of a 1M-event run's 2.3 GB peak, growing with the file. Blocks over the limit are evicted and
    # read again when needed; sorts and joins past it spill to ``<db>.tmp``.
    db_memory_limit: str = "384MB"
    # What one fetched Kafka record batch may decompress to in the worker and the projector
    # (streams/kafka_compat/decompression.py): a batch over it is one dead letter, not an
    # out-of-memory kill. Twice the largest batch Somnus's own producers make.
    max_batch_bytes: int = 64 << 20
    # A secured Kafka cluster (kafka_options): every client Somnus makes gets these.
    kafka_security_protocol: str = "PLAINTEXT"
    kafka_sasl_mechanism: str | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: str | None = dataclasses.field(default=None, repr=False)
    kafka_ssl_cafile: Path | None = None
    # The OTLP/HTTP receiver (somnus/otlp/receiver.py) that `somnus up` runs; port 0: not started by `up`.
    otlp_host: str = "127.0.0.1"
    otlp_port: int = 4318
    otlp_max_body: int = 8 << 20  # bytes of a request, compressed and decompressed
    otlp_trace_timeout_s: float = (
        300.0  # a trace whose root span never comes is published this long after its last span
    )
    # The MCP server over streamable HTTP (somnus/mcp_server.py) that `somnus up` runs at
    # http://<mcp_host>:<mcp_port>/mcp; port 0: not started by `up` (docs/integrations/mcp.md).
    mcp_host: str = "127.0.0.1"
    mcp_port: int = 8765

    @classmethod
    def resolve(cls, env: Mapping[str, str] | None = None, **args: Any) -> Settings:
        """Build settings from explicit arguments, then the environment, then defaults."""
        env = os.environ if env is None else env
        unknown = set(args) - set(_ENV)
        if unknown:
            raise TypeError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        values: dict[str, Any] = {}
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        for name, var in _ENV.items():
            if args.get(name) is not None:
                values[name] = args[name]
            elif env.get(var):
                values[name] = env[var]
        for name, value in list(values.items()):
            values[name] = _convert(types[name], value)
        settings = cls(**values)
        if settings.db_path is None:
            settings = dataclasses.replace(settings, db_path=settings.home / "somnus.duckdb")
        return settings

    @property
    def db(self) -> Path:
        """The DuckDB file: ``db_path``, else ``<home>/somnus.duckdb`` (what ``load`` fills in)."""
        return Path(self.db_path) if self.db_path is not None else self.home / "somnus.duckdb"

    # Topic names: created explicitly with their partition counts (never auto-created).
    @property
    def traces_topic(self) -> str:
        return f"{self.topic_prefix}traces"

    @property
    def episodes_topic(self) -> str:
        return f"{self.topic_prefix}episodes"

    @property
    def dead_letter_topic(self) -> str:
        return f"{self.topic_prefix}dead-letters"

    @property
    def facts_topic(self) -> str:
        """What extraction made of each episode; one partition: the triple log is a fold over it."""
        return f"{self.topic_prefix}facts"

    @property
    def observations_topic(self) -> str:
        """NAc inputs: call outcomes, in bundles, partitioned by event signature (the links table's key)."""
        return f"{self.topic_prefix}observations"

    @property
    def link_updates_topic(self) -> str:
        """Every Rescorla-Wagner update of a causal link (bundles), for the append-only projection."""
        return f"{self.topic_prefix}link-updates"

    @property
    def memory_topic(self) -> str:
        """Episodic memory inputs (units) and accesses; one partition: capture is a fold over it."""
        return f"{self.topic_prefix}memory"

    @property
    def semantic_topic(self) -> str:
        """Semantic memory inputs (ingested knowledge, promotion requests); one partition: a fold."""
        return f"{self.topic_prefix}semantic"

    @property
    def working_memory_topic(self) -> str:
        """The changelog of the worker's working-memory table (key = session): the projector reads it."""
        return f"{self.app_id}-working_memory-changelog"

    @property
    def keys_topic(self) -> str:
        """The compacted topic of the sessions' data keys (somnus.streams.keys)."""
        return f"{self.topic_prefix}keys"

    @property
    def projected_topics(self) -> tuple[str, ...]:
        return (
            self.traces_topic,
            self.episodes_topic,
            self.dead_letter_topic,
            self.facts_topic,
            self.link_updates_topic,
            self.memory_topic,
            self.working_memory_topic,
            self.semantic_topic,
        )

    @property
    def run_dir(self) -> Path:
        return self.home / "run"

    def as_env(self) -> dict[str, str]:
        """The environment a child process needs to resolve the same settings."""
        out = {}
        for name, var in _ENV.items():
            value = getattr(self, name)
            if value is not None:
                out[var] = str(value)
        return out


def _convert(kind: Any, value: Any) -> Any:
    kind = str(kind)
    if isinstance(value, str):
        if kind.startswith("bool"):
            if value.strip().lower() in ("1", "true", "yes", "on"):
                return True
            if value.strip().lower() in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(f"not a boolean: {value!r} (use true/false)")
        if "Path" in kind:
            return Path(value).expanduser()
        if kind.startswith("int"):
            return int(value)
        if kind.startswith("float"):
            return float(value)
    if "Path" in kind and not isinstance(value, Path):
        return Path(value).expanduser()
    return value
