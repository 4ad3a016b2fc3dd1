"""The indexes of episodic memory, kept in memory by the fold. Pure: no I/O, no clock.

``MemoryIndex`` holds every stored memory and four ways to find them:

- the **multi-key index**: (key, value) -> memories, for goal, tool, object, person, success, mode,
  domain, run and kind; a lookup by any key is one dict access, never a scan;
- the **n-gram fingerprint index**: text is tokenised (lower case, punctuation dropped, stop words
  removed, identifiers such as ``book_reservation``, ``api.x.io`` or ``D1:3`` kept whole); every
  unigram, bigram and trigram becomes a 48-bit fingerprint (a word's: blake2b; an n-gram's: a
  rolling hash of its words' fingerprints), and an inverted index maps fingerprint -> (memory,
  count). Unigrams feed BM25, all three feed fingerprint Jaccard;
- **situation signatures**: a datasketch MinHash (scheme ``affine32``, 64 permutations, seed 1) over
  the memory's semantic tokens, its structural features (kind, mode, outcome, tools, consecutive
  tool pairs) and a temporal bucket (ISO week), banded as datasketch's ``MinHashLSH`` bands it
  (threshold 0.5: 14 bands of 4 rows) for "what does this resemble?" (capture's prediction error,
  associations);
- the **associative graph**: weighted, undirected edges between memories.

Everything is derived from the ordered log of memory events, so it rebuilds from the log (or from
the projected tables, in the same order) to the same state. Hot paths are numpy or dict based, with
no Python object per posting:

- postings live in sorted numpy segments (key, memory, count) plus a numpy buffer; a full
  buffer becomes a segment and segments merge like a binary counter (log N segments, each posting
  rewritten O(log N) times). The key is the 48-bit fingerprint under the memory's scope code (top
  16 bits, ``posting_keys``), so a reader gathers only the postings of its own scopes. A query does
  one ``searchsorted`` per segment for all its keys, so its cost is the length of the matching
  postings in the reader's scopes, not the size of the index;
- signatures hold the hash values datasketch's ``MinHash.update_batch`` gives (same hash, premix
  and permutations), computed vectorised from memoised per-feature hashes (for a whole capture
  batch at once) and stored as rows of one uint32 matrix;
- the LSH is ``MinHashLSH``'s banding kept in the same kind of sorted segments: each (scope, band)
  of a signature is a 64-bit key; a query gathers the memories under its keys and keeps those with
  a band really equal (checked on the signature matrix, so a key collision never adds one): the
  candidates ``MinHashLSH.query`` returns, restricted to the scopes asked;
- per-memory facts (time, scope, run, length, access count, importance, liveness) are numpy
  columns, so filters and scores over candidates are vector operations.

Removing a memory marks it dead (its postings and band keys are dropped at the next merge) and
removes its edges and its place in its run.

>>> from datetime import datetime, timezone
>>> from somnus.schemas.memory import MemoryKind, MemoryUnit
>>> t = datetime(2024, 5, 15, tzinfo=timezone.utc)
>>> idx = MemoryIndex()
>>> i = idx.add(MemoryUnit(memory_id="m1", kind=MemoryKind.EPISODE, agent="a", scope="agent:a", run_id="s1",
...                        occurred_at=t, perception="book a flight to Paris", tools=["book_reservation"]))
>>> idx.lookup("tool", "book_reservation"), tokenize("Booked HAT030 via api.x.io, didn't it?")
(['m1'], ['booked', 'hat030', 'via', 'api.x.io'])
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, chain
from typing import overload

import numpy as np
from datasketch import MinHash, MinHashLSH
from datasketch.hashfunc import sha1_hash32

from somnus.schemas.memory import MemoryKind, MemoryUnit

# ---- text ---------------------------------------------------------------------------------------

STOP_WORDS = frozenset(
    """
a about above after again against all am an and any are as at be because been before being below between
both but by can could did do does doing down during each few for from further had has have having he her
here hers herself him himself his how i if in into is it its itself just me more most my myself no nor not
now of off on once only or other our ours ourselves out over own same she should so some such than that the
their theirs them themselves then there these they this those through to too under until up very was we
were what when where which while who whom why will with would you your yours yourself yourselves
im ive id ill youre youve youd youll hes shes were weve wed well theyre theyve theyd theyll isnt arent wasnt
werent hasnt havent hadnt doesnt dont didnt wont wouldnt shant shouldnt cant cannot couldnt mustnt lets thats
whos whats heres theres whens wheres whys hows also us oh yeah hey hi wow really got get gonna like
""".split()
)

_TOKEN = re.compile(r"[a-z0-9_]+(?:[.:/@][a-z0-9_]+)*")
_POSSESSIVE = re.compile(r"['\u2019]s\b")
_APOSTROPHE = re.compile(r"['\u2019]")
_IDENTIFIER = re.compile(r"[0-9_.:/@]")

Stemmer = Callable[[str], str]


def tokenize(text: str, stem: Stemmer | None = None) -> list[str]:
    """Lower case, punctuation dropped, stop words removed; identifiers kept whole (and never stemmed).

    >>> tokenize("Caroline's LGBTQ support-group, on 8 May!")
    ['caroline', 'lgbtq', 'support', 'group', '8', 'may']
    """
    text = _APOSTROPHE.sub("", _POSSESSIVE.sub("", text.lower()))
    words = [w for w in _TOKEN.findall(text) if w not in STOP_WORDS]
    if stem is not None:
        words = [w if _IDENTIFIER.search(w) else stem(w) for w in words]
    return words


def word_normaliser(stem: Stemmer | None = None) -> Callable[[str], str | None]:
    """``tokenize``'s rule for one word (None: a stop word), memoised: a fleet's vocabulary repeats."""

    def norm(word: str) -> str | None:
        if word in STOP_WORDS:
            return None
        return word if stem is None or _IDENTIFIER.search(word) else stem(word)

    return functools.lru_cache(maxsize=1 << 18)(norm)


def _tokens(text: str, norm: Callable[[str], str | None]) -> list[str]:
    """``tokenize(text, stem)`` with ``norm = word_normaliser(stem)``."""
    text = text.lower()
    if "'" in text or "\u2019" in text:
        text = _APOSTROPHE.sub("", _POSSESSIVE.sub("", text))
    return [t for t in map(norm, _TOKEN.findall(text)) if t is not None]


@functools.lru_cache(maxsize=1 << 18)
def word_fingerprint(word: str) -> int:
    """The 48-bit fingerprint of one word (blake2b); stable across processes, memoised: words repeat."""
    return int.from_bytes(hashlib.blake2b(word.encode(), digest_size=6).digest(), "big")


# An n-gram's fingerprint is derived from its words' fingerprints, vectorised over a text: a
# polynomial rolling hash (mod 2^64) of the 48-bit word fingerprints, salted by n, multiplied by an
# odd constant and cut to its top 48 bits. Only equality matters (fingerprint Jaccard, postings):
# like a 48-bit hash of the n-gram's text, two different n-grams collide with probability ~2^-48.
_ROLL = np.uint64(0x9E3779B97F4A7C15)
_MIX = np.uint64(0xBF58476D1CE4E5B9)
_GRAM_SALT = {2: np.uint64(0x2545F4914F6CDD1D), 3: np.uint64(0x94D049BB133111EB)}
_S16 = np.uint64(16)
_S48 = np.uint64(48)
_MASK48 = np.uint64((1 << 48) - 1)
PREPARE_CHUNK = 1 << 12  # units analysed at once by ``MemoryIndex.prepare`` (at most 1 << 16)
MAX_N = 3


@overload
def _gram_array(words: np.ndarray, owner: None = None) -> tuple[np.ndarray, None]: ...
@overload
def _gram_array(words: np.ndarray, owner: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...
def _gram_array(words: np.ndarray, owner: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Fingerprints (uint64) of the bigrams, then the trigrams, of word fingerprints; with ``owner``
    (which text each word is from), only n-grams within one text, and their owners."""
    parts: list[np.ndarray] = []
    owners: list[np.ndarray] = []
    roll = words
    for n in range(2, MAX_N + 1):
        if len(words) < n:
            break
        roll = roll[:-1] * _ROLL + words[n - 1 :]  # wraps: arithmetic mod 2^64
        salted = roll + _GRAM_SALT[n]
        if owner is not None:
            same = owner[: 1 - n] == owner[n - 1 :]
            salted = salted[same]
            owners.append(owner[n - 1 :][same])
        parts.append(salted)
    if not parts:
        return np.empty(0, dtype=np.uint64), (np.empty(0, dtype=owner.dtype) if owner is not None else None)
    x = np.concatenate(parts) if len(parts) > 1 else parts[0]
    x = (x * _MIX) >> _S16
    if owner is None:
        return x, None
    return x, (np.concatenate(owners) if len(owners) > 1 else owners[0])


