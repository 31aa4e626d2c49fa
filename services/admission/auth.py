"""Who may call the public API, and how often they may write.

- Tokens: random bearer tokens, one per person or robot, each with a team and a role. Only their sha256
  digests are stored, in the file named by GPUSCHED_API_TOKENS_FILE (JSON, or TOML by the `.toml` suffix). A
  token is 256 random bits, so an unsalted fast hash is enough: nobody can guess one from its digest, which
  is what salting and slow hashes protect against for human passwords.
- Roles: `submitter` (its own team's jobs only: submit, list, see, explain, cancel, logs; another team's job
  is answered 404 as if it did not exist), `operator` (queue and node changes, and everything a submitter
  may do, for every team), `auditor` (every read, for every team; no writes).
- Rate limits: a token bucket per team (per client address when the API is open) on writes.
- Without a tokens file the API is open (development mode): every caller acts as an anonymous operator.

The middleware attaches the caller (a `Principal`) to the request; handlers ask `require(request, role...)`
and filter by `Principal.sees(team)`. Tokens never reach a log: nothing here logs a header, and
authentication failures say why without echoing what was sent.
"""

from __future__ import annotations

import hmac
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware

from libs.runtime.api_tokens import (  # the tokens file, which the CLI's `gpusched token` writes too
    AUDITOR,
    OPERATOR,
    ROLES,
    SUBMITTER,
    TOKENS_ENV,
    TokenEntry,
    TokenFileError,
    hash_token,
    read_tokens,
)
from libs.runtime.http import HttpError

log = logging.getLogger(__name__)

RATE_ENV = "GPUSCHED_RATE_LIMIT_PER_S"
BURST_ENV = "GPUSCHED_RATE_LIMIT_BURST"

# Who may read jobs (a submitter only its own team's) and who may change them.
JOB_READERS = ROLES
JOB_WRITERS = (SUBMITTER, OPERATOR)
OPERATOR_ONLY = (OPERATOR,)
# Cluster-wide reads (queues, nodes): other teams' figures are in them.
CLUSTER_READERS = (OPERATOR, AUDITOR)

# Served to anyone: probes, metrics and the API's own description carry no team's data.
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json"})
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
DEFAULT_RATE_PER_S = 200.0
DEFAULT_BURST = 1000.0


# --- principals and permissions ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller of one request: the token's name, team and role."""

    name: str
    team: str
    role: str
    # False only for the anonymous caller of an open (development-mode) API.
    authenticated: bool = True

    def sees(self, team: str) -> bool:
        """Whether a job or figure of `team` exists for this caller (a submitter sees its own team only)."""
        return self.role != SUBMITTER or team == self.team

    @property
    def team_scope(self) -> str | None:
        """The one team this caller is confined to; None for every team."""
        return self.team if self.role == SUBMITTER else None


# The caller when no tokens file is configured: an operator, so that development mode behaves as before.
OPEN = Principal(name="anonymous", team="", role=OPERATOR, authenticated=False)
PRINCIPAL = web.RequestKey("gpusched_principal", Principal)


def principal(request: web.Request) -> Principal:
    """The caller the middleware attached; OPEN on an app built without it (tests wire the APIs bare, and
    then nothing is checked anyway)."""
    return request.get(PRINCIPAL, OPEN)


def require(request: web.Request, roles: Sequence[str], action: str) -> Principal:
    """The caller, if its role is one of `roles`; else 403 naming the roles that may."""
    who = principal(request)
    if who.role not in roles:
        needed = " or ".join(roles)
        raise HttpError(403, "forbidden", f"{action} needs the role {needed}; token {who.name!r} is {who.role}")
    return who


def require_team(who: Principal, team: str, action: str) -> None:
    """403 when a submitter acts for another team than its own."""
    if not who.sees(team):
        raise HttpError(403, "forbidden", f"token {who.name!r} may {action} only for team {who.team!r}, "
                                          f"not {team!r} (an operator may act for any team)")


# --- tokens and the tokens file ------------------------------------------------------------------------


class TokenStore:
    """Validates presented tokens against the stored digests."""

    def __init__(self, entries: Sequence[TokenEntry]) -> None:
        self.entries = tuple(entries)

    def authenticate(self, token: str) -> Principal | None:
        try:
            digest = hash_token(token)
        except UnicodeError:
            return None
        found = None
        for entry in self.entries:  # no early exit: the time taken does not tell which entry matched
            if hmac.compare_digest(entry.hash, digest):
                found = entry
        return None if found is None else Principal(name=found.name, team=found.team, role=found.role)


