"""The operator's one scheduler: a work queue of Run keys, as in client-go.

A key is processed by one worker at a time; a key added while it is processed is processed again
afterwards; a delayed add keeps the earliest time. Errors back off per key as client-go's
ItemExponentialFailureRateLimiter does (base * 2^failures, capped; `forget` resets the count after a
success). Lease checks ride on the same queue: `check_lease_in` arms one per key (re-arming replaces
it), and when it is due the queue asks `lease_due(key)` whether a reconcile is needed after all (a
renewed Lease only moves the check on).

Time is the injected Clock's (monotonic): every timer is a due time on it, kept in one heap and fired by
`fire_due` (the queue's timer task calls it when the earliest is due; a test moves a fake clock and
calls it), so backoffs and lease checks are tested at their real durations without waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import Callable, Hashable
from typing import Final, Generic, Literal, TypeVar

from agentrun.clock import Clock

K = TypeVar("K", bound=Hashable)
BASE_DELAY: Final = 0.005
MAX_DELAY: Final = 30.0
# Told a lease check is due: returns None to reconcile the key now, or the seconds until the next check.
LeaseDue = Callable[[K], float | None]
Kind = Literal["add", "lease"]


class WorkQueue(Generic[K]):
    def __init__(
        self,
        clock: Clock,
        lease_due: LeaseDue[K] | None = None,
        base_delay: float = BASE_DELAY,
        max_delay: float = MAX_DELAY,
    ) -> None:
        self.clock = clock
        self._ready: asyncio.Queue[K] = asyncio.Queue()
        self._queued: set[K] = set()
        self._active: set[K] = set()
        self._again: set[K] = set()
        # The armed timers, by key: when each is due (monotonic). The heap holds (due, order, kind, key);
        # an entry no longer armed (replaced, disarmed) is skipped when it comes up.
        self._timers: dict[K, float] = {}
        self._lease_timers: dict[K, float] = {}
        self._heap: list[tuple[float, int, Kind, K]] = []
        self._order = itertools.count()
        self._armed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failures: dict[K, int] = {}
        self._lease_due = lease_due
        self.base_delay, self.max_delay = base_delay, max_delay

    def add(self, key: K, after: float = 0.0) -> None:
        if after > 0:
            when = self.clock.monotonic() + after
            armed = self._timers.get(key)
            if armed is not None and armed <= when:
                return
            self._timers[key] = when
            self._arm(when, "add", key)
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
        self._lease_timers.pop(key, None)
        if seconds is not None:
            when = self.clock.monotonic() + max(seconds, 0.0)
            self._lease_timers[key] = when
            self._arm(when, "lease", key)

    def _arm(self, when: float, kind: Kind, key: K) -> None:
        heapq.heappush(self._heap, (when, next(self._order), kind, key))
        self._armed.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run_timers(), name="work-queue timers")

    def fire_due(self) -> None:
        """Fires every timer due on the clock now, earliest first. A timer armed while they fire (a lease
        check re-armed for now) waits for the next call, after those already due."""
        now, armed_before = self.clock.monotonic(), next(self._order)
        while self._heap and self._heap[0][0] <= now and self._heap[0][1] < armed_before:
            when, _, kind, key = heapq.heappop(self._heap)
            armed = self._timers if kind == "add" else self._lease_timers
            if armed.get(key) != when:
                continue  # replaced or disarmed since
            del armed[key]
            if kind == "add":
                self.add(key)
            else:
                self._lease_fire(key)

    async def _run_timers(self) -> None:
        """Sleeps until the earliest timer is due (or an earlier one is armed), then fires what is due."""
        while self._heap:
            self._armed.clear()
            wait = self._heap[0][0] - self.clock.monotonic()
            if wait > 0:
                with contextlib.suppress(TimeoutError):  # woken early: an earlier timer was armed
                    await asyncio.wait_for(self._armed.wait(), wait)
                continue
            self.fire_due()
            # a timer re-armed for now fires on the next round, as call_soon would
            await asyncio.sleep(0)  # clock-exempt: a turn of the event loop, no time waited
        self._task = None

    def _lease_fire(self, key: K) -> None:
        left = self._lease_due(key) if self._lease_due is not None else None
        if left is None:
            self.add(key)
        else:
            self.check_lease_in(key, left)

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
        self._timers.pop(key, None)
        self.check_lease_in(key, None)
        self._failures.pop(key, None)

    def stop(self) -> None:
        """Stops the timer task (the queue's keys stay)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def pause(self) -> None:
        """No timer fires from now on: each is dropped (the resync that ends a pause queues every key,
        and their reconciles arm them again). The queued keys and the failure counts stay."""
        self.stop()
        self._timers.clear()
        self._lease_timers.clear()
        self._heap.clear()

    def __len__(self) -> int:
        return self._ready.qsize()
