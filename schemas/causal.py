"""Causal links and temporal bins: what the NAc and the SCN learn from episodes.

- ``OutcomeObserved``: one tool call with a result, as the NAc sees it (an action and what came of it).
- ``CausalLinkUpdated``: one Rescorla-Wagner update of one causal link (append-only projection row).
- ``Prediction`` / ``PredictedOutcome``: what ``somnus.processors.prediction.causal_links.predict`` answers before an agent acts.
- ``ToolCount``: exact calls and errors of a tool (not an estimate).
- ``TemporalBinCounted``: a delta of the SCN's temporal index, one (agent, kind, bin) cell.

Signatures are part of the contract (they key the NAc's table and its rows), so they live here,
beside the types, and depend on nothing but the standard library (the distiller computes the
event signature of every call and stores it on ``CallSeen.signature``):

- the **event signature** of a call is a stable hash of the tool and its *normalised* arguments:
  ids, numbers, dates and times, e-mails, free text and names become placeholders, so the same kind
  of call hashes the same whatever its ids (``normalise_params`` states the rules);
- the **tool signature** is the hash of the tool alone: the tool-level link, every call of the tool;
- the **outcome signature** is the hash of a readable outcome (``ok``, ``http:429``, ``error:<class>``).

>>> a = event_signature("get_reservation_details", {"reservation_id": "JG7FMM"})
>>> a == event_signature("get_reservation_details", {"reservation_id": "LQ940Q"})
True
>>> a == event_signature("get_user_details", {"user_id": "mia_li_3668"}), len(a)
(False, 16)
>>> normalise_params({"cabin": "economy", "date": "2024-05-20", "flights": [{"n": "HAT136"}, {"n": "HAT039"}],
...                   "summary": "User Omar Rossi wants a refund", "url": "https://api.x.io/v1/a?id=3"})
{'cabin': 'economy', 'date': '<date>', 'flights': [{'n': '<id>'}], 'summary': '<text>', 'url': '<url:api.x.io>'}
"""

from __future__ import annotations

import functools
import hashlib
import re
import uuid
from datetime import datetime
from enum import Enum
from typing import Annotated, Any, NamedTuple
from urllib.parse import urlsplit

import msgspec

SIGNATURE_BYTES = 8  # 16 hex characters: 64 bits, collisions negligible below billions of signatures
# an event signature as records carry it: hex (its first 8 characters pick its partition,
# ``somnus.streams.topics.signature_partition``), so a record naming anything else is a schema error
Signature = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{8,64}$")]
MAX_DEPTH = 6  # nesting kept by normalise_params; deeper values become "<deep>"
MAX_KEYS = 64  # keys kept per object (the first in sorted order)
MAX_ITEMS = 16  # distinct normalised items kept per list
MAX_TOKEN = 32  # a lower-case word up to this length may be a category ("economy"); longer is text


class Valence(str, Enum):
    """How an outcome feels to the agent: an ok result, a transient wait, or a failure."""

    POSITIVE = "positive"  # the call returned ok
    NEUTRAL = "neutral"  # rate limited (429, "too many requests"): wait and retry, nothing was wrong
    NEGATIVE = "negative"  # any other error


class LinkLevel(str, Enum):
    """Which action a causal link is about: this kind of call, or any call of the tool."""

    CALL = "call"  # the event signature: tool + normalised arguments
    TOOL = "tool"  # the tool signature: every call of the tool (the fallback of a never-seen call)


# ---- signatures -------------------------------------------------------------------------------

