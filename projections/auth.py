"""Who may read what over HTTP: bearer tokens, principals, and the guard every Somnus server mounts.

Tokens live in ``SOMNUS_HOME``: ``tokens.json`` holds each token's sha256 and what it may read
(never the token itself); ``token`` holds the operator's token in plain text for the CLI and the
Python client on this machine. Both are 0600. A token is 32 random bytes, URL-safe base64.

A principal is what a token stands for:

- **operator**: every route;
- **agent A**: the routes of ``/agents/A/...`` (they read A's scope chain, ``somnus.schemas.agents.scope_chain``);
- **agent A + user U**: A's routes with ``user_id`` forced to U (another user's id: 403); every
  agent route takes ``user_id`` and answers with U's items and user-less ones only, or nothing of
  what is derived from several users (``somnus.projections.api.WITHHELD``). A route added later
  without ``user_id`` is refused to such a token, as its answer may carry other users' memories.

A token may expire (``expires_at``, ``somnus token create --expires 30d``): from then on it gets
401 saying so, on every request.

Routes that read the whole store (every route without ``{agent}``: sql, summary, checksum, memory,
tools, predict, promotion-inputs) and the handlers in ``OPERATOR_ONLY`` need an operator token.

The guard (``guard``) checks, in order: the Host header names the address the server is bound to
(421: DNS rebinding), an Origin header, if any, is that address too (403), the bearer token (401),
a POST's content type is JSON (415), its body is within ``MAX_BODY_BYTES`` and ``MAX_DEPTH``
(400), and the principal may call the route with these parameters (403). An expired token is a 401. SECURITY.md has the
threat model.

>>> p = Principal(token_id="t", agent="support", user="u1")
>>> r = next(r for r in api.ROUTES if r.handler == "context")
>>> authorize(p, r, "support", {"query": "invoice"})
{'user_id': 'u1'}
>>> try:
...     authorize(p, r, "billing", {"query": "invoice"})
... except Refused as exc:
...     print(exc.status, exc.message)
403 this token reads agent 'support' only, not 'billing'
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import secrets
from collections.abc import Awaitable, Callable, Iterator, Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import msgspec
import orjson
from aiohttp import web

from somnus.projections import api
from somnus.projections.endpoint import TOKEN_FILE, token_file  # noqa: F401  (re-exported)

log = logging.getLogger("somnus.auth")

STORE_FILE = "tokens.json"  # every token's sha256 and scope, 0600
MAX_BODY_BYTES = 1 << 20  # a request body larger than this is refused before it is read
MAX_DEPTH = 32  # a request body nested deeper than this is refused before it is parsed
# Handlers that need an operator token even under /agents/{agent}/ (analysts' SQL, replay, promotion, forget).
OPERATOR_ONLY = frozenset({"sql", "promotion_inputs", "replay", "promote", "forget"})
# What the guard leaves on the request: its parsed JSON body (read once) and its principal.
BODY: Any = web.RequestKey("somnus.body", object) if hasattr(web, "RequestKey") else "somnus.body"
PRINCIPAL: Any = web.RequestKey("somnus.principal", object) if hasattr(web, "RequestKey") else "somnus.principal"


class Refused(Exception):
    """A request the guard turns away: the HTTP status and a message for the caller."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status, self.message = status, message

    def response(self) -> web.Response:
        headers = {"WWW-Authenticate": 'Bearer realm="somnus"'} if self.status == 401 else None
        return web.json_response({"error": self.message}, status=self.status, headers=headers)


class Principal(msgspec.Struct, frozen=True):
    """What a token may read: everything (operator), one agent's scope chain, or one user's memories of it."""

    token_id: str
    operator: bool = False
    agent: str | None = None
    user: str | None = None

    def describe(self) -> str:
        if self.operator:
            return "operator"
        return f"agent {self.agent}" + (f", user {self.user}" if self.user is not None else "")


class TokenRecord(msgspec.Struct, frozen=True):
    """One issued token as stored: its sha256, never the token."""

    id: str  # the first 12 hex digits of the hash: how list and revoke name it
    sha256: str
    operator: bool = False
    agent: str | None = None
    user: str | None = None
    created_at: str = ""
    label: str = ""
    expires_at: str = ""  # ISO 8601 UTC; "" never expires

    def expired(self, now: datetime) -> bool:
        """Whether the token is past its expiry at ``now``; an unreadable expiry counts as past
        (refuse rather than guess), a time without a zone as UTC."""
        if not self.expires_at:
            return False
        try:
            at = datetime.fromisoformat(self.expires_at)
        except ValueError:
            return True
        return (at if at.tzinfo is not None else at.replace(tzinfo=timezone.utc)) <= now

    def principal(self) -> Principal:
        return Principal(token_id=self.id, operator=self.operator, agent=self.agent, user=self.user)