def _word_array(tokens: Sequence[str]) -> np.ndarray:
    return np.fromiter(map(word_fingerprint, tokens), dtype=np.uint64, count=len(tokens))


def fingerprint(gram: str) -> int:
    """The 48-bit fingerprint of one n-gram (words joined by a space; 1 to 3 words); stable across
    processes.

    >>> fingerprint("coffee") == fingerprint("coffee") and 0 <= fingerprint("kitchen table") < 2 ** 48
    True
    """
    words = gram.split(" ")
    if len(words) == 1:
        return word_fingerprint(gram)
    if len(words) > MAX_N:
        raise ValueError(f"fingerprints are defined for 1- to {MAX_N}-grams, not {gram!r}")
    return int(_gram_array(_word_array(words))[0][-1])


def ngram_fingerprints(tokens: Sequence[str], max_n: int = MAX_N) -> tuple[dict[int, int], dict[int, int]]:
    """(unigram fingerprint -> count, bigram and trigram fingerprint -> count).

    >>> uni, grams = ngram_fingerprints(["make", "coffee", "now"])
    >>> len(uni), len(grams)
    (3, 3)
    """
    if max_n != MAX_N:
        raise ValueError(f"the index fingerprints 1- to {MAX_N}-grams")
    words = _word_array(tokens)
    return dict(Counter(words.tolist())), dict(Counter(_gram_array(words)[0].tolist()))


def unit_text(unit: MemoryUnit) -> str:
    """The text a memory is found by: what it perceived, its goal, summary and lessons, and its tools."""
    parts = [unit.perception, unit.goal or "", unit.summary, " ".join(unit.lessons), " ".join(unit.tools)]
    if unit.decision and unit.kind is MemoryKind.EPISODE:
        parts.append(unit.decision)
    return " ".join(p for p in parts if p)


_KIND_VALUE = {k: k.value for k in MemoryKind}
_KIND_FEATURE = {k: f"kind:{v}" for k, v in _KIND_VALUE.items()}


def _structure(unit: MemoryUnit) -> list[str]:
    """The structural features and the temporal bucket of a situation (with repeats)."""
    iso = unit.occurred_at.isocalendar()
    out = [_KIND_FEATURE[unit.kind], f"week:{iso[0]}-{iso[1]:02d}"]
    if unit.mode:
        out.append(f"mode:{unit.mode}")
    if unit.outcome:
        out.append(f"outcome:{unit.outcome}")
    out += [f"tool:{t}" for t in unit.tools]
    if unit.action:
        calls = unit.action.split(" > ")
        out += [f"seq:{a}>{b}" for a, b in zip(calls, calls[1:])]
    return out


def situation_features(unit: MemoryUnit, tokens: Sequence[str]) -> list[str]:
    """Semantic tokens, structural features and a temporal bucket: what a situation signature hashes."""
    return sorted(set(tokens).union(_structure(unit)))


# ---- configuration ------------------------------------------------------------------------------

NUM_PERM = 64
MINHASH_SEED = 1
SIGNATURE_CHUNK = 1 << 16  # features whose permuted hashes are made at once: 16 MB (SignatureScheme.signatures)
LSH_THRESHOLD = 0.5  # = the association threshold: LSH finds what capture may link to
BUFFER_POSTINGS = 1 << 13  # postings held in the buffer before they become a sorted segment
BUFFER_BAND_KEYS = 1 << 11  # band keys held in the LSH's dict buffer before they become a sorted segment


CAPTURE_CANDIDATES = 256  # LSH candidates, the most recent, capture compares a unit with


@dataclass(frozen=True)
class IndexConfig:
    num_perm: int = NUM_PERM
    lsh_threshold: float = LSH_THRESHOLD
    buffer_postings: int = BUFFER_POSTINGS
    stem: Stemmer | None = None  # e.g. snowballstemmer's English stemWord, when the package is there
    # Capture compares a unit with at most this many of its LSH candidates, the most recent ones, so
    # its search does not grow with the memories in the scope (uncapped, it grew linearly); None: all.
    capture_candidates: int | None = CAPTURE_CANDIDATES


# ---- situation signatures -----------------------------------------------------------------------


@functools.lru_cache(maxsize=1 << 18)
def feature_hash(feature: str) -> int:
    """datasketch's input hash of one feature (``sha1_hash32`` of its UTF-8 bytes) premixed by the
    MurmurHash3 finalizer, as ``MinHash`` (scheme ``affine32``) premixes it; memoised: features repeat.

    >>> 0 <= feature_hash("kind:episode") < 2 ** 32
    True
    """
    h = sha1_hash32(feature.encode())
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


_EMPTY_HASH = 0xFFFFFFFF  # affine32's value for "no feature"
_KEY_MASK = np.uint64((1 << 63) - 1)  # band keys stay below 2^63: key + 1 never wraps (range queries)