_UUID = re.compile(r"^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$", re.I)
_DATETIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{1,2}:\d{2}")
_DATE = re.compile(r"^\d{4}[-/]\d{1,2}[-/]\d{1,2}$|^\d{1,2}/\d{1,2}/\d{2,4}$")
_CLOCK = re.compile(r"^\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:\s*[ap]\.?m\.?)?$", re.I)
_NUMBER = re.compile(r"^[+-]?(?:\d+(?:[.,]\d+)*|\.\d+)(?:[eE][+-]?\d+)?%?$")
_URL = re.compile(r"^[a-z][a-z0-9+.\-]*://", re.I)
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_CATEGORY = re.compile(rf"^[a-z][a-z_\-.]{{0,{MAX_TOKEN - 1}}}$")
_DIGIT = re.compile(r"\d")
_DIGITS = re.compile(r"\d+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
# keys whose values are identities, whatever they look like ("JG7FMM", "mia_li_3668", "deploy")
_ID_KEY = re.compile(
    r"(?:^|_)(?:id|ids|uuid|guid|key|token|name|names|email|user|username|login|"
    r"password|secret|phone|address|dob)$"
)
# keys holding a shell command: the program is the action ("helm"), its arguments are not
_COMMAND_KEYS = frozenset({"cmd", "command", "commands", "shell", "script", "command_line", "commandline"})


class _Key(NamedTuple):
    name: str  # snake_case, as it appears in the template ("<key>" for a key holding a digit)
    kind: int  # _PLAIN, _IDENTITY or _COMMAND


_PLAIN, _IDENTITY, _COMMAND = 0, 1, 2
_ROOT = None  # the key of the top-level value (none)


@functools.lru_cache(maxsize=4096)
def _key(raw: str) -> _Key:
    """What a key means (cached: the same keys come back on every call of a tool)."""
    snake = _CAMEL.sub("_", raw).lower()
    kind = _IDENTITY if _ID_KEY.search(snake) else _COMMAND if snake in _COMMAND_KEYS else _PLAIN
    return _Key("<key>" if (len(snake) > MAX_TOKEN or _DIGIT.search(snake)) else snake, kind)


def _program(command: str) -> str:
    for word in command.split():
        if "=" in word and not word.startswith(("/", ".")):  # FOO=1 helm ...: an environment assignment
            continue
        name = _DIGITS.sub("#", word.rsplit("/", 1)[-1].strip("'\"")[:MAX_TOKEN])  # python3 -> python#
        return f"<cmd:{name}>" if name else "<cmd>"
    return "<cmd>"


@functools.lru_cache(maxsize=65536)
def _text(value: str) -> str:
    """The placeholder (or the category) of one string under a plain key. Cached: categories, dates
    and hosts repeat; ids do not, but a miss costs only the checks below."""
    text = value.strip()
    if not text:
        return ""
    if not _DIGIT.search(text):  # the common cases first: a category word, or text
        if _CATEGORY.match(text):
            return text  # a lower-case word: a category ("economy", "one_way", "table.pricing")
        if "://" in text and _URL.match(text):
            return _url(text)
        if "@" in text and _EMAIL.match(text):
            return "<email>"
        if len(text) in (32, 36) and _UUID.match(text):
            return "<id>"
        return "<text>"
    if "://" in text and _URL.match(text):
        return _url(text)
    if "@" in text and _EMAIL.match(text):
        return "<email>"
    if _UUID.match(text):
        return "<id>"
    if _DATETIME.match(text):
        return "<time>"
    if _DATE.match(text):
        return "<date>"
    if _CLOCK.match(text):
        return "<time>"
    if _NUMBER.match(text):
        return "<n>"
    if " " not in text and len(text) <= MAX_TOKEN:
        return "<id>"  # a token holding a digit: HAT136, JG7FMM, gift_card_7815826
    return "<text>"  # free text, long tokens


def _url(text: str) -> str:
    try:
        host = urlsplit(text).hostname
    except ValueError:
        host = None
    return f"<url:{host}>" if host else "<url>"


_encode = msgspec.json.Encoder(order="sorted")


def _canonical(value: Any) -> bytes:
    """Compact JSON with sorted keys (byte-identical to json.dumps(sort_keys=True, separators=(",", ":"),
    ensure_ascii=False), ten times faster)."""
    return _encode.encode(value)


def _normalise(value: Any, kind: int, depth: int) -> Any:
    if isinstance(value, str):
        if kind == _IDENTITY:
            return "<id>"
        if kind == _COMMAND:
            return _program(value) if value.strip() else ""
        return _text(value)
    if value is None or value is True or value is False:
        return value
    if isinstance(value, (int, float)):
        return "<id>" if kind == _IDENTITY else "<n>"
    if depth >= MAX_DEPTH:
        return "<deep>"
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for raw_key in sorted(value, key=str)[:MAX_KEYS]:
            key = _key(str(raw_key))
            v = _normalise(value[raw_key], key.kind, depth + 1)
            if key.name in out:  # two keys normalised alike ("user_1", "user_2"): keep their distinct values
                prior = out[key.name] if isinstance(out[key.name], list) else [out[key.name]]
                merged = _unique([*prior, v])
                out[key.name] = merged[0] if len(merged) == 1 else merged
            else:
                out[key.name] = v
        return out
    if isinstance(value, (list, tuple)):
        return _unique([_normalise(v, kind, depth + 1) for v in value])
    return "<value>"


def _unique(items: list[Any]) -> list[Any]:
    """Distinct items in canonical order: a list's length and order do not change the call's kind."""
    if len(items) <= 1:
        return items
    seen: dict[bytes, Any] = {}
    for item in items:
        seen.setdefault(_canonical(item), item)
    if len(seen) == 1:
        return list(seen.values())
    return [seen[k] for k in sorted(seen)][:MAX_ITEMS]


def normalise_params(params: Any) -> Any:
    """The template of a call's arguments: what stays the same when the same call is made again.

    Rules, per value (``key`` is the argument's name, camelCase read as snake_case):
    - numbers become ``<n>`` (``<id>`` under an identity key); booleans and null are kept;
    - the value of an identity key (``*_id``, ``id``, ``key``, ``token``, ``name``, ``email``, ``user``,
      ``dob``, ...) becomes ``<id>``; a command key (``cmd``, ``command``, ``shell``, ``script``) keeps
      only its program, ``<cmd:helm>`` (digits as ``#``: ``<cmd:python#>``);
    - a URL keeps only its host, ``<url:api.x.io>``; e-mails, uuids, date-times, dates, clock times
      and numbers written as text become ``<email>``, ``<id>``, ``<time>``, ``<date>``, ``<time>``, ``<n>``;
    - a lower-case word of up to ``MAX_TOKEN`` characters (letters, ``_``, ``-``, ``.``) is a category
      and is kept (``economy``, ``one_way``); another single token holding a digit is ``<id>``
      (``HAT136``, ``gift_card_7815826``); anything else is ``<text>`` (sentences, names, ``JFK``);
    - objects keep their keys (sorted; a key holding a digit becomes ``<key>``); a list becomes its
      distinct normalised items in canonical order, so list length and order do not matter;
    - nesting past ``MAX_DEPTH`` is ``<deep>``; past ``MAX_KEYS`` keys or ``MAX_ITEMS`` items, the rest is cut.

    >>> normalise_params({"cmd": "FOO=1 /usr/bin/helm upgrade web ./chart", "steps": 3, "dryRun": True,
    ...                   "userId": "u-99", "q": "rate limits of the instantly api"})
    {'cmd': '<cmd:helm>', 'dry_run': True, 'q': '<text>', 'steps': '<n>', 'user_id': '<id>'}
    """
    return _normalise(params, _PLAIN, 0)


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=SIGNATURE_BYTES).hexdigest()


