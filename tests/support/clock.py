"""A clock the test moves by hand (agentrun.clock.Clock): durations at their real lengths, no waiting."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta


class FakeClock:
    def __init__(self, now: datetime | None = None, monotonic: float = 1000.0) -> None:
        self._now = now or datetime(2026, 1, 1, tzinfo=UTC)
        self._monotonic = monotonic

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._monotonic

    def advance(self, seconds: float) -> None:
        """Both clocks move on by `seconds`."""
        self._now += timedelta(seconds=seconds)
        self._monotonic += seconds

    async def sleep(self, seconds: float) -> None:
        """Moves on by `seconds` at once, and lets the other tasks run."""
        self.advance(seconds)
        await asyncio.sleep(0)