class _Store(msgspec.Struct):
    version: int = 1
    tokens: list[TokenRecord] = []


_DURATION = re.compile(r"\s*(\d{1,6})\s*([smhdw])\s*")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> timedelta:
    """A token's lifetime: a positive whole number and a unit, s m h d or w.

    >>> parse_duration("30d"), parse_duration("12h")
    (datetime.timedelta(days=30), datetime.timedelta(seconds=43200))
    """
    got = _DURATION.fullmatch(text)
    if got is None or int(got.group(1)) == 0:
        raise ValueError(f"--expires {text!r}: a positive whole number and a unit (s, m, h, d, w), e.g. 30d")
    return timedelta(seconds=int(got.group(1)) * _UNIT_S[got.group(2)])


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_token() -> str:
    """32 random bytes, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


def _write_private(path: Path, data: bytes) -> None:
    """Replace ``path`` atomically with a file that is 0600 from its creation."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class TokenStore:
    """The hashed tokens of one ``SOMNUS_HOME``; a server's copy follows the file (create and revoke
    take effect on the next request, without a restart)."""

    def __init__(self, home: Path) -> None:
        self.home = Path(home)
        self.path = self.home / STORE_FILE
        self._stamp: tuple[int, int, int] | None = None
        self._by_hash: dict[str, TokenRecord] = {}

    # ---- reading ----
    def _load(self) -> list[TokenRecord]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        try:
            return msgspec.json.decode(raw, type=_Store).tokens
        except msgspec.DecodeError as exc:  # refuse every token rather than guess
            log.error("%s is not a token store (%s): every request is refused until it is fixed", self.path, exc)
            return []

    def _refresh(self) -> None:
        try:
            st = self.path.stat()
            stamp: tuple[int, int, int] | None = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp != self._stamp or stamp is None:
            self._by_hash = {r.sha256: r for r in self._load()}
            self._stamp = stamp

    def record(self, token: str) -> TokenRecord | None:
        """``token``'s record, or None when it was never issued or was revoked (an expired one too)."""
        self._refresh()
        return self._by_hash.get(digest(token))

    def principal(self, token: str, now: datetime | None = None) -> Principal | None:
        """Who ``token`` is, or None when it was never issued, was revoked or expired (at ``now``,
        default the clock)."""
        record = self.record(token)
        if record is None or record.expired(now or datetime.now(timezone.utc)):
            return None
        return record.principal()

    def records(self) -> list[TokenRecord]:
        return self._load()

    # ---- changing ----
    @contextlib.contextmanager
    def _locked(self) -> Iterator[list[TokenRecord]]:
        """The records to change in place, under a lock; written back (0600) when the block ends."""
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.home / f".{STORE_FILE}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            records = self._load()
            yield records
            _write_private(self.path, msgspec.json.encode(_Store(tokens=records)))
        finally:
            os.close(fd)

    def add(
        self,
        token: str,
        *,
        operator: bool = False,
        agent: str | None = None,
        user: str | None = None,
        label: str = "",
        expires_at: datetime | None = None,
    ) -> TokenRecord:
        """Store ``token``'s hash with its scope and expiry (idempotent: a token stored already keeps its record)."""
        if expires_at is not None and expires_at.tzinfo is None:
            raise ValueError("expires_at: a time with its time zone")
        if not operator and not agent:
            raise ValueError("a token is for the operator or for an agent (--agent)")
        if user is not None and not agent:
            raise ValueError("a user-bound token is for one agent's reads of that user (--agent and --user)")
        h = digest(token)
        with self._locked() as records:
            for r in records:
                if r.sha256 == h:
                    return r
            record = TokenRecord(
                id=h[:12],
                sha256=h,
                operator=operator,
                agent=None if operator else agent,
                user=None if operator else user,
                created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                label=label,
                expires_at=""
                if expires_at is None
                else expires_at.astimezone(timezone.utc).isoformat(timespec="seconds"),
            )
            records.append(record)
            return record

    def create(
        self,
        *,
        operator: bool = False,
        agent: str | None = None,
        user: str | None = None,
        label: str = "",
        expires_at: datetime | None = None,
    ) -> tuple[str, TokenRecord]:
        """A new token (returned once, never stored) and its record."""
        token = new_token()
        return token, self.add(token, operator=operator, agent=agent, user=user, label=label, expires_at=expires_at)

    def revoke(self, which: str) -> list[TokenRecord]:
        """Remove the tokens whose id starts with ``which`` (at least 6 characters) or that ``which`` is.
        Revoking the operator's token file's token deletes that file (the next ``somnus up`` makes a new one)."""
        h = digest(which)
        with self._locked() as records:
            gone = [r for r in records if r.sha256 == h] or [
                r for r in records if len(which) >= 6 and r.id.startswith(which.lower())
            ]
            if len(gone) > 1:
                raise ValueError(f"{which!r} names {len(gone)} tokens: give more of the id")
            for r in gone:
                records.remove(r)
        path = token_file(self.home)
        with contextlib.suppress(OSError):
            if any(r.sha256 == digest(path.read_text().strip()) for r in gone):
                path.unlink()
        return gone