def event_signature(tool: str, params: Any) -> str:
    """The call-level signature: tool + normalised arguments (``normalise_params``)."""
    template = _canonical(normalise_params(params if params is not None else {}))
    return hashlib.blake2b(b"call\x1f" + tool.encode() + b"\x1f" + template, digest_size=SIGNATURE_BYTES).hexdigest()


def tool_signature(tool: str) -> str:
    """The tool-level signature: every call of ``tool`` (a different hash domain from any call's)."""
    return _digest(f"tool\x1f{tool}")


def outcome_signature(outcome: str) -> str:
    """The hash of a readable outcome.

    >>> outcome_signature("ok") == outcome_signature("ok") != outcome_signature("http:429")
    True
    """
    return _digest(f"outcome\x1f{outcome}")


# ---- records ----------------------------------------------------------------------------------


class OutcomeObserved(msgspec.Struct, frozen=True, kw_only=True):
    """One tool call with a result, from one episode: an action and what came of it.

    ``(src_partition, src_offset, index)`` are the episode's coordinates on its topic and the call's
    position in the episode: what makes a redelivered observation recognisable."""

    event_signature: Signature  # the key: the call's signature, or the tool's for level "tool"
    level: LinkLevel
    tool: str
    outcome_signature: str
    outcome: str  # "ok", "http:<status>", "error:<error class>"
    valence: Valence
    agent: str
    observed_at: datetime  # the call's event time (the episode's end when the call's time is unknown)
    context: dict[str, str] = {}  # context conditions: agent, local hour "09", weekday "mon"
    episode_id: uuid.UUID
    src_partition: int
    src_offset: int
    index: int  # the call's position in the episode's calls


