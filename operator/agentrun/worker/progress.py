"""The agent's liveness (spec.progressTimeoutSeconds): when it last showed progress, on the Attempt's
clock. Reporting progress is a write to memory only; the lease renewal carries it (a worker whose agent
stalled stops renewing), so no API request is made per call."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from agentrun.api import FailureClass
from agentrun.worker.clock import Clock
from agentrun.worker.errors import AgentError

PROGRESS_TIMEOUT = "ProgressTimeout"


class ProgressTimeout(AgentError):
    """The agent showed no progress for spec.progressTimeoutSeconds: stopped; another Attempt may do
    better (infrastructure, retried per policy)."""

    failure_class = FailureClass.INFRASTRUCTURE
    reason = PROGRESS_TIMEOUT


class Progress:
    """When the agent last showed progress. `timeout` None: never stalls."""

    def __init__(self, clock: Clock, timeout: float | None = None) -> None:
        self.clock = clock
        self.timeout = timeout
        self._last = clock.monotonic()
        self._held = 0  # inside a hold (waiting for a person), time does not count against the agent
        self._unheld = asyncio.Event()

    def report(self) -> None:
        """Progress now (ctx.progress() and every step boundary)."""
        self._last = self.clock.monotonic()

    def remaining(self) -> float | None:
        """Seconds before the agent counts as stalled (<= 0: stalled); None while it cannot stall."""
        if self.timeout is None or self._held:
            return None
        return self._last + self.timeout - self.clock.monotonic()

    @property
    def stalled(self) -> bool:
        remaining = self.remaining()
        return remaining is not None and remaining <= 0

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """A wait for a person's answer: not a stall; the clock starts again after it."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
            self.report()
            self._unheld.set()

    async def stall(self) -> None:
        """Returns once the agent has stalled (never without a timeout)."""
        while True:
            remaining = self.remaining()
            if remaining is None:  # no timeout, or a hold: nothing to time until the hold ends
                self._unheld.clear()
                await self._unheld.wait()
            elif remaining <= 0:
                return
            else:
                await self.clock.sleep(remaining)
