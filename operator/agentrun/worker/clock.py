"""The worker's one clock: every time the SDK reads (record times, lease and hold deadlines) comes from
the Clock its Session is built with, so that a test can pass a fake one and move it."""

from __future__ import annotations

import datetime
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime.datetime:
        """The wall time, in UTC: what records written for people carry."""
        ...

    def monotonic(self) -> float:
        """Seconds that only grow, for deadlines and intervals (never compared across processes)."""
        ...


class SystemClock:
    """The machine's clocks."""

    def now(self) -> datetime.datetime:
        return datetime.datetime.now(datetime.UTC)

    def monotonic(self) -> float:
        return time.monotonic()


def timestamp(clock: Clock, micro: bool = False) -> str:
    """The clock's wall time as the API server writes times (RFC 3339, UTC; MicroTime with micro)."""
    return clock.now().strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")
