"""Whose eyes and hands a request of the console is: a Seat is one person's API client, watches and
permissions.

On a laptop there is one seat, the kubeconfig's user. In a cluster, behind an OIDC proxy, every
request brings its person's bearer token (in a header the proxy sets): the seat of that token reads,
watches and writes with that token alone. The console's own credentials only say where the API server
is and which CA it has; they never act for anybody, and a request without a token is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import secrets
from dataclasses import dataclass, field, replace

from agentrun.cli.cluster import SELF_SUBJECT_REVIEW, SELF_SUBJECT_REVIEWS, reviewed_user
from agentrun.cli.console import access
from agentrun.cli.console.watchcache import WatchCache
from agentrun.clock import Clock, SystemClock
from agentrun.kubeapi import ApiError, Configuration, KubeApi

IDLE_SECONDS = 15 * 60.0  # a proxied person's watches stop this long after their last request
MAX_SEATS = 200  # people served at once; the longest idle one makes room for a new one
BEARER = "bearer "


@dataclass
class Seat:
    """One person's view of the cluster, and what RBAC lets them do there."""

    api: KubeApi
    cache: WatchCache
    user: str | None
    clock: Clock
    permissions: access.Permissions = field(init=False)
    last_used: float = field(init=False)  # on the clock's monotonic clock
    streams: int = 0  # open event streams: a seat with one is never idle

    def __post_init__(self) -> None:
        self.permissions = access.Permissions(self.api, self.clock)
        self.last_used = self.clock.monotonic()


def token_from(header_value: str | None, header: str) -> str | None:
    """The bearer token in the proxy's header: `Authorization: Bearer <t>`, or the bare token of a
    header such as X-Forwarded-Access-Token. None when there is none."""
    value = (header_value or "").strip()
    if header.lower() == "authorization" or value.lower().startswith(BEARER):
        value = value[len(BEARER) :].strip() if value.lower().startswith(BEARER) else ""
    return value or None


def as_bearer(base: Configuration, token: str) -> Configuration:
    """Where the API server is and its CA, with the person's token as the only credential: a client
    certificate the console holds would otherwise be the identity the API server sees."""
    bearer = f"Bearer {token}"
    return replace(
        base,
        cert_file=None,
        key_file=None,
        cert_data=None,
        key_data=None,
        authorization=lambda: bearer,
    )


class ProxySeats:
    """The seats of the people the proxy sends, by token; idle ones are closed."""

    def __init__(
        self,
        base: Configuration,
        namespaces: list[str] | None,
        default_namespace: str,
        *,
        idle_seconds: float = IDLE_SECONDS,
        limit: int = MAX_SEATS,
        clock: Clock | None = None,
    ) -> None:
        self.base, self.namespaces, self.default_namespace = base, namespaces, default_namespace
        self.clock = clock or SystemClock()
        self.idle_seconds, self.limit = idle_seconds, limit
        self._seats: dict[str, Seat] = {}
        self._opening: dict[str, asyncio.Task[Seat]] = {}
        self._csrf_key = secrets.token_bytes(32)

    @staticmethod
    def _key(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()  # tokens are never kept as keys or logged

    async def of(self, token: str) -> Seat:
        """The token's seat, opened (who it is, what it may watch) on its first request."""
        key = self._key(token)
        seat = self._seats.get(key)
        if seat is None:
            task = self._opening.get(key)
            if task is None:
                task = self._opening[key] = asyncio.create_task(self._open(token))
            try:
                seat = await asyncio.shield(task)
            finally:
                self._opening.pop(key, None)
            self._seats[key] = seat
            await self._make_room()
        seat.last_used = self.clock.monotonic()
        return seat

    async def _open(self, token: str) -> Seat:
        api = KubeApi(as_bearer(self.base, token), threads=4)
        try:  # who the token is (the API server refuses a token it does not accept: 401)
            review = await api.create(SELF_SUBJECT_REVIEWS, SELF_SUBJECT_REVIEW)
        except ApiError:
            await api.aclose()
            raise
        user = reviewed_user(review)
        scopes = await access.scopes(api, self.namespaces, self.default_namespace)
        cache = WatchCache(api, scopes)
        cache.start()
        return Seat(api, cache, user, self.clock)

    def csrf(self, seat: Seat, token: str) -> str:
        """The CSRF token of a person's page: bound to who they are (a refreshed access token of the
        same person keeps it), else to their token."""
        subject = seat.user or self._key(token)
        return hmac.new(self._csrf_key, subject.encode(), hashlib.sha256).hexdigest()

    async def _make_room(self) -> None:
        now = self.clock.monotonic()
        idle = [k for k, s in self._seats.items() if not s.streams and now - s.last_used > self.idle_seconds]
        by_age = sorted((s.last_used, k) for k, s in self._seats.items() if k not in idle)
        extra = [k for _, k in by_age[: max(0, len(self._seats) - len(idle) - self.limit)]]
        for key in (*idle, *extra):
            await self._close(self._seats.pop(key))

    async def sweep(self) -> None:
        """Closes the seats nobody used for idle_seconds (called now and then)."""
        await self._make_room()

    @staticmethod
    async def _close(seat: Seat) -> None:
        await seat.cache.stop()
        with contextlib.suppress(Exception):
            await seat.api.aclose()

    async def close(self) -> None:
        for seat in self._seats.values():
            await self._close(seat)
        self._seats.clear()

    def __len__(self) -> int:
        return len(self._seats)
