"""Entity extraction: what an episode states outright becomes entities and facts (topic ``facts``).

``TraceExtractor`` ("trace/1") is the default extractor: deterministic, offline, no LLM. It is pure
(no I/O, no clock) and reads only what the trace states, so replaying the same episodes gives
byte-identical ``FactsExtracted``. One ``FactsExtracted`` per episode, in input order, even when empty.

Entities: the agent (``agent``), every tool called (``tool``), the hosts of URL arguments (``api``),
delegation targets (``agent``), error classes (``error``, see ``error_class``), projects and clients
named in the session metadata (``project`` / ``client``), and rate-limit values (custom type
``rate``, e.g. "10/s"). Every source and target of a fact is listed once, in first-appearance order.

Facts (``count`` = occurrences within the episode; one fact per distinct source, predicate, target):

==============================  ===========  ===============================================================
fact                            confidence   from
==============================  ===========  ===============================================================
agent ``uses`` tool             1.0          every call of the tool (count = calls)
agent ``delegates_to`` agent    1.0          every delegation
tool ``calls`` api              0.95         hosts of the call's URL arguments
tool ``failed_with`` error      0.95         calls with ``ok`` False (a call with no result is not a failure)
api ``rate_limit`` rate         1.0/.95/.9   ``X-RateLimit-Limit`` (+ window) / error text / ``Retry-After``;
                                             functional; the tool is the source when the call has no host
agent ``works_on`` project      0.9          metadata keys ``PROJECT_KEYS``
agent ``serves`` client         0.9          metadata keys ``CLIENT_KEYS``
tool b ``depends_on`` tool a    0.65         a then b consecutive, both ok, different, successful episode only
==============================  ===========  ===============================================================

Facts are emitted in the order of that table (inferences last), each group in first-appearance
order, and cut at ``MAX_FACTS`` per episode, so a huge episode drops its weakest facts first.

>>> import uuid
>>> from datetime import datetime, timezone
>>> from somnus.schemas.episodes import CallSeen, EpisodeDistilled
>>> from somnus.schemas.events import Outcome
>>> t = datetime(2024, 5, 15, tzinfo=timezone.utc)
>>> episode = EpisodeDistilled(
...     episode_id=uuid.UUID(int=1), schema_version=1, agent="airline", session_id="s1", task="rebook",
...     goal=None, user_id=None, summary="", outcome=Outcome.SUCCESS, started_at=t, ended_at=t,
...     duration_s=0.0, event_count=5, tool_calls=3, tools=[], errors=[], lessons=[], delegations=[],
...     first_event_id=uuid.UUID(int=2), last_event_id=uuid.UUID(int=3), calls=[
...         CallSeen(tool="get_reservation", ok=True),
...         CallSeen(tool="update_reservation_flights", ok=False,
...                  error="Error: flight HAT030 not available on date 2024-05-13"),
...         CallSeen(tool="update_reservation_flights", ok=True)])
>>> [facts] = TraceExtractor().extract([episode])
>>> for f in facts.facts:
...     print(f.source, f.predicate, f.target, f.count, f.confidence)
airline uses get_reservation 1 1.0
airline uses update_reservation_flights 2 1.0
update_reservation_flights failed_with flight <id> not available on date <date> 1 0.95
>>> [(e.name, e.type) for e in facts.entities][:2]
[('airline', 'agent'), ('get_reservation', 'tool')]
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any, Protocol

from somnus.processors.sessions.distiller import is_rate_limit
from somnus.schemas.codec import json_or_literal
from somnus.schemas.episodes import CallSeen, EpisodeDistilled
from somnus.schemas.events import Outcome
from somnus.schemas.facts import FACTS_SCHEMA_VERSION, EntityMention, EntityType, FactAsserted, FactsExtracted

TRACE_EXTRACTOR_NAME = "trace/1"

# Bounds: everything an episode can produce is capped, and cut deterministically.
MAX_FACTS = 200  # facts per episode; the weakest groups (inferences) are cut first
MAX_NAME = 200  # characters of an entity name (tools, hosts, projects, ...)
MAX_ERROR_CLASS = 160  # characters of an error class name
MAX_EXAMPLE = 200  # characters of the example text kept on an error entity
MAX_METADATA_VALUES = 8  # values taken from one metadata key holding a list

# Confidence: what the trace states outright 0.9-1.0, what it suggests 0.6-0.7.
CONFIDENCE_USES = 1.0
CONFIDENCE_DELEGATES_TO = 1.0
CONFIDENCE_CALLS = 0.95
CONFIDENCE_FAILED_WITH = 0.95
CONFIDENCE_RATE_HEADER = 1.0  # X-RateLimit-Limit / RateLimit-Policy
CONFIDENCE_RATE_TEXT = 0.95  # "rate limit of 10 requests per second" in the error text
CONFIDENCE_RATE_RETRY_AFTER = 0.9  # only Retry-After on a rate-limited call
CONFIDENCE_WORKS_ON = 0.9
CONFIDENCE_SERVES = 0.9
CONFIDENCE_DEPENDS_ON = 0.65  # an inference from call order

USES = "uses"
DELEGATES_TO = "delegates_to"
CALLS = "calls"
FAILED_WITH = "failed_with"
RATE_LIMIT = "rate_limit"
WORKS_ON = "works_on"
SERVES = "serves"
DEPENDS_ON = "depends_on"

# A rate is a value ("10/s"), not an idea: its own type keeps such values out of ``concept``.
RATE_TYPE = "rate"

# Session metadata keys (compared lower-cased) that name a project or a client, in this order.
PROJECT_KEYS = ("project", "project_name")
CLIENT_KEYS = ("client", "client_name", "customer", "customer_name", "account", "account_name")

NO_MESSAGE = "error (no message)"  # the distiller's text for an error without a message


class EntityExtractor(Protocol):
    """Turns episodes into facts: one ``FactsExtracted`` per episode, same order, even when empty.

    ``observed_at`` is the episode's ``ended_at``; ``extractor`` is ``name``. An LLM extractor may
    make ``extract`` a coroutine; the stream awaits it when it is one."""

    name: str

    def extract(self, episodes: Sequence[EpisodeDistilled]) -> list[FactsExtracted]: ...


class TraceExtractor:
    """The deterministic extractor: only what the trace states (see the module docstring)."""

    name: str = TRACE_EXTRACTOR_NAME

    def __init__(self, max_facts: int = MAX_FACTS) -> None:
        self.max_facts = max_facts

    def extract(self, episodes: Sequence[EpisodeDistilled]) -> list[FactsExtracted]:
        return [self.extract_one(e) for e in episodes]

    def extract_one(self, episode: EpisodeDistilled) -> FactsExtracted:
        facts = _facts(episode)[: self.max_facts]
        return FactsExtracted(
            schema_version=FACTS_SCHEMA_VERSION,
            episode_id=episode.episode_id,
            agent=episode.agent,
            observed_at=episode.ended_at,
            extractor=self.name,
            entities=_entities(episode.agent, facts, _error_attributes(episode)),
            facts=facts,
        )


# ---- error classes -----------------------------------------------------------------------------

_ERROR_PREFIX = re.compile(r"^(?:error\s*:\s*)+", re.I)
_HTTP_PREFIX = re.compile(r"^HTTP(?:/\d(?:\.\d)?)?(?:\s+error)?\s*:?\s*([1-5]\d\d)\b\s*[:-]?\s*", re.I)
_BARE_STATUS = re.compile(r"^([1-5]\d\d)\b\s*(:?)\s*")
_SHELL_NOT_FOUND = (
    re.compile(r"\bcommand not found:\s*([^\s:'\"]{1,100})", re.I),  # zsh: command not found: helm
    re.compile(r"([^\s:'\"]{1,100}):\s*command not found\b", re.I),  # bash: helm: command not found
    re.compile(
        r"^\S{0,100}sh:\s*(?:line\s*)?\d+:\s*([^\s:'\"]{1,100}):\s*not found\b", re.I
    ),  # /bin/sh: 1: helm: not found
)
_TRACEBACK = "traceback (most recent call last)"
_EXCEPTION = re.compile(
    r"\b(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Warning|Fault|Failure)\b(?=:|\s*$)"
)
_PLACEHOLDERS = (
    # (bounded repeats where a match may start anywhere: the cost stays linear in the text)
    (re.compile(r"\b[a-z][a-z0-9+.-]{0,15}://[^\s'\"<>)]+", re.I), "<url>"),
    (re.compile(r"\b[\w.+-]{1,64}@[\w-]+(?:\.[\w-]+)+\b"), "<email>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I), "<id>"),
    (
        re.compile(r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?(?![\w])"),
        "<date>",
    ),
    (re.compile(r"\b\d{1,2}/\d{1,2}/\d{2,4}\b"), "<date>"),
    (re.compile(r"\b\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?\b"), "<time>"),
    (re.compile(r"(?<![\w.<>/])(?:~|\.{1,2})?/[\w.@+-]+(?:/[\w.@+-]*)*"), "<path>"),
    (re.compile(r"(?<![\w])[A-Za-z]:\\[^\s'\"<>|]+"), "<path>"),  # C:\Users\x\f.txt
    (re.compile(r"(?<![\w.])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\w)"), "<n>"),  # 1,002.50
    (re.compile(r"(?<![\w.])\d+(?:\.\d+)+(?!\w)"), "<n>"),  # 3.14, 1.2.3
)
_WORD = re.compile(r"\w+")
_SPACE = re.compile(r"\s+")


@functools.lru_cache(maxsize=65536)
def error_class(text: str) -> str:
    """A stable class name for one error text: the same error with other ids, numbers or dates is one class.

    Rules, in order:
    - whitespace is collapsed; leading ``Error:`` prefixes (any case) are dropped;
    - an HTTP status prefix is kept as ``HTTP 429: ...`` ("HTTP 429:", "HTTP/1.1 429", "HTTP Error 429:",
      or a bare "429 Too Many Requests" whose reason phrase is the standard one);
    - shell "command not found" in its bash, zsh and sh forms becomes ``command not found: <command>``;
    - a Python traceback is reduced to its last exception line (``traceback (exception not shown)`` when
      the text was cut before it); exception class names are kept, with their message templated;
    - a data payload in the message (a JSON or Python-literal object or list, e.g. an API's response
      body, possibly cut short) is a value, not the kind of error: it becomes its own message (the
      string of a top-level ``PAYLOAD_MESSAGE_KEYS`` key, or of ``error``'s or ``detail``'s first
      object) when it has one, else ``<data>``;
    - in the message, URLs, e-mails, uuids, dates, times, paths and numbers become ``<url>``, ``<email>``,
      ``<id>``, ``<date>``, ``<time>``, ``<path>``, ``<n>``; any other word holding a digit (HAT030,
      certificate_7504069, 0x1f, ipv4) becomes ``<id>``, and so does a word of ``MIN_HEX_ID`` or more hex
      letters (deadbeef, a sha); Windows paths are ``<path>`` too. Quoted words without digits are kept;
    - trailing punctuation is dropped; the result is cut at ``MAX_ERROR_CLASS`` characters.

    >>> error_class("Error: flight HAT030 not available on date 2024-05-13")
    'flight <id> not available on date <date>'
    >>> error_class("HTTP 429: Too Many Requests")
    'HTTP 429: Too Many Requests'
    >>> error_class("bash: helm: command not found")
    'command not found: helm'
    >>> error_class("/bin/bash: line 2784: javac: command not found")
    'command not found: javac'
    >>> error_class("commit deadbeefcafe not found at line 12 of C:\\\\repo\\\\setup.py")
    'commit <id> not found at line <n> of <path>'
    >>> error_class("ValueError: x must be positive, got -3")
    'ValueError: x must be positive, got -<n>'
    >>> error_class("Message error... {'result': [{'title': 'Black Summer', 'overview': 'In the dark, ea")
    'Message error... <data>'
    >>> error_class('HTTP 400: {"error": {"code": 400, "message": "API key not valid"}}')
    'HTTP 400: API key not valid'
    """
    rest = _SPACE.sub(" ", text).strip()
    rest = _ERROR_PREFIX.sub("", rest)
    status, rest = _http_status_prefix(rest)
    rest = _ERROR_PREFIX.sub("", rest)
    if "not found" in rest.lower():
        for rx in _SHELL_NOT_FOUND:
            m = rx.search(rest)
            if m:
                return _cut(f"command not found: {m.group(1)}")
    if _TRACEBACK in rest.lower():
        found = list(_EXCEPTION.finditer(rest, rest.lower().index(_TRACEBACK) + len(_TRACEBACK)))
        rest = rest[found[-1].start() :] if found else "traceback (exception not shown)"
    if "{" in rest or "[" in rest:
        rest = _without_payloads(rest)
    for rx, placeholder in _PLACEHOLDERS:
        rest = rx.sub(placeholder, rest)
    rest = _WORD.sub(_template_word, rest).rstrip(" .,;:")
    if status is not None:
        rest = f"HTTP {status}: {rest}" if rest else f"HTTP {status}"
    return _cut(rest) or NO_MESSAGE


DATA = "<data>"  # a data payload of an error message that says no message of its own
# Keys of a payload object whose string is the error's message, in this order (top level; ``error`` and
# ``detail`` may also hold an object, or a list of objects, that has one).
PAYLOAD_MESSAGE_KEYS = ("message", "msg", "error_message", "errorMessage", "error", "detail", "reason")
MAX_PAYLOAD_PARSE = 20_000  # a longer payload is not parsed for its message: it is <data>
# Where a payload starts: an object whose first key is quoted, or a list of strings, objects or lists.
# ("{name}", "[Errno 2]" and "[]" are not payloads.)
_PAYLOAD = re.compile(r"""(?<![\w\]})])(?:\{\s*["']|\[\s*[\[{"'])""")
_CLOSE = {"{": "}", "[": "]"}


def _without_payloads(text: str) -> str:
    """``text`` with each data payload replaced by its message, or by ``<data>`` (see ``error_class``).

    >>> _without_payloads("Message error... {'statusCode': 400, 'error': 'Bad Request', 'message': 'Bad query'}")
    'Message error... Bad query'
    >>> _without_payloads('{"detail": [{"loc": ["body", "q"], "msg": "field required"}]} at step 2')
    'field required at step 2'
    >>> _without_payloads("expected one of ['json', 'yaml'], got [Errno 2] {name}")
    'expected one of <data>, got [Errno 2] {name}'
    """
    out: list[str] = []
    pos = 0
    while (m := _PAYLOAD.search(text, pos)) is not None:
        end = _payload_end(text, m.start())
        out += [text[pos : m.start()], _payload_message(text[m.start() : end]) or DATA]
        pos = end
    return "".join(out) + text[pos:]


def _payload_end(text: str, start: int) -> int:
    """The end of the bracketed payload that starts at ``start`` (quoted strings skipped), or the end
    of the text for a payload cut short."""
    stack: list[str] = []
    quote: str | None = None
    i = start
    while i < len(text):
        c = text[i]
        if quote is not None:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c in _CLOSE:
            stack.append(_CLOSE[c])
        elif c in "}]":
            if not stack or stack.pop() != c or not stack:
                return i + 1
        i += 1
    return len(text)


def _payload_message(payload: str) -> str | None:
    """The message a payload says (``PAYLOAD_MESSAGE_KEYS``), or None (not parsed, or no message)."""
    if len(payload) > MAX_PAYLOAD_PARSE:
        return None
    return _message_of(json_or_literal(payload), 2)


def _message_of(data: Any, depth: int) -> str | None:
    if isinstance(data, list) and data and depth > 0:
        return _message_of(data[0], depth - 1)
    if not isinstance(data, dict):
        return None
    for key in PAYLOAD_MESSAGE_KEYS:
        value = data.get(key)
        if isinstance(value, str) and value.strip():
            return " ".join(value.split())
        if key in ("error", "detail") and depth > 0 and (found := _message_of(value, depth - 1)):
            return found
    return None


def _http_status_prefix(text: str) -> tuple[int | None, str]:
    m = _HTTP_PREFIX.match(text)
    if m:
        return int(m.group(1)), text[m.end() :]
    m = _BARE_STATUS.match(text)
    if m:
        status = int(m.group(1))
        rest = text[m.end() :]
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = None
        if m.group(2) or (phrase and rest.lower().startswith(phrase.lower())):
            return status, rest
    return None, text


_HEX = frozenset("0123456789abcdefABCDEF")
MIN_HEX_ID = 8  # a word of this many hex letters and no other (a hash, a git sha: deadbeef) is an id


def _template_word(m: re.Match[str]) -> str:
    word = m.group(0)
    if not any(c.isdigit() for c in word):
        return "<id>" if len(word) >= MIN_HEX_ID and _HEX.issuperset(word) else word
    return "<n>" if word.isdigit() else "<id>"


def _cut(text: str) -> str:
    return text[:MAX_ERROR_CLASS].rstrip()


# ---- rate limits -------------------------------------------------------------------------------

_LIMIT_HEADERS = ("x-ratelimit-limit", "ratelimit-limit", "x-ratelimit-limit-requests")
_WINDOW_HEADERS = ("x-ratelimit-window", "x-ratelimit-interval", "x-ratelimit-period", "ratelimit-window")
_POLICY_HEADERS = ("ratelimit-policy", "x-ratelimit-policy")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_POLICY_WINDOW = re.compile(r"\bw\s*=\s*(\d+(?:\.\d+)?)")
_UNITS = r"milliseconds?|ms|seconds?|secs?|s|minutes?|mins?|m|hours?|hrs?|h|days?|d"
_DURATION_PART = re.compile(rf"(\d+(?:\.\d+)?)({_UNITS})?", re.I)
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_WINDOW_NAMES = {1: "s", 60: "min", 3600: "h", 86400: "day"}
_RATE_TEXT = re.compile(
    r"(\d+(?:\.\d+)?)\s*(?:requests?|reqs?|calls?|queries)?\s*(?:/|\bper\b)\s*(\d+(?:\.\d+)?)?\s*"
    rf"({_UNITS})\b",
    re.I,
)


def _duration_seconds(text: str) -> float | None:
    """'1', '1s', '60 seconds', '1m', '6m0s', 'minute' -> seconds; None when not a duration."""
    text = "".join(text.split()).lower()
    if not text:
        return None
    if text.isalpha():  # "second", "minute": one of the unit
        text = "1" + text
    total, end = 0.0, 0
    for m in _DURATION_PART.finditer(text):
        if m.start() != end or not m.group(0):
            return None
        unit = (m.group(2) or "s").lower()
        key = "ms" if unit.startswith("ms") or unit.startswith("milli") else unit[0]
        total += float(m.group(1)) * _UNIT_SECONDS[key]
        end = m.end()
    return total if end == len(text) and total > 0 else None


def _number(text: str) -> str:
    value = float(text)
    return str(int(value)) if value == int(value) else f"{value:g}"


def rate_value(limit: str, window_s: float | None) -> str:
    """The value of a ``rate_limit`` fact: '10/s', '100/min', '5/30s', '10/window' (window unknown).

    >>> rate_value("10", 1), rate_value("100", 60), rate_value("5", 30), rate_value("10", None)
    ('10/s', '100/min', '5/30s', '10/window')
    """
    limit = _number(limit)
    if window_s is None or window_s <= 0:
        return f"{limit}/window"
    if window_s in _WINDOW_NAMES:
        return f"{limit}/{_WINDOW_NAMES[int(window_s)]}"
    for seconds, unit in ((86400, "day"), (3600, "h"), (60, "min")):
        if window_s % seconds == 0:
            return f"{limit}/{_number(str(window_s / seconds))}{unit}"
    return f"{limit}/{_number(str(window_s))}s"


def _rate_from_headers(headers: Mapping[str, str]) -> str | None:
    """X-RateLimit-Limit with a window header, or a RateLimit-Policy ("10;w=1")."""
    limit: str | None = None
    window: float | None = None
    for key in _POLICY_HEADERS:
        if key in headers:
            n = _NUMBER.search(headers[key])
            w = _POLICY_WINDOW.search(headers[key])
            if n and w:
                limit, window = n.group(0), float(w.group(1))
                break
    for key in _LIMIT_HEADERS:
        if limit is None and key in headers and (n := _NUMBER.search(headers[key])):
            limit = n.group(0)
            w = _POLICY_WINDOW.search(headers[key])  # the draft's "10, 10;w=1"
            window = float(w.group(1)) if w else None
    for key in _WINDOW_HEADERS:
        if limit is not None and window is None and key in headers:
            window = _duration_seconds(headers[key])
    # X-RateLimit-Reset is not a window: it is the time left (or an epoch time) until the counter resets.
    return rate_value(limit, window) if limit is not None and float(limit) > 0 else None


def _rate_from_text(text: str) -> str | None:
    """'rate limit of 10 requests per second', '10 req/s', '100 calls per 60 seconds' -> a rate value."""
    m = _RATE_TEXT.search(text)
    if m is None or float(m.group(1)) <= 0:
        return None
    window = _duration_seconds(f"{m.group(2) or '1'}{m.group(3)}")
    return rate_value(m.group(1), window) if window else None


def _rate_from_retry_after(headers: Mapping[str, str]) -> str | None:
    """'Retry-After: 2' -> 'retry after 2s'. An HTTP-date is skipped: reading it would need a clock."""
    value = headers.get("retry-after", "").strip()
    return f"retry after {_number(value)}s" if _NUMBER.fullmatch(value) else None


def _call_rates(call: CallSeen) -> list[tuple[float, str]]:
    """What one call states about its rate limit: (confidence, value), strongest first, each value once."""
    found = [(CONFIDENCE_RATE_HEADER, _rate_from_headers(call.rate_headers))]
    if call.ok is False and is_rate_limit(call.error or "", call.http_status):
        found += [
            (CONFIDENCE_RATE_TEXT, _rate_from_text(call.error or "")),
            (CONFIDENCE_RATE_RETRY_AFTER, _rate_from_retry_after(call.rate_headers)),
        ]
    out: dict[str, float] = {}
    for confidence, value in found:
        if value is not None:
            out.setdefault(value, confidence)
    return [(confidence, value) for value, confidence in out.items()]


# ---- facts -------------------------------------------------------------------------------------

Node = tuple[str, str]  # (name, type)


def _name(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    return _clean_name(str(value))


@functools.lru_cache(maxsize=65536)
def _clean_name(text: str) -> str | None:
    # Names repeat across episodes (the same tools, agents, hosts): cached, it is a pure function.
    name = _SPACE.sub(" ", text).strip()[:MAX_NAME].rstrip()
    return name or None


def _metadata_names(metadata: Mapping[str, Any], keys: Sequence[str]) -> list[str]:
    lowered: dict[str, Any] = {}
    for k, v in metadata.items():
        lowered.setdefault(str(k).lower(), v)
    names: list[str] = []
    for key in keys:
        value = lowered.get(key)
        values = value[:MAX_METADATA_VALUES] if isinstance(value, list) else [value]
        for v in values:
            name = _name(v)
            if name is not None and name not in names:
                names.append(name)
    return names


class _Tally:
    """Counts of (source, target) pairs for one predicate, in first-appearance order."""

    def __init__(self) -> None:
        self.counts: dict[tuple[Node, Node], int] = {}

    def add(self, source: Node, target: Node, n: int = 1) -> None:
        self.counts[(source, target)] = self.counts.get((source, target), 0) + n

    def facts(self, predicate: str, confidence: float) -> list[FactAsserted]:
        return [
            FactAsserted(
                source=s[0],
                source_type=s[1],
                predicate=predicate,
                target=t[0],
                target_type=t[1],
                confidence=confidence,
                count=n,
            )
            for (s, t), n in self.counts.items()
        ]


def _facts(episode: EpisodeDistilled) -> list[FactAsserted]:
    agent: Node = (_name(episode.agent) or episode.agent, EntityType.AGENT.value)
    uses, calls, failed, delegates, depends = _Tally(), _Tally(), _Tally(), _Tally(), _Tally()
    # per rate-limit source: value -> (strongest confidence, calls stating it, last call stating it)
    rates: dict[Node, dict[str, tuple[float, int, int]]] = {}
    for i, call in enumerate(episode.calls):
        tool_name = _name(call.tool)
        if tool_name is None:
            continue
        tool: Node = (tool_name, EntityType.TOOL.value)
        uses.add(agent, tool)
        hosts = [(h, EntityType.API.value) for h in (_name(x) for x in call.hosts) if h is not None]
        for host in hosts:
            calls.add(tool, host)
        if call.ok is False:
            failed.add(tool, (error_class(call.error or NO_MESSAGE), EntityType.ERROR.value))
        for confidence, value in _call_rates(call):
            for source in hosts or [tool]:
                values = rates.setdefault(source, {})
                strongest, n, _ = values.get(value, (confidence, 0, i))
                values[value] = (max(strongest, confidence), n + 1, i)
    for tool_name in episode.tools:  # tools of calls past the distiller's MAX_CALLS, or of older episodes
        if (name := _name(tool_name)) is not None and (agent, (name, EntityType.TOOL.value)) not in uses.counts:
            uses.add(agent, (name, EntityType.TOOL.value))
    if not episode.calls:  # an episode from before ``calls``: its deduplicated errors, once each
        for e in episode.errors:
            if (name := _name(e.tool)) is not None:
                failed.add((name, EntityType.TOOL.value), (error_class(e.error), EntityType.ERROR.value))
    for d in episode.delegations:
        if (name := _name(d.to_agent)) is not None:
            delegates.add(agent, (name, EntityType.AGENT.value))
    if episode.outcome is Outcome.SUCCESS:
        for a, b in zip(episode.calls, episode.calls[1:]):
            na, nb = _name(a.tool), _name(b.tool)
            if a.ok is True and b.ok is True and na is not None and nb is not None and na != nb:
                depends.add((nb, EntityType.TOOL.value), (na, EntityType.TOOL.value))

    out = uses.facts(USES, CONFIDENCE_USES) + delegates.facts(DELEGATES_TO, CONFIDENCE_DELEGATES_TO)
    out += calls.facts(CALLS, CONFIDENCE_CALLS) + failed.facts(FAILED_WITH, CONFIDENCE_FAILED_WITH)
    for source, values in rates.items():
        # functional: one value per source and episode, the strongest statement, the latest among equals
        value, (confidence, n, _) = max(values.items(), key=lambda kv: (kv[1][0], kv[1][2]))
        out.append(
            FactAsserted(
                source=source[0],
                source_type=source[1],
                predicate=RATE_LIMIT,
                target=value,
                target_type=RATE_TYPE,
                confidence=confidence,
                count=n,
                functional=True,
            )
        )
    out += [
        FactAsserted(
            source=agent[0],
            source_type=agent[1],
            predicate=WORKS_ON,
            target=p,
            target_type=EntityType.PROJECT.value,
            confidence=CONFIDENCE_WORKS_ON,
        )
        for p in _metadata_names(episode.metadata, PROJECT_KEYS)
    ]
    out += [
        FactAsserted(
            source=agent[0],
            source_type=agent[1],
            predicate=SERVES,
            target=c,
            target_type=EntityType.CLIENT.value,
            confidence=CONFIDENCE_SERVES,
        )
        for c in _metadata_names(episode.metadata, CLIENT_KEYS)
    ]
    out += depends.facts(DEPENDS_ON, CONFIDENCE_DEPENDS_ON)
    return out


def _error_attributes(episode: EpisodeDistilled) -> dict[str, dict[str, Any]]:
    """Per error class: the first example text seen and the first HTTP status known."""
    seen = (
        [(c.error or NO_MESSAGE, c.http_status) for c in episode.calls if c.ok is False]
        if episode.calls
        else [(e.error, e.http_status) for e in episode.errors]
    )
    attrs: dict[str, dict[str, Any]] = {}
    for text, status in seen:
        a = attrs.setdefault(error_class(text), {"example": text[:MAX_EXAMPLE]})
        if status is not None and "http_status" not in a:
            a["http_status"] = status
    return attrs


def _entities(
    agent: str, facts: Sequence[FactAsserted], error_attrs: Mapping[str, Mapping[str, Any]]
) -> list[EntityMention]:
    """The agent, then every source and target of the facts, once each, in first-appearance order."""
    nodes: dict[Node, None] = {(_name(agent) or agent, EntityType.AGENT.value): None}
    for f in facts:
        nodes.setdefault((f.source, f.source_type), None)
        nodes.setdefault((f.target, f.target_type), None)
    return [
        EntityMention(
            name=name, type=type_, attributes=dict(error_attrs.get(name, {})) if type_ == EntityType.ERROR.value else {}
        )
        for name, type_ in nodes
    ]