def _stamp(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_mtime_ns, st.st_size, st.st_ino


class TokenFile:
    """The tokens file, read again when it changes (checked at most every `check_every_s`), so that a token
    created or revoked takes effect without a restart. A file that cannot be read or parsed any more leaves
    the last good tokens in force: a half-edited file must neither lock everyone out nor open the API."""

    def __init__(self, path: Path, check_every_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.check_every_s = check_every_s
        self.clock = clock
        self._stamp = _stamp(path)
        self.store = TokenStore(read_tokens(path))  # at start, a bad file is fatal
        self._checked = clock()

    def authenticate(self, token: str) -> Principal | None:
        self._refresh()
        return self.store.authenticate(token)

    def _refresh(self) -> None:
        now = self.clock()
        if now - self._checked < self.check_every_s:
            return
        self._checked = now
        try:
            stamp = _stamp(self.path)
            if stamp == self._stamp:
                return
            self._stamp = stamp  # a bad version is reported once, not every second
            self.store = TokenStore(read_tokens(self.path))
            log.info("API tokens reloaded from %s (%d tokens)", self.path, len(self.store.entries))
        except (OSError, TokenFileError) as err:
            log.error("API tokens file unusable, keeping the previous tokens: %s", err)


# --- rate limits ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Bucket:
    tokens: float
    stamp: float


class RateLimiter:
    """Token buckets per key: `per_s` writes a second on average, bursts of up to `burst`."""

    def __init__(self, per_s: float, burst: float, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 10_000) -> None:
        if not (math.isfinite(per_s) and math.isfinite(burst)) or per_s <= 0 or burst < 1:
            raise ValueError(f"rate limit needs {RATE_ENV} > 0 and {BURST_ENV} >= 1")
        self.per_s, self.burst, self.clock, self.max_keys = per_s, burst, clock, max_keys
        self._buckets: dict[str, _Bucket] = {}

    def take(self, key: str) -> float:
        """Take one token from `key`'s bucket: 0.0 when there was one, else the seconds until there is."""
        now = self.clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_keys:
                self._forget(now)
            bucket = self._buckets[key] = _Bucket(self.burst, now)
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.stamp) * self.per_s)
        bucket.stamp = now
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return 0.0
        return (1 - bucket.tokens) / self.per_s

    def _forget(self, now: float) -> None:
        """Bound the memory many client addresses could take: a bucket that has refilled is the same as a
        new one, so it goes first; if that is not enough, the least recently used half goes."""
        full_after = self.burst / self.per_s
        for key in [k for k, b in self._buckets.items() if now - b.stamp >= full_after]:
            del self._buckets[key]
        if len(self._buckets) >= self.max_keys:
            by_age = sorted(self._buckets, key=lambda k: self._buckets[k].stamp)
            for key in by_age[: len(by_age) // 2 + 1]:
                del self._buckets[key]


def limiter_from_env(env: Mapping[str, str]) -> RateLimiter | None:
    """The write limiter from GPUSCHED_RATE_LIMIT_PER_S and _BURST; a rate of 0 turns limiting off."""
    try:
        per_s = float(env.get(RATE_ENV) or DEFAULT_RATE_PER_S)
        burst = float(env.get(BURST_ENV) or DEFAULT_BURST)
    except ValueError:
        raise ValueError(f"{RATE_ENV} and {BURST_ENV} must be numbers") from None
    if per_s == 0:
        log.warning("%s=0: writes to the API are not rate-limited", RATE_ENV)
        return None
    return RateLimiter(per_s, burst)


# --- the middleware ------------------------------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _unauthenticated(message: str, challenge: str) -> HttpError:
    return HttpError(401, "unauthenticated", message, {"WWW-Authenticate": challenge})


def authenticate(request: web.Request, tokens: TokenFile) -> Principal:
    """The caller behind the request's bearer token; 401 with a Bearer challenge when there is none."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise _unauthenticated("this API needs 'Authorization: Bearer <token>' (gpusched token create)",
                               'Bearer realm="gpusched"')
    who = tokens.authenticate(token)
    if who is None:
        raise _unauthenticated("the bearer token is not valid (unknown or revoked)",
                               'Bearer realm="gpusched", error="invalid_token"')
    return who


def throttle(request: web.Request, who: Principal, limiter: RateLimiter) -> None:
    """429 with Retry-After when the caller's team (or address, on an open API) has used up its writes."""
    key = f"team:{who.team}" if who.authenticated else f"addr:{request.remote or ''}"
    wait_s = limiter.take(key)
    if wait_s > 0:
        retry = max(1, math.ceil(wait_s))
        raise HttpError(429, "rate_limited", f"too many writes; {limiter.per_s:g} a second are allowed "
                                             f"(bursts of {limiter.burst:g}): retry in {retry} s",
                        {"Retry-After": str(retry)})


def auth_middleware(tokens: TokenFile | None, limiter: RateLimiter | None) -> Middleware:
    """Attach the caller to every request but the public paths, and limit its writes."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in PUBLIC_PATHS:
            return await handler(request)
        who = OPEN if tokens is None else authenticate(request, tokens)
        request[PRINCIPAL] = who
        if limiter is not None and request.method in WRITE_METHODS:
            throttle(request, who, limiter)
        return await handler(request)

    return check


def install(app: web.Application, env: Mapping[str, str] = os.environ) -> None:
    """Protect `app` as the environment says. A tokens file that is named but missing or bad stops the
    service: falling back to an open API would be the wrong way to fail."""
    path = (env.get(TOKENS_ENV) or "").strip()
    tokens = TokenFile(Path(path)) if path else None
    if tokens is None:
        log.warning("%s is not set: the API is open to anyone who can reach it (development mode)", TOKENS_ENV)
    else:
        log.info("API tokens from %s (%d tokens)", path, len(tokens.store.entries))
    app.middlewares.append(auth_middleware(tokens, limiter_from_env(env)))
