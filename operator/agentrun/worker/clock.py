"""The worker's one clock: every time the SDK reads (record times, lease and hold deadlines) comes from
the Clock its Session is built with, so that a test can pass a fake one and move it. The Clock is the
one every program is given (agentrun.clock: the operator's too)."""

from __future__ import annotations

from agentrun.clock import Clock, SystemClock

__all__ = ["Clock", "SystemClock", "timestamp"]


def timestamp(clock: Clock, micro: bool = False) -> str:
    """The clock's wall time as the API server writes times (RFC 3339, UTC; MicroTime with micro)."""
    return clock.now().strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")
