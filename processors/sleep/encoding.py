"""A run's decisions as columns: a hand-written columnar JSON encoder, byte for byte msgspec's.

A run over a million memories decides millions of events, and the shell stores them as rows
(``SleepPlan.encoded``). The bulk kinds are therefore encoded column by column, never as one
struct per event: each value's text is msgspec's (numbers: a whole column encoded at once, then
cut at the commas; strings: quoted as msgspec quotes them) and the fields are joined in the
struct's declared order, tag first. That is ``encode_lifecycle`` of each event, byte for byte
(``tests/processors/sleep/test_encoding.py`` compares them on generated runs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import msgspec
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from somnus.processors.sleep.config import COMPACT_KEY_MAX_CHARS
from somnus.processors.sleep.scoring import Columns
from somnus.schemas.lifecycle import COMPACT_MAX_BYTES, CompactMemory, RunEvent, compact_size

# --- decisions as columns ---------------------------------------------------------------------------
# A run over a million memories decides millions of events, and the shell stores them as rows
# (``SleepPlan.encoded``). The bulk kinds are therefore encoded column by column, never as one
# struct per event: each value's text is msgspec's (numbers: a whole column encoded at once, then
# cut at the commas; strings: quoted as msgspec quotes them) and the fields are joined in the
# struct's declared order, tag first. That is ``encode_lifecycle`` of each event, byte for byte
# (tests/processors/sleep/test_job_columns.py compares them on generated runs).

_ENCODER = msgspec.json.Encoder()
ENCODE_CHUNK = 1 << 18  # rows encoded at once (an Arrow string array holds < 2 GiB)
_COMMA = ord(",")
_NEEDS_ESCAPE = r'[\x00-\x1f"\\]'  # what msgspec escapes in a string; anything else is copied as is


def json_text(value: Any) -> str:
    return _ENCODER.encode(value).decode()


def json_numbers(values: Sequence[Any]) -> pa.Array:
    """msgspec's JSON text of each number (int or float; None: null).

    >>> json_numbers([1, 0.5, None, 1e-7, 2.0]).to_pylist()
    ['1', '0.5', 'null', '1e-7', '2.0']
    """
    n = len(values)
    if n == 0:
        return pa.array([], pa.string())
    inner = np.frombuffer(_ENCODER.encode(values), dtype=np.uint8)[1:-1]
    comma = inner == _COMMA
    at = np.flatnonzero(comma)
    if len(at) != n - 1:
        raise ValueError(f"{n} values are not {len(at) + 1} JSON numbers")
    data = inner[~comma]
    offsets = np.concatenate(([0], at - np.arange(n - 1), [len(data)]))
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)])


def json_ints(values: np.ndarray | Sequence[int]) -> pa.Array:
    """msgspec's JSON text of each integer (a decimal: what Arrow's cast to string writes).

    >>> json_ints(np.array([0, -12, 2**63 - 1])).to_pylist()
    ['0', '-12', '9223372036854775807']
    """
    return pa.array(np.asarray(values, dtype=np.int64)).cast(pa.string())


def json_strings(values: pa.Array | pa.ChunkedArray, *, repeated: bool = False) -> pa.Array:
    """msgspec's JSON text of each string (no nulls): quoted, escaped where needed. ``repeated``:
    the texts of the distinct values are made once.

    >>> json_strings(pa.array(["a", 'b"c'])).to_pylist() == ['"a"', '"b\\\\"c"']
    True
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    values = values.cast(pa.string())
    if values.null_count:
        raise ValueError("JSON strings of a column with nulls")
    if repeated:  # few distinct values (agents, keys): quote each once
        codes = pc.dictionary_encode(values)
        return json_strings(codes.dictionary).take(codes.indices)
    quoted = pc.binary_join_element_wise('"', values, '"', "")
    escape = pc.match_substring_regex(values, _NEEDS_ESCAPE)
    if pc.any(escape).as_py():
        rows = np.flatnonzero(escape.to_numpy(zero_copy_only=False))
        fixed = [json_text(s) for s in values.take(pa.array(rows)).to_pylist()]
        quoted = pc.replace_with_mask(quoted, escape, pa.array(fixed, quoted.type))
    return quoted