def ensure_operator_token(home: Path) -> str:
    """The operator token of ``home``: ``<home>/token`` (0600), created with its hash in the store when
    missing; an existing file's token is stored again if its hash is missing (a store deleted by hand)."""
    home = Path(home)
    path = token_file(home)
    store = TokenStore(home)
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = ""
    if not token:
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        token = new_token()
        store.add(token, operator=True, label="operator (SOMNUS_HOME/token)")
        try:  # two starting processes: the first file wins, the other token stays stored but unused
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            store.revoke(token)
            return path.read_text().strip()
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        return token
    if store.principal(token) is None:
        store.add(token, operator=True, label="operator (SOMNUS_HOME/token)")
    return token


# ---- what a principal may call -----------------------------------------------------------------


def whole_store(route: api.Route) -> bool:
    """A route that reads every agent's data (or changes the store): operator tokens only."""
    return "{agent}" not in route.path or route.handler in OPERATOR_ONLY


def authorize(principal: Principal, route: api.Route, agent: str | None, params: Mapping[str, Any]) -> dict[str, str]:
    """The parameters to force on the request (a user-bound token's ``user_id``), or ``Refused`` (403).

    ``agent`` is the path's ``{agent}``; ``params`` the query's and the body's parameters."""
    if principal.operator:
        return {}
    if whole_store(route):
        raise Refused(
            403,
            f"{route.method} {route.path} reads the whole store: it needs an operator token "
            f"(this one is for {principal.describe()})",
        )
    if agent != principal.agent:
        raise Refused(403, f"this token reads agent {principal.agent!r} only, not {agent!r}")
    takes = {p[0] for p in route.params}
    forced: dict[str, str] = {}
    if "agent" in takes:  # a route that also names an agent in its parameters: the same one
        _check(params, "agent", principal.agent)  # type: ignore[arg-type]
        forced["agent"] = principal.agent  # type: ignore[assignment]
    if principal.user is not None:
        if "user_id" not in takes:
            raise Refused(
                403,
                f"{route.path} does not filter by user, and this token reads only user "
                f"{principal.user!r}'s memories (an agent token without --user reads it)",
            )
        _check(params, "user_id", principal.user)
        forced["user_id"] = principal.user
    return forced


def _check(params: Mapping[str, Any], name: str, mine: str) -> None:
    got = params.get(name)
    if got not in (None, "") and str(got) != mine:
        raise Refused(403, f"parameter `{name}`: this token reads {name.split('_')[0]} {mine!r} only, not {got!r}")


# ---- request bodies ------------------------------------------------------------------------------

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")
_INNERMOST = re.compile(rb"\[\]|\{\}")


