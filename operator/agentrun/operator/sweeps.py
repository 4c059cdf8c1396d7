"""A sweep that runs in the background while the replica acts: the loop the operator's sweepers share
(the state store's collector, the namespaces' principals).

Started, it waits until it is `ready` (if told to), then sweeps; after each sweep, whether it did its
work or failed (`failed` is told the error; the next sweep tries again), it waits `interval_seconds` on
the runtime's Clock, or less when `nudge`d. A nudge that comes while a sweep runs is not lost: it ends
the wait that follows at once. A `failed` that raises ends the loop instead (an error its sweeper does
not survive); the loop stays ended until stopped. Started again before it is stopped, nothing changes:
one loop at a time. Stopped, the sweep under way (or the wait) is cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from agentrun.clock import Clock


class PeriodicSweep:
    """`sweep` every `interval_seconds` of `clock`, and when nudged (start/stop)."""

    def __init__(
        self,
        sweep: Callable[[], Awaitable[object]],
        *,
        name: str,
        clock: Clock,
        interval_seconds: float,
        failed: Callable[[Exception], None],
        ready: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        """name: the task's; ready: awaited once a start, before the first sweep (e.g. until the
        informers have listed)."""
        self.sweep, self.name, self.clock = sweep, name, clock
        self.interval_seconds = interval_seconds
        self.failed, self.ready = failed, ready
        self._nudged = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def nudge(self) -> None:
        """A sweep soon: the wait after the current (or last) sweep ends now."""
        self._nudged.set()

    @property
    def nudged(self) -> bool:
        """A nudge not taken in yet: each sweep takes in the nudges before it began."""
        return self._nudged.is_set()

    def start(self) -> None:
        """The loop, unless one was started and not stopped since (whether it runs or has ended)."""
        if self._task is None:
            self._task = asyncio.create_task(self._sweep_forever(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _sweep_forever(self) -> None:
        if self.ready is not None:
            await self.ready()
        while True:
            self._nudged.clear()
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # the next sweep tries again, unless `failed` raises
                self.failed(error)
            await self._next()

    async def _next(self) -> None:
        """Until the interval has passed on the clock, or a nudge."""
        waits = [
            asyncio.create_task(self.clock.sleep(self.interval_seconds)),
            asyncio.create_task(self._nudged.wait()),
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