class SignatureScheme:
    """datasketch's MinHash permutations and MinHashLSH banding for one (num_perm, threshold), and the
    (fixed-seed) constants that make a (scope, band) one 64-bit key."""

    def __init__(self, num_perm: int, threshold: float) -> None:
        template = MinHash(num_perm=num_perm, seed=MINHASH_SEED)  # generating permutations is slow: once
        if template.scheme != "affine32":
            raise RuntimeError(f"unexpected datasketch MinHash scheme {template.scheme!r}")
        self.num_perm = num_perm
        self.permutations = template.permutations
        self.a = template.permutations[0].astype(np.uint32)
        self.b = template.permutations[1].astype(np.uint32)
        lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)  # its (bands, rows): the optimal ones
        self.bands, self.rows = lsh.b, lsh.r
        if list(lsh.hashranges) != [(k * lsh.r, (k + 1) * lsh.r) for k in range(lsh.b)]:
            raise RuntimeError("unexpected MinHashLSH hash ranges")
        self.width = self.bands * self.rows
        rng = np.random.default_rng(0x5EED)  # fixed: keys must be the same in every process and replay
        self.row_mult = rng.integers(0, 1 << 63, self.rows, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        self.band_salt = rng.integers(0, 1 << 63, self.bands, dtype=np.uint64)
        self.scope_mult = int(rng.integers(0, 1 << 62, dtype=np.uint64)) * 2 + 1
        # The packed path (``match``): 64 hash values, bands of 1, 2, 4 or 8 of them (aligned groups of
        # bits that never straddle a byte of ``np.packbits``), the bands filling whole bytes.
        self._packed = num_perm == 64 and 8 % self.rows == 0 and self.width % 8 == 0
        self._folds = [np.uint64(1 << k) for k in range(self.rows.bit_length() - 1)]  # 1, 2 for r = 4
        self._band_bases = np.uint64(sum(1 << bit for bit in range(0, self.width, self.rows)) if self._packed else 0)

    def signature(self, hashes: np.ndarray) -> np.ndarray:
        """The MinHash hash values (uint32) of premixed feature hashes (``feature_hash``)."""
        if not len(hashes):
            return np.full(self.num_perm, _EMPTY_HASH, dtype=np.uint32)
        return np.minimum.reduce(hashes[:, None] * self.a + self.b, axis=0)  # uint32 wraparound: affine32

    def signatures(self, hashes: np.ndarray, starts: np.ndarray, chunk: int = SIGNATURE_CHUNK) -> np.ndarray:
        """Signatures of several feature lists, concatenated in ``hashes``, each non-empty, from ``starts``.

        The permuted hashes are a (features, num_perm) matrix: for a capture batch of 11,591 units
        (~70 features each) 200 MB at once, the projector's peak. They are made for about ``chunk``
        features at a time (whole lists: a list longer than ``chunk`` is one chunk); each signature
        is the same minimum of its own rows either way."""
        n, total = len(starts), len(hashes)
        if total <= chunk:
            return np.minimum.reduceat(hashes[:, None] * self.a + self.b, starts, axis=0)
        out = np.empty((n, self.num_perm), dtype=np.uint32)
        k = 0
        while k < n:
            lo = int(starts[k])
            j = n if total - lo <= chunk else max(k + 1, int(np.searchsorted(starts, lo + chunk, side="right")) - 1)
            hi = total if j == n else int(starts[j])
            out[k:j] = np.minimum.reduceat(hashes[lo:hi, None] * self.a + self.b, starts[k:j] - lo, axis=0)
            k = j
        return out

    def band_base(self, sigs: np.ndarray) -> np.ndarray:
        """Scope-free band keys (bands,) of a signature, or (n, bands) of n signatures."""
        lead = sigs.shape[:-1]
        bands = sigs[..., : self.width].reshape(*lead, self.bands, self.rows).astype(np.uint64)
        return ((bands @ self.row_mult) + self.band_salt) & _KEY_MASK  # wraps: a hash, not a number

    def scope_term(self, code: int) -> np.uint64:
        return np.uint64((code * self.scope_mult) & ((1 << 63) - 1))

    def match(self, rows: np.ndarray, sig: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For signature rows (n, num_perm): (how many hash values equal ``sig``'s (n,), whether some band
        is wholly equal (n,)). ``count / num_perm`` is the MinHash Jaccard estimate."""
        eq = rows == sig
        if self._packed:
            # The 64 equality flags as the bits of one integer per row: a popcount counts them, and a band
            # (an aligned group of r bits) is wholly equal where folding shifted copies leaves its base bit.
            word = np.packbits(eq, axis=1).view("<u8")[:, 0]
            full = word
            for shift in self._folds:
                full = full & (full >> shift)
            return np.bitwise_count(word), (full & self._band_bases) != 0
        count = np.add.reduce(eq, axis=1)
        bands = eq[:, : self.width].reshape(len(eq), self.bands, self.rows)
        return count, np.logical_or.reduce(np.logical_and.reduce(bands, axis=2), axis=1)

    def minhash(self, sig: np.ndarray) -> MinHash:
        """The datasketch MinHash with these hash values."""
        return MinHash(seed=MINHASH_SEED, hashvalues=sig, permutations=self.permutations, scheme="affine32")


@functools.lru_cache(maxsize=8)
def signature_scheme(num_perm: int = NUM_PERM, threshold: float = LSH_THRESHOLD) -> SignatureScheme:
    return SignatureScheme(num_perm, threshold)


# ---- growable numpy columns -----------------------------------------------------------------


class _Column:
    """A numpy array that grows by doubling (append is amortised O(1))."""

    def __init__(self, dtype: type | np.dtype, fill: float | int | bool = 0, width: int = 0) -> None:
        self.fill = fill
        self.width = width
        shape = (16, width) if width else (16,)
        self.data = np.full(shape, fill, dtype=dtype)
        self.n = 0

    def grow(self, capacity: int) -> None:
        if capacity > len(self.data):
            grown = np.full((capacity, *self.data.shape[1:]), self.fill, dtype=self.data.dtype)
            grown[: self.n] = self.data[: self.n]
            self.data = grown

    def append(self, value: object) -> None:
        if self.n == len(self.data):
            self.grow(len(self.data) * 2)
        self.data[self.n] = value
        self.n += 1

    @property
    def view(self) -> np.ndarray:
        return self.data[: self.n]


# ---- postings -----------------------------------------------------------------------------------

Segment = tuple[np.ndarray, ...]  # (keys uint64 sorted, memory index int32[, count float32])


MERGE_IN_PLACE_ROWS = 1 << 20  # a merge of at least these rows writes its output in place (``_merge``)


def _merge(a: Segment, b: Segment, alive: np.ndarray | None) -> Segment:
    # Both are sorted by (key, memory) and b's memories are all newer than a's, so a stable sort on
    # the key alone gives (key, memory) order: a linear merge of two runs. A large merge is written in
    # place instead (the same rows): sorting held the concatenation, two orders and the result at once,
    # 38 bytes a row, 300 MB for 8M rows (issue #30); in place, 20. Small ones sort: it is faster.
    if len(a[0]) + len(b[0]) >= MERGE_IN_PLACE_ROWS:
        return _merge_in_place(a, b, alive)
    cols = [np.concatenate([x, y]) for x, y in zip(a, b)]
    order = np.argsort(cols[0], kind="stable")
    if alive is not None:
        order = order[alive[cols[1][order]]]
    return tuple(c[order] for c in cols)


def _merge_in_place(a: Segment, b: Segment, alive: np.ndarray | None) -> Segment:
    """``_merge``, each live row of b put after a's live rows of its key, one output column at a time."""
    keep_a = keep_b = None
    if alive is not None:
        keep_a, keep_b = (None if k.all() else k for k in (alive[a[1]], alive[b[1]]))
    a_keys = a[0] if keep_a is None else a[0][keep_a]
    b_keys = b[0] if keep_b is None else b[0][keep_b]
    n = len(a_keys) + len(b_keys)
    at = a_keys.searchsorted(b_keys, side="right") + np.arange(len(b_keys))
    del a_keys, b_keys
    from_a = np.ones(n, dtype=bool)
    from_a[at] = False
    out = []
    for x, y in zip(a, b):
        col = np.empty(n, dtype=np.result_type(x, y))
        col[from_a] = x if keep_a is None else x[keep_a]
        col[at] = y if keep_b is None else y[keep_b]
        out.append(col)
    return tuple(out)


def _push(segments: list[Segment], seg: Segment, alive: Callable[[], np.ndarray] | None) -> None:
    """Append a segment; while the newest is at least half the one before, merge (a binary counter)."""
    segments.append(seg)
    while len(segments) > 1 and len(segments[-1][0]) * 2 >= len(segments[-2][0]):
        b = segments.pop()
        a = segments.pop()
        segments.append(_merge(a, b, alive() if alive is not None else None))


class _Buffer:
    """Appended (fingerprint, memory, count) rows in growable numpy arrays: no Python object per row."""

    def __init__(self, capacity: int) -> None:
        self.keys = np.empty(capacity, dtype=np.uint64)
        self.idx = np.empty(capacity, dtype=np.int32)
        self.tf = np.empty(capacity, dtype=np.float32)
        self.n = 0

    def append(self, keys: np.ndarray, idx: int, tf: np.ndarray) -> int:
        start = self.n
        end = start + len(keys)
        if end > len(self.keys):
            cap = max(end, 2 * len(self.keys))
            for name in ("keys", "idx", "tf"):
                old = getattr(self, name)
                new = np.empty(cap, dtype=old.dtype)
                new[:start] = old[:start]
                setattr(self, name, new)
        self.keys[start:end] = keys
        self.idx[start:end] = idx
        self.tf[start:end] = tf
        self.n = end
        return end

    def sorted(self) -> Segment:
        """The rows by (fingerprint, insertion = memory order), as a new segment."""
        n = self.n
        order = np.argsort(self.keys[:n], kind="stable")
        return self.keys[:n][order], self.idx[:n][order], self.tf[:n][order]


SCOPE_BUCKETS = 1 << 16  # scope codes above the top bucket share it (the reader's scope filter still applies)


def posting_keys(fps: np.ndarray, scope_codes: np.ndarray | int) -> np.ndarray:
    """Posting keys: each 48-bit fingerprint under each scope code (its top 16 bits); for an array of
    codes, every (code, fingerprint) pair, code-major (``len(fps)`` keys per code).

    >>> [hex(int(k)) for k in posting_keys(np.array([5], dtype=np.uint64), np.array([1, 2]))]
    ['0x1000000000005', '0x2000000000005']
    """
    codes = np.minimum(np.atleast_1d(np.asarray(scope_codes, dtype=np.int64)), SCOPE_BUCKETS - 1).astype(np.uint64)
    return ((codes[:, None] << _S48) | (fps.astype(np.uint64) & _MASK48)[None, :]).ravel()


class Postings:
    """Inverted index fingerprint -> (memory index, count), as sorted numpy segments plus a numpy buffer.

    A read sorts the buffer once and keeps that view until the next write."""

    def __init__(self, buffer_postings: int = BUFFER_POSTINGS, alive: Callable[[], np.ndarray] | None = None) -> None:
        self.buffer_postings = buffer_postings
        self.alive = alive  # liveness per memory index: merges drop the postings of dead memories
        self.segments: list[Segment] = []  # (fps uint64, idx int32, tf f32)
        self._buffer = _Buffer(max(16, min(buffer_postings, 1 << 10)))
        self._sorted: Segment | None = None  # the buffer sorted, until the next write

    @property
    def buffered(self) -> int:
        return self._buffer.n

    def add(self, idx: int, counts: dict[int, int]) -> None:
        n = len(counts)
        self.add_arrays(
            idx, np.fromiter(counts, dtype=np.uint64, count=n), np.fromiter(counts.values(), dtype=np.float32, count=n)
        )

    def add_arrays(self, idx: int, fps: np.ndarray, tf: np.ndarray) -> None:
        """The postings of memory ``idx`` (newer than every memory added before): distinct ``fps``."""
        self._sorted = None
        if self._buffer.append(fps, idx, tf) >= self.buffer_postings:
            self.flush()

    def _buffer_view(self) -> Segment | None:
        if not self._buffer.n:
            return None
        if self._sorted is None:
            self._sorted = self._buffer.sorted()
        return self._sorted

    def flush(self) -> None:
        view = self._buffer_view()
        if view is None:
            return
        self._buffer.n = 0
        self._sorted = None
        _push(self.segments, view, self.alive)

    def _all(self) -> list[Segment]:
        view = self._buffer_view()
        return self.segments if view is None else [*self.segments, view]

    def gather(self, fps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Postings of ``fps`` (uint64): (position in ``fps``, memory index, count) arrays."""
        pos_parts: list[np.ndarray] = []
        idx_parts: list[np.ndarray] = []
        tf_parts: list[np.ndarray] = []
        for seg_fps, seg_idx, seg_tf in self._all():
            lo = seg_fps.searchsorted(fps, side="left")
            hi = seg_fps.searchsorted(fps, side="right")
            lengths = hi - lo
            total = int(lengths.sum())
            if not total:
                continue
            # Indices of all matching postings without a Python loop over query terms.
            starts = np.repeat(lo - np.cumsum(lengths) + lengths, lengths)
            take = starts + np.arange(total)
            pos_parts.append(np.repeat(np.arange(len(fps), dtype=np.int32), lengths))
            idx_parts.append(seg_idx[take])
            tf_parts.append(seg_tf[take])
        if not pos_parts:
            empty = np.empty(0, dtype=np.int32)
            return empty, empty, np.empty(0, dtype=np.float32)
        if len(pos_parts) == 1:
            return pos_parts[0], idx_parts[0], tf_parts[0]
        return np.concatenate(pos_parts), np.concatenate(idx_parts), np.concatenate(tf_parts)

    def document_frequency(self, fps: np.ndarray) -> np.ndarray:
        """How many postings each fingerprint has (dead memories included until their segment merges)."""
        df = np.zeros(len(fps), dtype=np.int64)
        for seg in self._all():
            df += seg[0].searchsorted(fps, side="right") - seg[0].searchsorted(fps, side="left")
        return df

    def __len__(self) -> int:
        return sum(len(s[0]) for s in self.segments) + self._buffer.n


_ONE = np.uint64(1)


class BandIndex:
    """The LSH's buckets: band key (< 2^63) -> memory indices, as sorted numpy segments plus a small dict
    buffer (capture reads it right after every add: a dict answers without sorting or scanning)."""

    def __init__(self, buffer_keys: int = BUFFER_BAND_KEYS, alive: Callable[[], np.ndarray] | None = None) -> None:
        self.buffer_keys = buffer_keys
        self.alive = alive
        self.segments: list[Segment] = []  # (keys uint64, idx int32)
        self.buffer: dict[int, list[int]] = {}
        self.buffered = 0

    def add(self, idx: int, keys: np.ndarray) -> None:
        buf = self.buffer
        for k in keys.tolist():
            hit = buf.get(k)
            if hit is None:
                buf[k] = [idx]
            else:
                hit.append(idx)
        self.buffered += len(keys)
        if self.buffered >= self.buffer_keys:
            self.flush()

    def flush(self) -> None:
        if not self.buffer:
            return
        keys = sorted(self.buffer)
        lengths = [len(self.buffer[k]) for k in keys]  # each list in memory (insertion) order
        seg = (
            np.repeat(np.array(keys, dtype=np.uint64), lengths),
            np.fromiter(chain.from_iterable(self.buffer[k] for k in keys), dtype=np.int32, count=self.buffered),
        )
        self.buffer, self.buffered = {}, 0
        _push(self.segments, seg, self.alive)

    def members(
        self, keys: np.ndarray, newest: int | None = None, valid: Callable[[np.ndarray], np.ndarray] | None = None
    ) -> np.ndarray:
        """Memory indices under ``keys`` (unsorted, with repeats; dead ones until their segment merges).

        With ``newest`` and ``valid`` (which memories count), only enough of them to hold the ``newest``
        highest valid ones (all of them if fewer), whatever the segments' layout: in each source (the
        buffer, each segment) a key's run holds each of its memories once, in ascending order, so only
        the run's shortest tail with ``newest`` valid ones (or all of it) can hold any of them; and once
        a key's run in one source has ``newest`` valid ones, the older sources need no reading. A tail
        is cut at ``newest`` members, and all of them re-read with tails widened when some are not
        valid (dead ones stay until a merge drops them)."""
        m = len(keys)
        cut = (1 << 62) if newest is None else newest
        parts: list[np.ndarray] = []
        full = False  # some key's run in a source read had ``newest`` members or more: it was cut
        if self.buffer:  # the newest source: each key's list cut to its tail, one array of them all
            get = self.buffer.get
            tails: list[list[int]] = []
            for k in keys.tolist():
                run_list = get(k)
                if run_list:
                    if len(run_list) >= cut:
                        run_list, full = run_list[-cut:], True
                    tails.append(run_list)
            if tails:
                parts.append(np.fromiter(chain.from_iterable(tails), dtype=np.int32, count=sum(map(len, tails))))
        for run, at in () if full else self._segment_sources(keys):  # newest first, after the buffer
            for j in range(m):
                a, b = at[j], at[m + j]
                if b > a:
                    if b - a >= cut:
                        a, full = b - cut, True
                    parts.append(run[a:b])
            # One key's run holds each memory once, and the older sources' are all older: once it has
            # ``newest`` (valid, checked below), none of theirs can be among the newest.
            if full:
                break
        if not parts:
            return np.empty(0, dtype=np.int32)
        got = np.concatenate(parts) if len(parts) > 1 else parts[0].copy()
        if not full or valid is None or valid(got).all():  # nothing cut: every member is here
            return got
        return np.concatenate([_tails(run, at, m, cut, valid) for run, at in self._sources(keys)])

    def drop_dead(self) -> None:
        """Drop the dead memories' keys now instead of at their segments' next merge (after a sleep's
        prunings): a bounded search (``members`` with ``newest``) then meets no dead ones to read past."""
        if self.alive is None:
            return
        alive = self.alive()
        kept: list[Segment] = []
        for seg in self.segments:
            keep = alive[seg[1]]
            if keep.all():
                kept.append(seg)
            elif keep.any():
                kept.append(tuple(c[keep] for c in seg))
        self.segments = kept
        if self.buffer:
            runs = ((k, [i for i in run if alive[i]]) for k, run in self.buffer.items())
            self.buffer = {k: run for k, run in runs if run}
            self.buffered = sum(map(len, self.buffer.values()))

    def _sources(self, keys: np.ndarray) -> Iterator[tuple[np.ndarray, list[int]]]:
        """Newest first (the buffer, then the segments from the last), each source's members as one
        array, and where each key's run in it begins (the first len(keys)) and ends (the next len(keys))."""
        if self.buffer:
            get = self.buffer.get
            runs = [get(k, ()) for k in keys.tolist()]
            lens = list(map(len, runs))
            if any(lens):
                ends = list(accumulate(lens))
                yield (
                    np.fromiter(chain.from_iterable(runs), dtype=np.int32, count=ends[-1]),
                    [e - n for e, n in zip(ends, lens)] + ends,
                )
        yield from self._segment_sources(keys)

    def _segment_sources(self, keys: np.ndarray) -> Iterator[tuple[np.ndarray, list[int]]]:
        """``_sources`` of the segments alone (newest first)."""
        if self.segments:
            bounds = np.concatenate((keys, keys + _ONE))  # [first, end) of each key: one search per segment
            for seg_keys, seg_idx in reversed(self.segments):
                yield seg_idx, seg_keys.searchsorted(bounds).tolist()

    def __len__(self) -> int:
        return sum(len(s[0]) for s in self.segments) + self.buffered


def _tails(
    run: np.ndarray, at: list[int], m: int, newest: int, valid: Callable[[np.ndarray], np.ndarray]
) -> np.ndarray:
    """The members of ``run[at[j]:at[m + j]]`` for the m slices, but of each slice (ascending, each
    memory once) only its shortest tail with ``newest`` members ``valid`` accepts (all of it if fewer):
    a tail short of valid members widens by what it lacks until it has them or the whole slice."""
    first, end = at[:m], at[m:]
    start = [max(a, b - newest) for a, b in zip(first, end)]
    for j in range(m):
        while start[j] > first[j]:
            short = newest - int(np.count_nonzero(valid(run[start[j] : end[j]])))
            if short <= 0:
                break
            start[j] = max(first[j], start[j] - short)
    parts = [run[s:b] for s, b in zip(start, end) if b > s]
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int32)


# ---- the index ------------------------------------------------------------------------------


class _Analysis:
    """What indexing needs of a unit, computed once: by ``prepare`` (a capture batch, vectorised) or
    by ``similar``, and reused by ``add``."""

    __slots__ = ("unit", "doc_len", "fp_count", "fps", "tf", "sig", "band_base")

    def __init__(
        self,
        unit: MemoryUnit,
        doc_len: int,
        fp_count: int,
        fps: np.ndarray,
        tf: np.ndarray,
        sig: np.ndarray,
        band_base: np.ndarray,
    ) -> None:
        self.unit = unit
        self.doc_len = doc_len  # unigram count
        self.fp_count = fp_count  # distinct fingerprints
        self.fps = fps  # distinct fingerprints (uint64) and their counts (float32)
        self.tf = tf
        self.sig = sig  # MinHash hash values (uint32)
        self.band_base = band_base  # scope-free band keys (uint64)


_NO_HITS = (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64))
# LSH candidates (a memory comes once per band it shares) are deduplicated with a bitmap over their
# span (lowest to highest index) when there are at least 1/RATIO as many as the span holds, else
# sorted: on the sample fleet's near-duplicates a query drew thousands, and sorting them was a third
# of the capture search.
BITMAP_DEDUPE_RATIO = 32
# ``_similar`` with ``top``: up to this many banded candidates are sorted whole, more are selected
# (``np.partition``) before the sort. The same result either way.
TOP_BY_SORT = 1024