def json_seconds(seconds: np.ndarray) -> pa.Array | None:
    """msgspec's JSON text of each whole-second UTC datetime ``from_us(s * 10**6)`` (a fixed 22 bytes,
    digits written column-wise); None when one is outside what ``datetime`` holds (the caller then
    builds them one by one, and fails as they do).

    >>> json_seconds(np.array([0, 86_399])).to_pylist()
    ['"1970-01-01T00:00:00Z"', '"1970-01-01T23:59:59Z"']
    """
    s = np.asarray(seconds, dtype=np.int64)
    if len(s) and (s.min() < MIN_SECONDS or s.max() > MAX_SECONDS):
        return None
    t = s.astype("datetime64[s]")
    day = t.astype("datetime64[D]")
    month = t.astype("datetime64[M]")
    of_day = s - day.astype("datetime64[s]").astype(np.int64)
    out = np.empty((len(s), len(_SECONDS_TEMPLATE)), dtype=np.uint8)
    out[:] = np.frombuffer(_SECONDS_TEMPLATE, dtype=np.uint8)
    for at, value, width in (
        (1, t.astype("datetime64[Y]").astype(np.int64) + 1970, 4),
        (6, month.astype(np.int64) % 12 + 1, 2),
        (9, (day - month.astype("datetime64[D]")).astype(np.int64) + 1, 2),
        (12, of_day // 3600, 2),
        (15, of_day // 60 % 60, 2),
        (18, of_day % 60, 2),
    ):
        for k in range(width):
            out[:, at + width - 1 - k] = 48 + value // 10**k % 10
    offsets = np.arange(0, out.size + 1, out.shape[1], dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), len(s), [None, pa.py_buffer(offsets), pa.py_buffer(out.ravel())])


_SECONDS_TEMPLATE = b'"0000-00-00T00:00:00Z"'
MIN_SECONDS = -62_135_596_800  # 0001-01-01T00:00:00Z
MAX_SECONDS = 253_402_300_799  # 9999-12-31T23:59:59Z


def struct_rows(cls: type[msgspec.Struct], fields: Mapping[str, str | pa.Array]) -> pa.Array:
    """One JSON object per row as msgspec encodes ``cls`` (tag first, then the fields in declared
    order): ``fields`` holds each field's JSON text, one for every row (str) or one per row (array)."""
    config = cls.__struct_config__
    if config.omit_defaults or set(fields) != set(cls.__struct_fields__):
        raise ValueError(f"{cls.__name__}: texts of every field needed (and no omitted defaults)")
    parts: list[Any] = []
    text = "{"
    sep = ""
    if config.tag_field is not None:
        text += f"{json_text(config.tag_field)}:{json_text(config.tag)}"
        sep = ","
    for name, wire in zip(cls.__struct_fields__, cls.__struct_encode_fields__, strict=True):
        text += f"{sep}{json_text(wire)}:"
        sep = ","
        value = fields[name]
        if isinstance(value, str):
            text += value
        else:
            parts += [text, value]
            text = ""
    parts.append(text + "}")
    return pc.binary_join_element_wise(*parts, "")


class Segment:
    """A run of decisions of one kind: rows plus how to build the event of a row at a seq, and
    optionally how to encode rows ``[lo, hi)`` at once from ``seq`` on: ``(event type, memory ids,
    JSON bodies)``, what building and encoding each event gives."""

    def __init__(
        self,
        rows: Sequence[Any],
        build: Callable[[Any, int], RunEvent],
        encode: Callable[[int, int, int], tuple[type, pa.Array, pa.Array]] | None = None,
    ) -> None:
        self.rows = rows
        self.build = build
        self.encode = encode

    def __len__(self) -> int:
        return len(self.rows)


class EncodedEvents(NamedTuple):
    """A run's events as columns (``SleepPlan.encoded``), one row per event in seq order: what
    ``type(ev).__name__``, ``getattr(ev, "memory_id", None)`` and ``encode_lifecycle(ev)`` give.
    Every event of a run has the plan's ``run_id`` and ``at``."""

    seq: pa.Array  # int64
    kind: pa.Array  # string: the event's type name
    memory_id: pa.Array  # string, null where the event names no memory
    body: pa.ChunkedArray  # string: the event's canonical JSON


class Compacts:
    """The compact forms of one pass: built per event (``get``) or all at once as JSON texts
    (``texts``, for ``SleepPlan.encoded``); their sizes for the report."""

    def __init__(self, rows: list[int], build: Callable[[int], CompactMemory], columns: Callable[[], pa.Array]) -> None:
        self.rows = rows
        self.build = build
        self.columns = columns
        self.sizes: dict[int, int] = {}
        self._texts: pa.Array | None = None

    def get(self, row: int) -> CompactMemory:
        compact = self.build(row)
        self.sizes[row] = compact_size(compact)
        return compact

    def texts(self) -> pa.Array:
        """``encode(compact)`` of every row, in the rows' order."""
        if self._texts is None:
            self._texts = self.columns()
        return self._texts

    def total(self) -> int:
        if self._texts is not None:
            return int(pc.sum(pc.binary_length(self._texts)).as_py() or 0)
        return sum(self.sizes[r] if r in self.sizes else compact_size(self.build(r)) for r in self.rows)


class RowTexts:
    """JSON texts the columnar encoders of one run share, each made once, on first use."""

    def __init__(self, c: Columns, run_id: str, now: datetime) -> None:
        self.c = c
        self.run_id = json_text(run_id)
        self.at = json_text(now)
        self._ids: pa.Array | None = None
        self._id_texts: pa.Array | None = None
        self._agent_texts: pa.Array | None = None
        self._layer_texts: pa.Array | None = None

    @property
    def ids(self) -> pa.Array:
        if self._ids is None:
            self._ids = self.c.ids.to_arrow().cast(pa.string())
        return self._ids

    @property
    def id_texts(self) -> pa.Array:
        if self._id_texts is None:
            self._id_texts = json_strings(self.ids)
        return self._id_texts

    def agents(self, rows: np.ndarray) -> pa.Array:
        if self._agent_texts is None:
            self._agent_texts = json_strings(self.c.frame["agent"].to_arrow(), repeated=True)
        return self._agent_texts.take(pa.array(rows))

    def layers(self, rows: np.ndarray) -> pa.Array:
        if self._layer_texts is None:
            self._layer_texts = json_strings(pa.array(self.c.layer_names, pa.string()))
        return self._layer_texts.take(pa.array(self.c.layer_code[rows]))

    def decision(self, rows: np.ndarray, seq: int, *, layer: bool = True) -> dict[str, str | pa.Array]:
        """The fields every decision about memory ``rows`` has (from ``seq`` on)."""
        fields: dict[str, str | pa.Array] = {
            "run_id": self.run_id,
            "seq": json_ints(np.arange(seq, seq + len(rows))),
            "at": self.at,
            "memory_id": self.id_texts.take(pa.array(rows)),
            "agent": self.agents(rows),
        }
        if layer:
            fields["layer"] = self.layers(rows)
        return fields

    def columnar(
        self, cls: type[msgspec.Struct], rows: np.ndarray, fields: Callable[[np.ndarray, int, int], dict[str, Any]]
    ) -> Callable[[int, int, int], tuple[type, pa.Array, pa.Array]]:
        """A segment's encoder: events of ``cls`` about memory ``rows``; ``fields(rows, lo, hi)`` gives
        the texts of the fields beyond ``decision``'s for positions ``[lo, hi)``."""

        def encode(lo: int, hi: int, seq: int) -> tuple[type, pa.Array, pa.Array]:
            part = rows[lo:hi]
            texts = {**self.decision(part, seq, layer="layer" in cls.__struct_fields__), **fields(part, lo, hi)}
            return cls, self.ids.take(pa.array(part)), struct_rows(cls, texts)

        return encode


_COMPACT_WIRE = dict(zip(CompactMemory.__struct_fields__, CompactMemory.__struct_encode_fields__, strict=True))


def compact_texts(
    c: Columns,
    rows: np.ndarray,
    access_us: np.ndarray,
    snapshot: np.ndarray,
    id_texts: pa.Array,
    build: Callable[[int], CompactMemory],
) -> pa.Array:
    """``encode(compact_memory(...))`` of each of ``rows`` (the arguments ``_decision_segments`` passes),
    column by column: fields in declared order, defaults omitted, keys while they fit. ``build(row)``
    makes the rare ones another way (an id too long for the bound: its digest)."""
    wire = {name: json_text(w) for name, w in _COMPACT_WIRE.items()}
    m = len(rows)
    if m == 0:
        return pa.array([], pa.string())
    created = json_seconds(c.created_us[rows] // 1_000_000)
    access = json_seconds(access_us[rows] // 1_000_000)
    keys = c.frame["index_keys"].gather(rows).to_arrow()
    flat = keys.flatten()
    if created is None or access is None or flat.null_count:  # what compact_memory would fail on, as it does
        return pa.array([json_text(build(int(r))) for r in rows], pa.string())
    outcomes, which = np.unique(c.outcome[rows], return_inverse=True)
    outcome = pa.array(
        [f",{wire['outcome']}:{json_text(o[:16])}" if o[:16] else "" for o in outcomes.tolist()], pa.string()
    ).take(pa.array(which.ravel()))

    def count(name: str, values: np.ndarray) -> pa.Array:  # a count, omitted when 0 (its default)
        values = np.maximum(values, 0)
        return pc.if_else(
            pa.array(values > 0), pc.binary_join_element_wise(f",{wire[name]}:", json_ints(values), ""), ""
        )

    base = pc.binary_join_element_wise(
        "{" + wire["memory_id"] + ":",
        id_texts.take(pa.array(rows)),
        f",{wire['created_at']}:",
        created,
        f",{wire['last_access']}:",
        access,
        outcome,
        count("access_count", c.access_count[rows].astype(np.int64)),
        count("edge_count", snapshot[rows].astype(np.int64)),
        "",
    )
    size = pc.binary_length(base).to_numpy().astype(np.int64) + 1  # with its closing brace
    # Keys: cut to 40 characters, each costs its text (and a comma after the first); kept while the
    # running cost stays within what the bound leaves (costs are positive: the kept ones are a prefix).
    n_keys = pc.fill_null(pc.list_value_length(keys), 0).to_numpy().astype(np.int64)
    flat = flat.cast(pa.string())
    if len(flat) and pc.max(pc.utf8_length(flat)).as_py() > COMPACT_KEY_MAX_CHARS:  # characters, as str counts
        flat = pa.array([k[:COMPACT_KEY_MAX_CHARS] for k in flat.to_pylist()], pa.string())
    key_texts = json_strings(flat, repeated=True)
    owner = np.repeat(np.arange(m), n_keys)
    starts = np.cumsum(n_keys) - n_keys
    cost = pc.binary_length(key_texts).to_numpy().astype(np.int64) + 1
    cost[starts[n_keys > 0]] -= 1
    running = np.cumsum(cost)
    running -= np.repeat(np.concatenate(([0], running))[starts], n_keys)  # from each row's first key
    budget = COMPACT_MAX_BYTES - size - len(',"k":[]')
    kept = running <= budget[owner]
    n_kept = np.bincount(owner[kept], minlength=m)
    offsets = np.concatenate(([0], np.cumsum(n_kept))).astype(np.int32)
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets), key_texts.filter(pa.array(kept))), ",")
    key_part = pc.if_else(pa.array(n_kept > 0), pc.binary_join_element_wise(f",{wire['keys']}:[", joined, "]", ""), "")
    texts = pc.binary_join_element_wise(base, key_part, "}", "")
    long = size > COMPACT_MAX_BYTES  # the id is replaced by its digest: built one by one
    if long.any():
        fixed = [json_text(build(int(r))) for r in rows[long]]
        texts = pc.replace_with_mask(texts, pa.array(long), pa.array(fixed, texts.type))
    return texts


class FrameRows(Sequence[tuple[Any, ...]]):
    """A frame's rows as tuples, made on first use (a columnar encoder never needs them)."""

    def __init__(self, frame: pl.DataFrame) -> None:
        self.frame = frame
        self._rows: list[tuple[Any, ...]] | None = None

    def _all(self) -> list[tuple[Any, ...]]:
        if self._rows is None:
            self._rows = self.frame.rows()
        return self._rows

    def __len__(self) -> int:
        return self.frame.height

    def __getitem__(self, k: Any) -> Any:
        return self._all()[k]

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self._all())
