"""API keys and per-key request rates at the gateway's door (a pure ASGI middleware).

Off unless `--api-keys-file` names a file: one key per line (blank lines and `#` comments
skipped), on Kubernetes the key of a mounted Secret. A request to anything but the probe and
scrape paths needs `Authorization: Bearer <key>`; without one, or with a key not in the file,
it gets 401 in OpenAI's error shape. Only SHA-256 digests of the keys are kept in memory, a
presented key is compared with every digest in constant time (hmac.compare_digest), and no key,
presented or configured, is ever logged or put in a metric label.

The file is re-read when it changes (checked at most every RELOAD_CHECK_S, on a request): a
rotated Secret reaches the pod's volume without a restart, so neither does the gateway need one.
A file that becomes unreadable or empty keeps the keys last read (a half-written rotation must
not lock every client out, nor let every client in).

`--rate-limit-per-key R`: a token bucket per key, R requests/s with a burst of max(1, R)
(one second's worth, at least 1); beyond, 429 + Retry-After (seconds until the next token)."""
from __future__ import annotations

import hashlib
import hmac
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

from starlette.responses import JSONResponse

log = logging.getLogger(__name__)

# Probes (kubelet), scrapes (Prometheus) and the published schema carry no key.
OPEN_PATHS = frozenset({"/health", "/live", "/metrics", "/openapi.json", "/docs",
                        "/docs/oauth2-redirect", "/redoc"})
RELOAD_CHECK_S = 5.0


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


def keys_in(path: Path) -> list[str]:
    """The keys in `path`, in order; ValueError when it holds none. (`laps bench compare` sends
    the first to the gateways it starts with this file.)"""
    keys = [line.strip() for line in path.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise ValueError(f"{path} holds no API key")
    return keys


def read_keys(path: Path) -> list[bytes]:
    """Digests of the keys in `path`; ValueError when it holds none."""
    return [_digest(key) for key in keys_in(path)]


class ApiKeys:
    """The accepted keys (as digests), from a file re-read when it changes."""

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.path, self._clock = path, clock
        self._stamp = self._stat()
        self._digests = read_keys(path)   # at start a bad file is fatal: the caller says so
        self._checked = clock()

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)   # follows the symlinks a Secret volume swaps on rotation
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _refresh(self) -> None:
        now = self._clock()
        if now - self._checked < RELOAD_CHECK_S:
            return
        self._checked = now
        stamp = self._stat()
        if stamp is None or stamp == self._stamp:
            return
        try:
            self._digests = read_keys(self.path)
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            log.warning("API keys file changed but cannot be used (%s); keeping the keys read "
                        "before", type(exc).__name__)
            return
        self._stamp = stamp
        log.info("API keys re-read from %s: %d key(s)", self.path, len(self._digests))

    def match(self, key: str) -> bytes | None:
        """The digest of `key` if it is accepted, else None (same time whichever key matched)."""
        self._refresh()
        presented = _digest(key)
        found = False
        for digest in self._digests:   # no early exit: the time says nothing about which matched
            found |= hmac.compare_digest(presented, digest)
        return presented if found else None


class RateLimiter:
    """A token bucket per key digest: `rate` requests/s, burst max(1, rate)."""

    def __init__(self, rate: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self._clock = rate, max(1.0, rate), clock
        self._buckets: dict[bytes, tuple[float, float]] = {}   # digest -> (tokens, when)

    def take(self, digest: bytes) -> int | None:
        """None when the request may go; else the seconds to wait (Retry-After, at least 1)."""
        now = self._clock()
        tokens, then = self._buckets.get(digest, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.rate)
        if tokens >= 1.0:
            self._buckets[digest] = (tokens - 1.0, now)
            return None
        self._buckets[digest] = (tokens, now)
        return max(1, math.ceil((1.0 - tokens) / self.rate))


def _bearer(headers: list[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            token = token.strip()
            return token if scheme.lower() == "bearer" and token else None
    return None


class AuthGuard:
    """ASGI middleware: every path but OPEN_PATHS needs a valid key (and a token of its bucket).
    `refuse(status, message, retry_after)` builds the error response (the app's error shape)."""

    def __init__(self, app, *, keys: ApiKeys, limiter: RateLimiter | None, metrics,
                 refuse: Callable[..., JSONResponse]) -> None:
        self.app, self.keys, self.limiter, self.metrics, self.refuse = app, keys, limiter, metrics, refuse

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        token = _bearer(scope["headers"])
        digest = self.keys.match(token) if token is not None else None
        if digest is None:
            reason = "missing" if token is None else "invalid"
            self.metrics.auth_failures.labels(reason).inc()
            # The path only: the key itself must never reach a log.
            log.debug("refused %s %s: %s API key", scope["method"], scope["path"], reason)
            response = self.refuse(401, "a valid API key is required (Authorization: Bearer <key>)"
                                   if token is None else "invalid API key")
            response.headers["www-authenticate"] = "Bearer"
            await response(scope, receive, send)
            return
        if self.limiter is not None:
            wait = self.limiter.take(digest)
            if wait is not None:
                self.metrics.rate_limited.inc()
                response = self.refuse(429, f"rate limit of {self.limiter.rate:g} requests/s per "
                                       f"API key exceeded; retry in {wait}s", retry_after=wait)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def install_auth(app, config, metrics, refuse: Callable[..., JSONResponse]) -> Callable:
    """Guard `app` when `config.api_keys_file` is set (before the drain guard is added, so a
    draining gateway answers 503 to everyone first), and publish the bearer scheme in its OpenAPI.
    Returns what wraps another ASGI app in the same guard (the identity without keys): the
    work routes, served outside the app's middleware (app.py), are guarded with it."""
    if config.api_keys_file is None:
        return lambda inner: inner
    keys = ApiKeys(Path(config.api_keys_file))
    limiter = RateLimiter(config.rate_limit_per_key) if config.rate_limit_per_key > 0 else None
    options = dict(keys=keys, limiter=limiter, metrics=metrics, refuse=refuse)
    app.add_middleware(AuthGuard, **options)
    original = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = original()
            schema.setdefault("components", {})["securitySchemes"] = {
                "apiKey": {"type": "http", "scheme": "bearer"}}
            for path, operations in schema.get("paths", {}).items():
                if path not in OPEN_PATHS:
                    for operation in operations.values():
                        operation["security"] = [{"apiKey": []}]
        return app.openapi_schema

    app.openapi = openapi
    return lambda inner: AuthGuard(inner, **options)
