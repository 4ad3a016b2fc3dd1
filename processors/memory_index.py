"""The indexes of episodic memory, kept in memory by the fold. Pure: no I/O, no clock.

``MemoryIndex`` holds every stored memory and four ways to find them:

- the **multi-key index**: (key, value) -> memories, for goal, tool, object, person, success, mode,
  domain, run and kind; a lookup by any key is one dict access, never a scan;
- the **n-gram fingerprint index**: text is tokenised (lower case, punctuation dropped, stop words
  removed, identifiers such as ``book_reservation``, ``api.x.io`` or ``D1:3`` kept whole); every
  unigram, bigram and trigram becomes a 48-bit fingerprint (blake2b), and an inverted index maps
  fingerprint -> (memory, count). Unigrams feed BM25, all three feed fingerprint Jaccard;
- **situation signatures**: a datasketch MinHash over the memory's semantic tokens, its structural
  features (kind, mode, outcome, tools, consecutive tool pairs) and a temporal bucket (ISO week),
  indexed by ``MinHashLSH`` for "what does this resemble?" (capture's prediction error, associations);
- the **associative graph**: weighted, undirected edges between memories.

Everything is derived from the ordered log of memory events, so it rebuilds from the log (or from
the projected tables, in the same order) to the same state. Hot paths are numpy or dict based:

- postings live in sorted numpy segments (fingerprint, memory, count) plus a small dict buffer; a
  full buffer becomes a segment and segments merge like a binary counter (log N segments, each
  posting rewritten O(log N) times). A query does one ``searchsorted`` per segment for all its
  fingerprints, so its cost is the length of the matching postings, not the size of the index;
- per-memory facts (time, scope, run, length, access count, importance, liveness) are numpy
  columns, so filters and scores over candidates are vector operations.

Removing a memory marks it dead (its postings are dropped at the next merge) and removes its edges,
its LSH entry and its place in its run.

>>> from datetime import datetime, timezone
>>> from schemas.memory import MemoryKind, MemoryUnit
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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
from datasketch import MinHash, MinHashLSH

from schemas.memory import MemoryKind, MemoryUnit

# ---- text ---------------------------------------------------------------------------------------

STOP_WORDS = frozenset("""
a about above after again against all am an and any are as at be because been before being below between
both but by can could did do does doing down during each few for from further had has have having he her
here hers herself him himself his how i if in into is it its itself just me more most my myself no nor not
now of off on once only or other our ours ourselves out over own same she should so some such than that the
their theirs them themselves then there these they this those through to too under until up very was we
were what when where which while who whom why will with would you your yours yourself yourselves
im ive id ill youre youve youd youll hes shes were weve wed well theyre theyve theyd theyll isnt arent wasnt
werent hasnt havent hadnt doesnt dont didnt wont wouldnt shant shouldnt cant cannot couldnt mustnt lets thats
whos whats heres theres whens wheres whys hows also us oh yeah hey hi wow really got get gonna like
""".split())

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


@functools.lru_cache(maxsize=1 << 18)
def fingerprint(gram: str) -> int:
    """The 48-bit fingerprint of one n-gram (words joined by a space); stable across processes.

    >>> fingerprint("coffee") == fingerprint("coffee") and 0 <= fingerprint("coffee") < 2 ** 48
    True
    """
    return int.from_bytes(hashlib.blake2b(gram.encode(), digest_size=6).digest(), "big")


def ngram_fingerprints(tokens: Sequence[str], max_n: int = 3) -> tuple[dict[int, int], dict[int, int]]:
    """(unigram fingerprint -> count, bigram and trigram fingerprint -> count).

    >>> uni, grams = ngram_fingerprints(["make", "coffee", "now"])
    >>> len(uni), len(grams)
    (3, 3)
    """
    uni: dict[int, int] = {}
    grams: dict[int, int] = {}
    for w in tokens:
        f = fingerprint(w)
        uni[f] = uni.get(f, 0) + 1
    for n in range(2, max_n + 1):
        for i in range(len(tokens) - n + 1):
            f = fingerprint(" ".join(tokens[i:i + n]))
            grams[f] = grams.get(f, 0) + 1
    return uni, grams


def unit_text(unit: MemoryUnit) -> str:
    """The text a memory is found by: what it perceived, its goal, summary and lessons, and its tools."""
    parts = [unit.perception, unit.goal or "", unit.summary, " ".join(unit.lessons), " ".join(unit.tools)]
    if unit.decision and unit.kind is MemoryKind.EPISODE:
        parts.append(unit.decision)
    return " ".join(p for p in parts if p)


def situation_features(unit: MemoryUnit, tokens: Sequence[str]) -> list[str]:
    """Semantic tokens, structural features and a temporal bucket: what a situation signature hashes."""
    iso = unit.occurred_at.isocalendar()
    feats = set(tokens)
    feats.add(f"kind:{unit.kind.value}")
    feats.add(f"week:{iso[0]}-{iso[1]:02d}")
    if unit.mode:
        feats.add(f"mode:{unit.mode}")
    if unit.outcome:
        feats.add(f"outcome:{unit.outcome}")
    feats.update(f"tool:{t}" for t in unit.tools)
    calls = unit.action.split(" > ") if unit.action else []
    feats.update(f"seq:{a}>{b}" for a, b in zip(calls, calls[1:]))
    return sorted(feats)


# ---- configuration ------------------------------------------------------------------------------

NUM_PERM = 64
MINHASH_SEED = 1
LSH_THRESHOLD = 0.5  # = the association threshold: LSH finds what capture may link to
BUFFER_POSTINGS = 1 << 13  # postings held in the dict buffer before they become a sorted segment


@dataclass(frozen=True)
class IndexConfig:
    num_perm: int = NUM_PERM
    lsh_threshold: float = LSH_THRESHOLD
    buffer_postings: int = BUFFER_POSTINGS
    stem: Stemmer | None = None  # e.g. snowballstemmer's English stemWord, when the package is there


_TEMPLATES: dict[int, MinHash] = {}


def _minhash(features: Iterable[str], num_perm: int) -> MinHash:
    template = _TEMPLATES.get(num_perm)
    if template is None:  # generating permutations is slow: do it once per size
        template = _TEMPLATES[num_perm] = MinHash(num_perm=num_perm, seed=MINHASH_SEED)
    m = template.copy()
    m.update_batch([f.encode() for f in features])
    return m


# ---- growable numpy columns -----------------------------------------------------------------

class _Column:
    """A numpy array that grows by doubling (append is amortised O(1))."""

    def __init__(self, dtype: type | np.dtype, fill: float | int | bool = 0, width: int = 0) -> None:
        self.fill = fill
        self.width = width
        shape = (16, width) if width else (16,)
        self.data = np.full(shape, fill, dtype=dtype)
        self.n = 0

    def append(self, value: object) -> None:
        if self.n == len(self.data):
            grown = np.full((len(self.data) * 2, *self.data.shape[1:]), self.fill, dtype=self.data.dtype)
            grown[: self.n] = self.data
            self.data = grown
        self.data[self.n] = value
        self.n += 1

    @property
    def view(self) -> np.ndarray:
        return self.data[: self.n]


# ---- postings -----------------------------------------------------------------------------------

class Postings:
    """Inverted index fingerprint -> (memory index, count), as sorted numpy segments plus a dict buffer."""

    def __init__(self, buffer_postings: int = BUFFER_POSTINGS,
                 alive: Callable[[], np.ndarray] | None = None) -> None:
        self.buffer_postings = buffer_postings
        self.alive = alive  # liveness per memory index: merges drop the postings of dead memories
        self.segments: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (fps uint64, idx int32, tf f32)
        self.buffer: dict[int, tuple[list[int], list[int]]] = {}  # fingerprint -> (memory indices, counts)
        self.buffered = 0

    def add(self, idx: int, counts: dict[int, int]) -> None:
        for fp, c in counts.items():
            hit = self.buffer.get(fp)
            if hit is None:
                self.buffer[fp] = ([idx], [c])
            else:
                hit[0].append(idx)
                hit[1].append(c)
        self.buffered += len(counts)
        if self.buffered >= self.buffer_postings:
            self.flush()

    def flush(self) -> None:
        if not self.buffer:
            return
        fps = sorted(self.buffer)  # by fingerprint, then by insertion (= memory index) order
        lengths = [len(self.buffer[fp][0]) for fp in fps]
        f = np.repeat(np.array(fps, dtype=np.uint64), lengths)
        ix = np.fromiter((i for fp in fps for i in self.buffer[fp][0]), dtype=np.int32, count=self.buffered)
        tf = np.fromiter((c for fp in fps for c in self.buffer[fp][1]), dtype=np.float32, count=self.buffered)
        self.buffer, self.buffered = {}, 0
        self.segments.append((f, ix, tf))
        # Binary-counter merging: while the newest segment is at least half the one before, merge.
        while len(self.segments) > 1 and len(self.segments[-1][0]) * 2 >= len(self.segments[-2][0]):
            b = self.segments.pop()
            a = self.segments.pop()
            self.segments.append(_merge(a, b, self.alive() if self.alive is not None else None))

    def gather(self, fps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Postings of ``fps`` (uint64): (position in ``fps``, memory index, count) arrays."""
        pos_parts: list[np.ndarray] = []
        idx_parts: list[np.ndarray] = []
        tf_parts: list[np.ndarray] = []
        for seg_fps, seg_idx, seg_tf in self.segments:
            lo = np.searchsorted(seg_fps, fps, side="left")
            hi = np.searchsorted(seg_fps, fps, side="right")
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
        for p, fp in enumerate(fps.tolist()):
            hit = self.buffer.get(fp)
            if hit:
                pos_parts.append(np.full(len(hit[0]), p, dtype=np.int32))
                idx_parts.append(np.array(hit[0], dtype=np.int32))
                tf_parts.append(np.array(hit[1], dtype=np.float32))
        if not pos_parts:
            empty = np.empty(0, dtype=np.int32)
            return empty, empty, np.empty(0, dtype=np.float32)
        return np.concatenate(pos_parts), np.concatenate(idx_parts), np.concatenate(tf_parts)

    def document_frequency(self, fps: np.ndarray) -> np.ndarray:
        """How many postings each fingerprint has (dead memories included until their segment merges)."""
        df = np.zeros(len(fps), dtype=np.int64)
        for seg_fps, _, _ in self.segments:
            df += np.searchsorted(seg_fps, fps, side="right") - np.searchsorted(seg_fps, fps, side="left")
        for p, fp in enumerate(fps.tolist()):
            hit = self.buffer.get(fp)
            if hit:
                df[p] += len(hit[0])
        return df

    def __len__(self) -> int:
        return sum(len(s[0]) for s in self.segments) + self.buffered