def depth_exceeds(raw: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether the JSON text ``raw`` nests arrays and objects deeper than ``limit``, told before parsing
    (strings removed, then one level of brackets per pass: at most ``limit + 1`` passes over the text).

    >>> depth_exceeds(b'{"a": [1, {"b": "[[[["}]}', 3), depth_exceeds(b'[[[1]]]', 2)
    (False, True)
    """
    rest = _NOT_BRACKET.sub(b"", _STRING.sub(b"", raw))
    for _ in range(limit):
        if not rest:
            return False
        shorter = _INNERMOST.sub(b"", rest)
        if shorter == rest:  # unbalanced: not JSON, the parser says so
            return False
        rest = shorter
    return bool(rest)


async def json_body(request: web.Request) -> Any:
    """The request's JSON body, read once within ``MAX_BODY_BYTES`` and ``MAX_DEPTH`` (else ``Refused``
    400), parsed strictly (invalid UTF-8, lone surrogates, NaN are errors)."""
    if BODY in request:
        return request[BODY]
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise Refused(400, f"the body is {request.content_length} bytes; at most {MAX_BODY_BYTES} are accepted")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise Refused(400, f"the body is larger than {MAX_BODY_BYTES} bytes") from None
    if len(raw) > MAX_BODY_BYTES:
        raise Refused(400, f"the body is larger than {MAX_BODY_BYTES} bytes")
    if depth_exceeds(raw):
        raise Refused(400, f"the body nests deeper than {MAX_DEPTH} levels")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise Refused(400, f"the body is not JSON: {exc}") from None
    request[BODY] = body
    return body


# ---- the guard -----------------------------------------------------------------------------------


def _bound(request: web.Request) -> tuple[str, int] | None:
    sock = request.transport.get_extra_info("sockname") if request.transport is not None else None
    return (sock[0], sock[1]) if sock else None


def _check_origin(request: web.Request) -> None:
    """Host must name the bound loopback address (a rebound DNS name does not); Origin too, if sent."""
    bound = _bound(request)
    if bound is None:
        raise Refused(421, "the connection's address is unknown")
    host, port = bound
    allowed = {f"{host}:{port}", f"localhost:{port}"} | ({f"[::1]:{port}"} if host == "::1" else set())
    got = request.headers.get("Host", "")
    if got.lower() not in allowed:
        raise Refused(
            421, f"Host {got!r} is not this server ({sorted(allowed)[0]}); requests through another name are refused"
        )
    origin = request.headers.get("Origin")
    if origin is not None and origin.lower() not in {f"http://{a}" for a in allowed}:
        raise Refused(403, f"Origin {origin!r} may not call this server")


def _principal(request: web.Request, store: TokenStore, now: datetime) -> Principal:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Refused(
            401,
            "an `Authorization: Bearer <token>` header is required (the CLI and the client send "
            "SOMNUS_TOKEN or SOMNUS_HOME/token)",
        )
    record = store.record(token.strip())
    if record is None:
        raise Refused(401, "the token is not valid here (revoked, or from another SOMNUS_HOME)")
    if record.expired(now):
        raise Refused(
            401,
            f"the token {record.id} expired at {record.expires_at}: make a new one "
            "(`somnus token create ... --expires ...`)",
        )
    return record.principal()


def _route_of(request: web.Request, routes: Callable[[], list[api.Route]]) -> api.Route | None:
    resource = request.match_info.route.resource
    if resource is None:
        return None
    method = "GET" if request.method == "HEAD" else request.method
    return next((r for r in routes() if r.method == method and r.path == resource.canonical), None)


def guard(store: TokenStore, routes: Callable[[], list[api.Route]] = api.all_routes) -> Any:
    """The aiohttp middleware that checks every request (see the module docstring); a route it does not
    know from ``routes`` (``/openapi.json``, a 404) needs a valid token and nothing more."""

    @web.middleware
    async def check(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            _check_origin(request)
            principal = _principal(request, store, datetime.now(timezone.utc))  # checked on every request
            route = _route_of(request, routes)
            if route is None:
                request[PRINCIPAL] = principal  # a route of its own (/metrics) decides by the principal
                return await handler(request)
            params: dict[str, Any] = dict(request.query)
            if route.method == "POST":
                if request.content_type != "application/json":
                    raise Refused(415, f"a POST body must be application/json, not {request.content_type!r}")
                body = await json_body(request)
                if isinstance(body, dict):
                    params.update(body)
            forced = authorize(principal, route, request.match_info.get("agent"), params)
        except Refused as exc:
            return exc.response()
        request[PRINCIPAL] = principal
        if forced and route.method == "POST" and isinstance(request.get(BODY), dict):
            request[BODY] = {**request[BODY], **forced}  # the body's values win over the query's
        elif forced and any(request.query.get(k) != v for k, v in forced.items()):
            request = request.clone(rel_url=request.rel_url.update_query(forced))
        return await handler(request)

    return check
