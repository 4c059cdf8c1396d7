"""The operator's one scheduler: a work queue of Run keys, as in client-go.

A key is processed by one worker at a time; a key added while it is processed is processed again
afterwards; a delayed add keeps the earliest time. Errors back off per key as client-go's
ItemExponentialFailureRateLimiter does (base * 2^failures, capped; `forget` resets the count after a
success). Lease checks ride on the same queue: `check_lease_in` arms one per key (re-arming replaces
it), and when it is due the queue asks `lease_due(key)` whether a reconcile is needed after all (a
renewed Lease only moves the check on).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import Final, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
BASE_DELAY: Final = 0.005
MAX_DELAY: Final = 30.0
# Told a lease check is due: returns None to reconcile the key now, or the seconds until the next check.
LeaseDue = Callable[[K], float | None]


class WorkQueue(Generic[K]):
    def __init__(
        self,
        lease_due: LeaseDue[K] | None = None,
        base_delay: float = BASE_DELAY,
        max_delay: float = MAX_DELAY,
    ) -> None:
        self._ready: asyncio.Queue[K] = asyncio.Queue()
        self._queued: set[K] = set()
        self._active: set[K] = set()
        self._again: set[K] = set()
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._lease_timers: dict[K, asyncio.TimerHandle] = {}
        self._failures: dict[K, int] = {}
        self._lease_due = lease_due
        self.base_delay, self.max_delay = base_delay, max_delay

    def add(self, key: K, after: float = 0.0) -> None:
        if after > 0:
            loop = asyncio.get_running_loop()
            when = loop.time() + after
            timer = self._timers.get(key)
            if timer is not None and not timer.cancelled() and timer.when() <= when:
                return
            if timer is not None:
                timer.cancel()
            self._timers[key] = loop.call_at(when, self._fire, key)
            return
        if key in self._active:
            self._again.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._ready.put_nowait(key)

    def add_rate_limited(self, key: K) -> float:
        """Adds the key after its backoff (which doubles with every failure in a row); returns it."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = min(self.base_delay * 2.0**failures, self.max_delay)
        self.add(key, delay)
        return delay

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def succeeded(self, key: K) -> None:
        """The key was processed without error: its next failure backs off from the base again."""
        self._failures.pop(key, None)

    def check_lease_in(self, key: K, seconds: float | None) -> None:
        """(Re)arms the one lease check of this key; None disarms it."""
        if timer := self._lease_timers.pop(key, None):
            timer.cancel()
        if seconds is not None:
            self._lease_timers[key] = asyncio.get_running_loop().call_later(seconds, self._lease_fire, key)

    def _lease_fire(self, key: K) -> None:
        self._lease_timers.pop(key, None)
        left = self._lease_due(key) if self._lease_due is not None else None
        if left is None:
            self.add(key)
        else:
            self.check_lease_in(key, left)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> K:
        key = await self._ready.get()
        self._queued.discard(key)
        self._active.add(key)
        return key

    def done(self, key: K) -> None:
        self._active.discard(key)
        if key in self._again:
            self._again.discard(key)
            self.add(key)

    def forget(self, key: K) -> None:
        """The key is gone for good: no timer, no lease check, no failure count left."""
        if timer := self._timers.pop(key, None):
            timer.cancel()
        self.check_lease_in(key, None)
        self._failures.pop(key, None)

    def __len__(self) -> int:
        return self._ready.qsize()