def _merge(a: tuple[np.ndarray, np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray, np.ndarray],
           alive: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    f = np.concatenate([a[0], b[0]])
    ix = np.concatenate([a[1], b[1]])
    tf = np.concatenate([a[2], b[2]])
    # Both are sorted by (fingerprint, memory) and b's memories are all newer than a's, so a stable
    # sort on the fingerprint alone gives (fingerprint, memory) order: a linear merge of two runs.
    order = np.argsort(f, kind="stable")
    f, ix, tf = f[order], ix[order], tf[order]
    if alive is not None:
        keep = alive[ix]
        f, ix, tf = f[keep], ix[keep], tf[keep]
    return f, ix, tf


# ---- the index ------------------------------------------------------------------------------

class MemoryIndex:
    """Every stored memory of the fleet and its indexes (see the module docstring)."""

    MULTI_KEYS = ("goal", "tool", "object", "person", "success", "mode", "domain", "run", "kind", "agent")

    def __init__(self, config: IndexConfig | None = None, embed: Callable[[Sequence[str]], np.ndarray] | None = None
                 ) -> None:
        self.config = config or IndexConfig()
        self.embed = embed
        self.ids: list[str] = []
        self.pos: dict[str, int] = {}
        self.units: list[MemoryUnit] = []
        self.refs: list[list[str]] = []  # the unit's refs, then those of units merged into it
        self.sources: list[list[str]] = []  # source event ids (str), likewise
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
        self.vectors: _Column | None = None
        self.scopes: dict[str, int] = {}
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
        self.lsh = MinHashLSH(threshold=self.config.lsh_threshold, num_perm=self.config.num_perm)
        self.graph: dict[int, dict[int, float]] = {}
        self.live = 0
        self.live_len = 0.0

    def _alive_data(self) -> np.ndarray:
        return self.alive.data

    # -- building

    def add(self, unit: MemoryUnit) -> int:
        """Index a new memory; returns its dense index. The id must be new."""
        if unit.memory_id in self.pos:
            raise ValueError(f"memory {unit.memory_id} is already indexed")
        i = len(self.ids)
        self.ids.append(unit.memory_id)
        self.pos[unit.memory_id] = i
        self.units.append(unit)
        self.refs.append(list(unit.refs))
        self.sources.append([str(s) for s in unit.source_event_ids])
        self.merged.append(0)
        tokens = tokenize(unit_text(unit), self.config.stem)
        uni, grams = ngram_fingerprints(tokens)
        self.occurred.append(unit.occurred_at.timestamp())
        scope = self.scopes.get(unit.scope)
        if scope is None:
            scope = self.scopes[unit.scope] = len(self.scopes)
            self.scope_live.append(0)
            self.scope_len.append(0.0)
            self.scope_runs.append(0)
        self.scope_code.append(scope)
        self.user_code.append(0 if unit.user_id is None else self.users.setdefault(unit.user_id, len(self.users) + 1))
        run = self.runs.get(unit.run_id)
        if run is None:
            run = self.runs[unit.run_id] = len(self.runs)
            self.run_members.append([])
            self.run_len.append(0.0)
            self.run_live.append(0)
        self.run_code.append(run)
        self.alive.append(True)
        self.compressed.append(False)
        self.doc_len.append(len(tokens))
        self.fp_count.append(len(uni) + len(grams))
        self.importance.append(unit.importance)
        self.access_count.append(0)
        self.last_access.append(0.0)
        self.long_term.append(False)
        self.prev.append(-1)
        self.next.append(-1)
        self.live += 1
        self.live_len += len(tokens)
        self.run_len.data[run] += len(tokens)
        self.run_live.data[run] += 1
        self.scope_live.data[scope] += 1
        self.scope_len.data[scope] += len(tokens)
        if self.run_live.data[run] == 1:
            self.scope_runs.data[scope] += 1
        self._link_run(i, run, unit.position)
        for key, value in self._key_values(unit):
            self.keys.setdefault((key, value), []).append(i)
        for person in unit.people:
            name = person.lower()
            first = name.split()[0] if name.split() else name
            self.people.setdefault(first, set()).add(name)
        self.postings.add(i, uni | grams)
        sig = _minhash(situation_features(unit, tokens), self.config.num_perm)
        self.signatures.append(sig.hashvalues.astype(np.uint32))
        self.lsh.insert(i, sig)
        if self.embed is not None:
            vec = np.asarray(self.embed([unit_text(unit)])[0], dtype=np.float32)
            if self.vectors is None:
                self.vectors = _Column(np.float32, 0.0, width=len(vec))
            self.vectors.append(vec)
        return i

    def _key_values(self, unit: MemoryUnit) -> list[tuple[str, str]]:
        kv = [("kind", unit.kind.value), ("run", unit.run_id), ("agent", unit.agent)]
        if unit.goal:
            kv.append(("goal", " ".join(unit.goal.lower().split())))
        if unit.success is not None:
            kv.append(("success", "true" if unit.success else "false"))
        if unit.mode:
            kv.append(("mode", unit.mode))
        kv += [("tool", t) for t in sorted(set(unit.tools))]
        kv += [("object", o.lower()) for o in sorted(set(unit.objects))]
        kv += [("person", p.lower()) for p in sorted(set(unit.people))]
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
        """A near-duplicate unit joins an existing memory: its sources and refs, not its text."""
        self.refs[target].extend(r for r in unit.refs if r not in self.refs[target])
        self.sources[target].extend(str(s) for s in unit.source_event_ids if str(s) not in self.sources[target])
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

    def remove(self, i: int) -> None:
        """Forget memory ``i``: dead for every read, out of the LSH, its run and the graph."""
        if not self.alive.data[i]:
            return
        self.alive.data[i] = False
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
        self.lsh.remove(i)
        self.drop_edges(i)

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
        codes = self.user_code.data[:len(self.ids)]
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
        tokens = tokenize(unit_text(unit), self.config.stem)
        sig = _minhash(situation_features(unit, tokens), self.config.num_perm)
        return self.similar_to_signature(sig, scopes)

    def similar_to_signature(self, sig: MinHash, scopes: Iterable[str] | None = None) -> list[tuple[int, float]]:
        cands = np.array(sorted(self.lsh.query(sig)), dtype=np.int64)
        if not len(cands):
            return []
        if scopes is not None:
            codes = [self.scopes[s] for s in scopes if s in self.scopes]
            cands = cands[np.isin(self.scope_code.data[cands], codes)]
        cands = cands[self.alive.data[cands]]
        if not len(cands):
            return []
        hv = sig.hashvalues.astype(np.uint32)
        sims = (self.signatures.data[cands] == hv).mean(axis=1)
        order = np.lexsort((cands, -sims))
        return [(int(cands[k]), float(sims[k])) for k in order]

    def signature_of_text(self, text: str) -> MinHash:
        return _minhash(sorted(set(tokenize(text, self.config.stem))), self.config.num_perm)


def _norm_key(key: str, value: object) -> str:
    if key == "success":
        return "true" if value in (True, "true", "True", 1) else "false"
    text = str(value)
    if key in ("goal",):
        return " ".join(text.lower().split())
    if key in ("object", "person", "domain"):
        return text.lower()
    return text

