"""processors/episodic/meaning.py: SIF-weighted mean word vectors."""

from __future__ import annotations

import numpy as np
import pytest

from somnus.processors.episodic.meaning import WordVectors

WORDS = ["the", "a", "dog", "puppy", "car"]
VECS = np.array([[1, 1, 0], [1, 0, 1], [0, 1, 0], [0, 0.9, 0.1], [0, 0, 1]], dtype=np.float32)


def test_vectors_are_unit_length_and_unknown_text_is_zero():
    out = WordVectors(WORDS, VECS).encode(["the dog", "zzz qqq", ""])
    assert out.shape == (3, 3) and out.dtype == np.float32
    assert np.linalg.norm(out[0]) == pytest.approx(1.0)
    assert not out[1].any() and not out[2].any()


def test_frequent_words_weigh_less_than_rare_ones():
    # "the" is rank 1, "car" rank 5: with a = 1 their SIF weights are a / (a + p) for p ~ 1 / rank.
    wv = WordVectors(WORDS, VECS, a=0.1)
    assert wv.weights[0] < wv.weights[4]
    v = wv.encode(["the car"])[0]
    assert v[2] > v[0]  # car's axis outweighs the's


def test_related_words_are_nearer_than_unrelated_ones_and_case_and_punctuation_do_not_matter():
    wv = WordVectors(WORDS, VECS)
    dog, puppy, car = wv.encode(["Dog!", "a PUPPY", "car"])
    assert dog @ puppy > dog @ car
    assert np.allclose(wv.encode(["dog"])[0], dog)


def test_words_and_vectors_must_match():
    with pytest.raises(ValueError):
        WordVectors(WORDS, VECS[:3])