class MemoryIndex:
    """Every stored memory of the fleet and its indexes (see the module docstring)."""

    MULTI_KEYS = ("goal", "tool", "object", "person", "success", "mode", "domain", "run", "kind", "agent")

    def __init__(
        self, config: IndexConfig | None = None, embed: Callable[[Sequence[str]], np.ndarray] | None = None
    ) -> None:
        self.config = config or IndexConfig()
        self.embed = embed
        self.scheme = signature_scheme(self.config.num_perm, self.config.lsh_threshold)
        self._norm = word_normaliser(self.config.stem)
        self.ids: list[str] = []
        self.pos: dict[str, int] = {}
        self.units: list[MemoryUnit] = []
        self.refs: list[list[str]] = []  # the unit's refs, then those of units merged into it
        self.merged: list[int] = []  # how many units were merged into each memory
        self.occurred = _Column(np.float64)  # event time, seconds since the epoch
        self.scope_code = _Column(np.int32)
        self.user_code = _Column(np.int32)  # 0: the memory belongs to no user; else users[user_id]
        self.users: dict[str, int] = {}
        self.run_code = _Column(np.int32)
        self.alive = _Column(np.bool_, False)
        self.compressed = _Column(np.bool_, False)
        self.doc_len = _Column(np.float32)  # unigram count: BM25's document length
        self.fp_count = _Column(np.int32)  # distinct fingerprints: fingerprint Jaccard's |D|
        self.importance = _Column(np.float32)
        self.access_count = _Column(np.int32)
        self.last_access = _Column(np.float64)  # 0: never
        self.long_term = _Column(np.bool_, False)
        self.prev = _Column(np.int32, -1)  # the run's previous memory (by position), -1 if none
        self.next = _Column(np.int32, -1)
        self.signatures = _Column(np.uint32, 0, width=self.config.num_perm)
        self.live_scope = _Column(np.int32, -1)  # the scope code while alive, -1 once removed (LSH filter)
        self._row_dtype = np.dtype((np.void, 4 * self.config.num_perm))  # one signature as one item
        # One row per memory in each; they grow together and add writes a row in place.
        self._rows = (
            self.occurred,
            self.scope_code,
            self.user_code,
            self.run_code,
            self.alive,
            self.compressed,
            self.doc_len,
            self.fp_count,
            self.importance,
            self.access_count,
            self.last_access,
            self.long_term,
            self.prev,
            self.next,
            self.signatures,
            self.live_scope,
        )
        self.vectors: _Column | None = None
        self.scopes: dict[str, int] = {}
        self._scope_terms: list[np.uint64] = []  # per scope code: what it adds to a band key
        self.runs: dict[str, int] = {}
        self.run_members: list[list[tuple[int, int]]] = []  # per run: sorted (position, memory index)
        self.run_len = _Column(np.float64)  # per run: total unigram count of its live memories
        self.run_live = _Column(np.int64)  # per run: live memories
        # Per scope: live memories, their unigram count, runs with a live memory. BM25 statistics
        # are taken over the scopes a reader may read, so other agents' memories never sway a ranking.
        self.scope_live = _Column(np.int64)
        self.scope_len = _Column(np.float64)
        self.scope_runs = _Column(np.int64)
        self.keys: dict[tuple[str, str], list[int]] = {}
        self.people: dict[str, set[str]] = {}  # a name's first token -> full normalised names (query matching)
        self.postings = Postings(self.config.buffer_postings, alive=self._alive_data)
        self.bands = BandIndex(alive=self._alive_data)  # the LSH: (scope, band) key -> memories
        self.graph: dict[int, dict[int, float]] = {}
        self.live = 0
        self.live_len = 0.0
        # Analyses kept for add: the last unit analysed, and those of a prepared batch (by identity:
        # units are frozen; each entry holds its unit, so an id cannot be reused while it is kept).
        self._analysed: _Analysis | None = None
        self._prepared: dict[int, _Analysis] = {}

    def _alive_data(self) -> np.ndarray:
        return self.alive.data

    # -- analysis

    def tokenize(self, text: str) -> list[str]:
        """``tokenize(text, config.stem)``, with this index's memoised word rule."""
        return _tokens(text, self._norm)

    def _analyse(self, unit: MemoryUnit) -> _Analysis:
        """Tokens, fingerprints, signature and band keys of a unit (kept: see ``_analysed``)."""
        done = self._analysed
        if done is not None and done.unit is unit:
            return done
        done = self._prepared.get(id(unit))
        if done is not None and done.unit is unit:
            self._analysed = done
            return done
        tokens = _tokens(unit_text(unit), self._norm)
        words = _word_array(tokens)
        grams = _gram_array(words)[0]
        counts = Counter((np.concatenate((words, grams)) if len(grams) else words).tolist())
        n = len(counts)
        sig = self.scheme.signature(
            np.fromiter(map(feature_hash, set(chain(tokens, _structure(unit)))), dtype=np.uint32)
        )
        done = self._analysed = _Analysis(
            unit,
            len(tokens),
            n,
            np.fromiter(counts, dtype=np.uint64, count=n),
            np.fromiter(counts.values(), dtype=np.float32, count=n),
            sig,
            self.scheme.band_base(sig),
        )
        return done

    def prepared(self, units: Sequence[MemoryUnit]) -> bool:
        """Whether every one of ``units`` is analysed ahead, by a ``prepare`` of a larger batch."""
        return all((an := self._prepared.get(id(u))) is not None and an.unit is u for u in units)

    def prepare(self, units: Sequence[MemoryUnit]) -> None:
        """Analyse ``units`` ahead, vectorised over all of them (capture prepares its batch); ``similar``
        and ``add`` of one of these objects then reuse its analysis. ``prepare(())`` forgets them."""
        self._prepared = {}
        # In chunks: the unit's number is kept in a fingerprint's top 16 bits, and a chunk's tokens and
        # features are its transient memory (a unit's analysis is the same in any chunk).
        for k in range(0, len(units), PREPARE_CHUNK):
            self._prepare(units[k : k + PREPARE_CHUNK])

    def _prepare(self, units: Sequence[MemoryUnit]) -> None:
        norm = self._norm
        toks = [_tokens(unit_text(u), norm) for u in units]
        lens = np.fromiter(map(len, toks), dtype=np.int64, count=len(toks))
        words = np.fromiter(map(word_fingerprint, chain.from_iterable(toks)), dtype=np.uint64, count=int(lens.sum()))
        owner = np.repeat(np.arange(len(units), dtype=np.int64), lens)
        grams, gram_owner = _gram_array(words, owner)
        # One sort of (unit << 48 | fingerprint): each unit's distinct fingerprints, with their counts.
        tagged = np.concatenate((words, grams)) | (np.concatenate((owner, gram_owner)).astype(np.uint64) << _S48)
        tagged.sort()
        if len(tagged):
            first = np.empty(len(tagged), dtype=bool)
            first[0] = True
            np.not_equal(tagged[1:], tagged[:-1], out=first[1:])
            starts = first.nonzero()[0]
            tf = np.diff(starts, append=len(tagged)).astype(np.float32)
            tagged = tagged[starts]
        else:
            tf = np.empty(0, dtype=np.float32)
        fps = tagged & _MASK48
        bounds = (tagged >> _S48).searchsorted(np.arange(len(units) + 1, dtype=np.uint64)).tolist()
        # A unit's distinct features (the min does not care for order or repeats: fewer rows).
        feats = [list(map(feature_hash, set(chain(t, _structure(u))))) for t, u in zip(toks, units)]
        flens = np.fromiter(map(len, feats), dtype=np.int64, count=len(feats))
        hashes = np.fromiter(chain.from_iterable(feats), dtype=np.uint32, count=int(flens.sum()))
        sigs = self.scheme.signatures(hashes, np.cumsum(flens) - flens)  # every unit has kind and week
        bases = self.scheme.band_base(sigs)
        prepared = self._prepared
        for k, u in enumerate(units):
            b0, b1 = bounds[k], bounds[k + 1]
            prepared[id(u)] = _Analysis(u, len(toks[k]), b1 - b0, fps[b0:b1], tf[b0:b1], sigs[k], bases[k])

    # -- building

    def add(self, unit: MemoryUnit) -> int:
        """Index a new memory; returns its dense index. The id must be new."""
        if unit.memory_id in self.pos:
            raise ValueError(f"memory {unit.memory_id} is already indexed")
        an = self._analyse(unit)
        self._analysed = None
        i = len(self.ids)
        self.ids.append(unit.memory_id)
        self.pos[unit.memory_id] = i
        self.units.append(unit)
        self.refs.append(list(unit.refs))
        self.merged.append(0)
        if i == len(self.alive.data):
            for col in self._rows:
                col.grow(2 * i)
        for col in self._rows:
            col.n = i + 1
        scope = self.scopes.get(unit.scope)
        if scope is None:
            scope = self.scopes[unit.scope] = len(self.scopes)
            self._scope_terms.append(self.scheme.scope_term(scope))
            self.scope_live.append(0)
            self.scope_len.append(0.0)
            self.scope_runs.append(0)
        run = self.runs.get(unit.run_id)
        if run is None:
            run = self.runs[unit.run_id] = len(self.runs)
            self.run_members.append([])
            self.run_len.append(0.0)
            self.run_live.append(0)
        n_tokens = an.doc_len
        # The columns not written keep their fill: not compressed, never accessed, not long-term, no
        # run neighbours (until _link_run).
        self.occurred.data[i] = unit.occurred_at.timestamp()
        self.scope_code.data[i] = scope
        self.live_scope.data[i] = scope
        if unit.user_id is not None:
            self.user_code.data[i] = self.users.setdefault(unit.user_id, len(self.users) + 1)
        self.run_code.data[i] = run
        self.alive.data[i] = True
        self.doc_len.data[i] = n_tokens
        self.fp_count.data[i] = an.fp_count
        self.importance.data[i] = unit.importance
        self.signatures.data[i] = an.sig
        self.live += 1
        self.live_len += n_tokens
        self.run_len.data[run] += n_tokens
        self.run_live.data[run] += 1
        self.scope_live.data[scope] += 1
        self.scope_len.data[scope] += n_tokens
        if self.run_live.data[run] == 1:
            self.scope_runs.data[scope] += 1
        self._link_run(i, run, unit.position)
        keys = self.keys
        for kv in self._key_values(unit):
            hits = keys.get(kv)
            if hits is None:
                keys[kv] = [i]
            else:
                hits.append(i)
        for person in unit.people:
            name = person.lower()
            words = name.split()
            self.people.setdefault(words[0] if words else name, set()).add(name)
        self.postings.add_arrays(i, posting_keys(an.fps, scope), an.tf)
        self.bands.add(i, an.band_base + self._scope_terms[scope])
        if self.embed is not None:
            vec = np.asarray(self.embed([unit_text(unit)])[0], dtype=np.float32)
            if self.vectors is None:
                self.vectors = _Column(np.float32, 0.0, width=len(vec))
            self.vectors.append(vec)
        return i

    def _key_values(self, unit: MemoryUnit) -> list[tuple[str, str]]:
        kv = [("kind", _KIND_VALUE[unit.kind]), ("run", unit.run_id), ("agent", unit.agent)]
        if unit.goal:
            kv.append(("goal", " ".join(unit.goal.lower().split())))
        if unit.success is not None:
            kv.append(("success", "true" if unit.success else "false"))
        if unit.mode:
            kv.append(("mode", unit.mode))
        if unit.tools:
            kv += [("tool", t) for t in sorted(set(unit.tools))]
        if unit.objects:
            kv += [("object", o.lower()) for o in sorted(set(unit.objects))]
        if unit.people:
            kv += [("person", p.lower()) for p in sorted(set(unit.people))]
        if unit.domains:
            kv += [("domain", d.lower()) for d in sorted(set(unit.domains))]
        return kv

    def _link_run(self, i: int, run: int, position: int) -> None:
        members = self.run_members[run]
        at = bisect.bisect_right(members, (position, i))
        members.insert(at, (position, i))
        before = members[at - 1][1] if at > 0 else -1
        after = members[at + 1][1] if at + 1 < len(members) else -1
        self.prev.data[i], self.next.data[i] = before, after
        if before >= 0:
            self.next.data[before] = i
        if after >= 0:
            self.prev.data[after] = i

    def merge_into(self, target: int, unit: MemoryUnit) -> None:
        """A near-duplicate unit joins an existing memory: its refs, not its text. Its source events
        are in its capture decision (the projection's record); the index keeps none: nothing reads them."""
        self.refs[target].extend(r for r in unit.refs if r not in self.refs[target])
        self.merged[target] += 1

    def link(self, a: int, b: int, weight: float) -> None:
        self.graph.setdefault(a, {})[b] = weight
        self.graph.setdefault(b, {})[a] = weight

    def unlink(self, a: int, b: int) -> None:
        for x, y in ((a, b), (b, a)):
            nbrs = self.graph.get(x)
            if nbrs is not None:
                nbrs.pop(y, None)
                if not nbrs:
                    del self.graph[x]

    def drop_edges(self, i: int) -> list[int]:
        """Remove every edge of memory ``i``; returns the other ends (sorted)."""
        others = sorted(self.graph.pop(i, {}))
        for j in others:
            nbrs = self.graph.get(j)
            if nbrs is not None:
                nbrs.pop(i, None)
                if not nbrs:
                    del self.graph[j]
        return others

    def drop_edges_many(self, rows: Iterable[int]) -> None:
        """``drop_edges(i)`` for each of ``rows``, batched: the same graph. Only the edges to memories
        that stay are popped one by one; the dicts of the dropped memories go whole."""
        graph = self.graph
        rows = list(dict.fromkeys(i for i in rows if i in graph))  # once each
        if not rows:
            return
        nbrs = [graph[i] for i in rows]
        degree = np.fromiter(map(len, nbrs), dtype=np.int64, count=len(rows))
        ends = np.fromiter(chain.from_iterable(nbrs), dtype=np.int64, count=int(degree.sum()))
        froms = np.repeat(np.asarray(rows, dtype=np.int64), degree)
        dropped = np.zeros(max(int(ends.max(initial=0)), max(rows)) + 1, dtype=bool)
        dropped[rows] = True
        stays = ~dropped[ends]
        for i, j in zip(froms[stays].tolist(), ends[stays].tolist()):
            others = graph.get(j)
            if others is not None:
                others.pop(i, None)
                if not others:
                    del graph[j]
        for i in rows:
            del graph[i]

    def remove(self, i: int) -> None:
        """Forget memory ``i``: dead for every read (the LSH too), out of its run and the graph."""
        if not self.alive.data[i]:
            return
        self.alive.data[i] = False
        self.live_scope.data[i] = -1
        self.live -= 1
        self.live_len -= float(self.doc_len.data[i])
        run = int(self.run_code.data[i])
        scope = int(self.scope_code.data[i])
        self.run_len.data[run] -= float(self.doc_len.data[i])
        self.run_live.data[run] -= 1
        self.scope_live.data[scope] -= 1
        self.scope_len.data[scope] -= float(self.doc_len.data[i])
        if self.run_live.data[run] == 0:
            self.scope_runs.data[scope] -= 1
        members = self.run_members[run]
        members.remove((self.units[i].position, i))
        before, after = int(self.prev.data[i]), int(self.next.data[i])
        if before >= 0:
            self.next.data[before] = after
        if after >= 0:
            self.prev.data[after] = before
        self.prev.data[i] = self.next.data[i] = -1
        self.drop_edges(i)

    def remove_many(self, rows: Sequence[int]) -> None:
        """``remove(i)`` for each of ``rows`` in order, batched (a sleep forgets a million at once): the
        same state, counters included (the per-run and per-scope sums are applied in that order)."""
        idx = np.asarray(rows, dtype=np.int64)
        if not len(idx):
            return
        first = np.zeros(len(idx), dtype=bool)  # a row removed twice (or already dead): one removal
        first[np.unique(idx, return_index=True)[1]] = True
        idx = idx[first & self.alive.data[idx]]
        if not len(idx):
            return
        self.alive.data[idx] = False
        self.live_scope.data[idx] = -1
        self.bands.drop_dead()
        self.live -= len(idx)
        doc = self.doc_len.data[idx].astype(np.float64)
        live_len = self.live_len
        for d in doc.tolist():  # a float sum, in the order remove would take it
            live_len -= d
        self.live_len = live_len
        runs = self.run_code.data[idx].astype(np.int64)
        scopes = self.scope_code.data[idx].astype(np.int64)
        np.subtract.at(self.run_len.data, runs, doc)  # unbuffered: element by element, in order
        np.subtract.at(self.scope_len.data, scopes, doc)
        np.subtract.at(self.scope_live.data, scopes, 1)
        # A run whose live count reaches 0 takes one off the scope of the memory that emptied it: the
        # k-th removal (in order) of a run that had k live memories.
        before = self.run_live.data[runs]  # before any of these removals
        np.subtract.at(self.run_live.data, runs, 1)
        by_run = np.argsort(runs, kind="stable")
        sorted_runs = runs[by_run]
        starts = np.flatnonzero(np.r_[True, sorted_runs[1:] != sorted_runs[:-1]])
        removed = np.diff(np.r_[starts, len(idx)])
        had = before[by_run[starts]]
        empties = (had >= 1) & (had <= removed)
        np.subtract.at(self.scope_runs.data, scopes[by_run[starts[empties] + had[empties] - 1]], 1)
        units, members = self.units, self.run_members
        for i, run in zip(idx.tolist(), runs.tolist()):
            mine = members[run]
            if len(mine) == 1 and mine[0][1] == i:  # the run's only memory (remove's check, cheaper)
                mine.clear()
            else:
                mine.remove((units[i].position, i))
        prev, nxt = self.prev.data, self.next.data
        linked = idx[(prev[idx] >= 0) | (nxt[idx] >= 0)]  # only these have (or get) neighbours to mend
        for i in linked.tolist():
            before_i, after_i = int(prev[i]), int(nxt[i])
            if before_i >= 0:
                nxt[before_i] = after_i
            if after_i >= 0:
                prev[after_i] = before_i
            prev[i] = nxt[i] = -1
        self.drop_edges_many(idx.tolist())

    def record_access(self, i: int, at: float, long_term_after: int) -> None:
        self.access_count.data[i] += 1
        self.last_access.data[i] = max(float(self.last_access.data[i]), at)
        if self.access_count.data[i] >= long_term_after:
            self.long_term.data[i] = True

    # -- reading

    def __len__(self) -> int:
        return self.live

    def lookup(self, key: str, value: str) -> list[str]:
        """Live memories with ``key`` = ``value`` (multi-key index), in capture order."""
        if key not in self.MULTI_KEYS:
            raise KeyError(f"unknown key {key!r}; one of {', '.join(self.MULTI_KEYS)}")
        alive = self.alive.data
        return [self.ids[i] for i in self.keys.get((key, _norm_key(key, value)), []) if alive[i]]

    def user_mask(self, user_id: str | None) -> np.ndarray:
        """Memories a reader acting for ``user_id`` may see: those of no user, and that user's own."""
        codes = self.user_code.data[: len(self.ids)]
        mine = self.users.get(user_id) if user_id is not None else None
        return (codes == 0) | (codes == mine) if mine is not None else codes == 0

    def key_mask(self, filters: dict[str, object]) -> np.ndarray | None:
        """Boolean mask of memories matching every filter (None: no filter)."""
        mask: np.ndarray | None = None
        for key, value in sorted(filters.items()):
            values = value if isinstance(value, (list, tuple, set, frozenset)) else [value]
            m = np.zeros(len(self.ids), dtype=bool)
            for v in values:
                hits = self.keys.get((key, _norm_key(key, v)))
                if hits:
                    m[np.asarray(hits, dtype=np.int64)] = True
            mask = m if mask is None else mask & m
        return mask

    def similar(self, unit: MemoryUnit, scopes: Iterable[str] | None = None) -> list[tuple[int, float]]:
        """Live memories whose situation resembles ``unit``'s (LSH candidates, MinHash Jaccard estimate),
        most similar first (ties: older first). ``scopes``: only memories in these scopes."""
        cands, sims = self.similar_arrays(unit, scopes)
        return list(zip(cands.tolist(), sims.tolist()))

    def similar_arrays(
        self, unit: MemoryUnit, scopes: Iterable[str] | None = None, top: int | None = None, newest: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``similar`` as (memory indices, similarities) arrays, only the first ``top`` if given; the unit's
        analysis is kept for ``add``. With ``newest``, only the ``newest`` most recent LSH candidates (the
        highest indices among the live ones in ``scopes``) are compared, and only they are read: the
        search then costs the same however many memories the scopes hold."""
        an = self._analyse(unit)
        return self._similar(an.sig, an.band_base, self._codes(scopes), top, newest)

    def similar_to_signature(
        self, sig: MinHash | np.ndarray, scopes: Iterable[str] | None = None
    ) -> list[tuple[int, float]]:
        cands, sims = self.similar_signature_arrays(_hash_values(sig), scopes)
        return list(zip(cands.tolist(), sims.tolist()))

    def similar_signature_arrays(
        self, sig: np.ndarray, scopes: Iterable[str] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The LSH candidates of hash values ``sig`` (some band of ``rows`` values wholly equal) that are
        live and in ``scopes`` (None: any), with their MinHash Jaccard estimate; best first, ties older
        first: (memory indices int64, similarities float64)."""
        return self._similar(sig, self.scheme.band_base(sig), self._codes(scopes))

    def _codes(self, scopes: Iterable[str] | None) -> list[int]:
        if scopes is None:
            return list(range(len(self.scopes)))
        if isinstance(scopes, list) and len(scopes) == 1:  # capture: the unit's own scope
            code = self.scopes.get(scopes[0])
            return [] if code is None else [code]
        return sorted({self.scopes[s] for s in scopes if s in self.scopes})

    def _similar(
        self, sig: np.ndarray, base: np.ndarray, codes: list[int], top: int | None = None, newest: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        if not codes:
            return _NO_HITS
        scope_of = self.live_scope.data  # -1 once removed
        if len(codes) == 1:
            code = codes[0]
            keys = base + self._scope_terms[code]

            def valid(idx: np.ndarray) -> np.ndarray:
                return scope_of[idx] == code
        else:
            terms = np.array([self._scope_terms[c] for c in codes], dtype=np.uint64)
            keys = (base[None, :] + terms[:, None]).ravel()

            def valid(idx: np.ndarray) -> np.ndarray:
                return np.isin(scope_of[idx], codes)

        cands = self.bands.members(keys, newest, valid)
        if not len(cands):
            return _NO_HITS
        # Ascending, once each, live and in the scopes asked: a bitmap over the candidates' span when
        # they are many for it (the scope test then reads the span's slice of ``scope_of``, one
        # vector compare instead of a gather), else a sort (a bitmap over the whole index would cost
        # O(index) a query).
        lo = int(cands.min())
        span = int(cands.max()) - lo + 1
        if len(cands) * BITMAP_DEDUPE_RATIO >= span:
            mark = np.zeros(span, dtype=bool)
            mark[cands - lo] = True
            window = scope_of[lo : lo + span]
            mark &= (window == codes[0]) if len(codes) == 1 else np.isin(window, codes)
            cands = np.flatnonzero(mark)
            if newest is not None and len(cands) > newest:
                cands = cands[-newest:]  # ascending: the most recent
            cands += lo
        else:
            cands.sort()
            cands = cands[np.concatenate(([True], cands[1:] != cands[:-1]))]
            cands = cands[valid(cands)]
            if newest is not None and len(cands) > newest:
                cands = cands[-newest:]
        if not len(cands):
            return _NO_HITS
        rows = self.signatures.data.view(self._row_dtype).ravel()[cands]  # whole rows: faster than [cands, :]
        same, banded = self.scheme.match(rows.view(np.uint32).reshape(len(cands), -1), sig)
        cands, same = cands[banded], same[banded]  # banded: drops what only a key collision brought
        if top is not None and len(same) <= TOP_BY_SORT:
            # Few (capture compares at most its ``capture_candidates``): the stable sort's first ``top``
            # are the order below's, with fewer calls than a selection.
            order = (-same.astype(np.int64)).argsort(kind="stable")[:top]
            return cands[order].astype(np.int64), same[order] / self.config.num_perm
        if top is not None and len(same) > top:
            # The first ``top`` of the order below without sorting them all: every count above the
            # top-th largest, then the ties at it, older first, until there are ``top``.
            kth = np.partition(same, len(same) - top)[len(same) - top]
            above = np.flatnonzero(same > kth)
            ties = np.flatnonzero(same == kth)[: top - len(above)]
            pick = np.concatenate((above, ties))
            pick.sort()  # ascending index = ascending cand: the stable sort below keeps older first
            cands, same = cands[pick], same[pick]
        order = (-same.astype(np.int64)).argsort(kind="stable")  # cands ascend: ties stay older first
        # same / num_perm is eq.mean(axis=1) bit for bit (an integer count over a power of two).
        return cands[order].astype(np.int64), same[order] / self.config.num_perm

    def signature_of_tokens(self, tokens: Iterable[str]) -> np.ndarray:
        """The situation signature (hash values) of a free text's tokens (as a set)."""
        feats = set(tokens)
        return self.scheme.signature(np.fromiter(map(feature_hash, feats), dtype=np.uint32, count=len(feats)))

    def text_signature(self, text: str) -> np.ndarray:
        return self.signature_of_tokens(self.tokenize(text))

    def signature_of_text(self, text: str) -> MinHash:
        """The datasketch MinHash of a free text's token set."""
        return self.scheme.minhash(self.text_signature(text))


def _hash_values(sig: MinHash | np.ndarray) -> np.ndarray:
    return np.asarray(getattr(sig, "hashvalues", sig)).astype(np.uint32, copy=False)


def _norm_key(key: str, value: object) -> str:
    if key == "success":
        return "true" if value in (True, "true", "True", 1) else "false"
    text = str(value)
    if key in ("goal",):
        return " ".join(text.lower().split())
    if key in ("object", "person", "domain"):
        return text.lower()
    return text