class CausalLinkUpdated(msgspec.Struct, frozen=True, kw_only=True):
    """One Rescorla-Wagner update of one link (event -> outcome): ΔV = α(λ − V).

    An observation of outcome o updates every known outcome k of its event, with λ = 1 for k == o
    and 0 otherwise, so V_k tracks P(k | event). Unique by
    ``(event_signature, outcome_signature, src_partition, src_offset, index)``. In the compact form
    (what the stream carries) there is one row per observation, the observed outcome's (λ = 1),
    and ``strengths`` holds every outcome's V after it: the same information, a fraction of the rows."""

    event_signature: Signature
    level: LinkLevel
    tool: str
    outcome_signature: str
    outcome: str
    valence: Valence
    agent: str
    episode_id: uuid.UUID
    observed_at: datetime
    src_partition: int
    src_offset: int
    index: int
    target: float  # λ: 1.0 when this observation's outcome is this link's, else 0.0
    alpha: float  # the α applied (after the running-mean start, see somnus.processors.prediction.causal_links)
    strength_before: float
    strength: float  # V after the update, in [0, 1]
    observations: int  # times this outcome was observed for this event, after the update
    event_observations: int  # times the event was observed, after the update
    confidence: float
    # In the compact form (one row per observation, the observed outcome's: ``learn(per_link_rows=False)``),
    # the strength of every outcome of the event after this update, by outcome signature.
    strengths: dict[str, float] = {}


class PredictedOutcome(msgspec.Struct, frozen=True, omit_defaults=True):
    """One likely outcome of an action: the issue's JSON shape (``in_context`` only when asked)."""

    outcome: str
    valence: Valence
    strength: float
    confidence: float
    observations: int
    in_context: bool | None = None  # every asked context value was seen with this outcome (None: unknown)


class Prediction(msgspec.Struct, frozen=True, kw_only=True):
    """What is likely to happen if ``tool`` is called with these arguments, before it is called.

    ``known`` is False when this kind of call was never observed: then ``basis`` is ``"tool"`` (the
    tool's outcomes over all its calls, with discounted confidence) or ``"none"`` (no outcomes)."""

    tool: str
    event_signature: str
    known: bool
    basis: str  # "call" | "tool" | "none"
    observations: int  # observations behind the outcomes (0 when basis is "none")
    outcomes: list[PredictedOutcome]  # most likely first
    params: Any = None  # the normalised arguments the signature was made from

    def outcomes_json(self) -> list[dict[str, Any]]:
        """The outcomes as the issue's JSON list: {outcome, valence, strength, confidence, observations}."""
        return msgspec.to_builtins(self.outcomes)

    def to_json(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)


class ToolCount(msgspec.Struct, frozen=True):
    """Exact calls (with a result) and errors of one tool: counts, not the Rescorla-Wagner estimate."""

    tool: str
    calls: int
    errors: int

    @property
    def error_rate(self) -> float:
        return self.errors / self.calls if self.calls else 0.0


class TemporalBinCounted(msgspec.Struct, frozen=True):
    """A delta of the SCN's temporal index: add it to the cell (agent, kind, bin_kind, bin).

    Deltas commute: any order, any split into batches gives the same index."""

    agent: str
    kind: str  # "session_end", "tool_call:book_reservation", ...
    bin_kind: str  # "hour" | "weekday" | "week_of_month" | "month" | "weekhour"
    bin: int
    count: int
    successes: int
    failures: int  # count - successes - failures: marks that are neither (messages, calls without result)
