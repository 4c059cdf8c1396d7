"""The Attempt's usage: counted in memory, written on the Attempt every few seconds at most and at the end.

A model call or a step costs no request: ctx.add_usage only adds in memory. The writer wakes when the
counters changed, waits FLUSH_SECONDS and writes the totals so far (absolute values, so a write repeated
or lost is harmless; only this Attempt's Pod writes them), then once more when the Attempt ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from agentrun.api import Usage
from agentrun.api.usage import MICRO
from agentrun.clock import Clock, SystemClock

log = logging.getLogger("agentrun.worker")
FLUSH_SECONDS = 5.0
Write = Callable[[Usage], Awaitable[None]]


class UsageMeter:
    def __init__(
        self, write: Write, clock: Clock | None = None, flush_seconds: float = FLUSH_SECONDS
    ) -> None:
        self._write = write
        self.clock = clock or SystemClock()
        self.flush_seconds = flush_seconds
        self.total = Usage()
        self._written = Usage()
        self._changed = asyncio.Event()
        self._lock = asyncio.Lock()
        self.writes = 0

    def add(
        self,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cost_usd: float = 0.0,
        model_calls: int = 0,
        step_retries: int = 0,
    ) -> None:
        counts = (input_tokens, output_tokens, cost_usd, model_calls, step_retries)
        if any(c < 0 for c in counts):
            raise ValueError(f"usage counters only grow: {counts}")
        self.total = self.total.plus(
            Usage(
                input_tokens=int(input_tokens),
                output_tokens=int(output_tokens),
                cost_micro_usd=round(cost_usd * MICRO),
                model_calls=int(model_calls),
                step_retries=int(step_retries),
            )
        )
        self._changed.set()

    async def flush(self) -> None:
        """Writes the totals if they changed since the last write."""
        async with self._lock:
            snapshot = self.total
            if snapshot == self._written:
                return
            await self._write(snapshot)
            self._written = snapshot
            self.writes += 1

    async def keep_flushing(self) -> None:
        """Runs beside the agent: a write at most every flush_seconds, only when something changed."""
        while True:
            await self._changed.wait()
            await self.clock.sleep(self.flush_seconds)
            self._changed.clear()
            try:
                await self.flush()
            except Exception as exc:  # usage is for people: the next flush, or the last, tries again
                log.warning("could not write usage: %s", exc)
