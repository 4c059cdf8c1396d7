"""The clock, as one object handed to whoever needs the time: the programs build one at start-up and
pass it down; tests pass a fake one and move it by hand. Pure decisions (agentrun.core) never read it:
they are given `now`."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The wall-clock time, UTC: what is written (timestamps) and compared with what others wrote."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back: durations (a lease's, a backoff's) are measured on it."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Waits `seconds` of this clock (a fake clock moves on instead)."""
        ...


class SystemClock:
    """The machine's clocks."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
