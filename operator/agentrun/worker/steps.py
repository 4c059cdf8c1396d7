"""ctx.step: the retry layer inside an Attempt, and the journal of step results (see agentrun.core.steps)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

from agentrun.api import Checkpoint, CheckpointKind
from agentrun.core.steps import (
    MAX_JOURNAL_ENTRIES,
    MAX_STEP_NAME_LENGTH,
    StepRetry,
    journal_entry_name,
    step_delay,
)
from agentrun.worker.errors import (
    AgentError,
    Cancelled,
    LeaseLost,
    PermanentError,
    RateLimited,
    StateUnverifiable,
    TransientError,
)
from agentrun.worker.session import Session
from agentrun.worker.usage import UsageMeter

log = logging.getLogger("agentrun.worker")
DEFAULT_RETRY = StepRetry()


class StepFailed(AgentError):
    """A step out of retries: fails the Attempt with the class of its last error (transient or
    rate_limited, which the Run may retry with a new Attempt), naming the step."""

    def __init__(self, message: str, cause: AgentError) -> None:
        super().__init__(message)
        self.failure_class = cause.failure_class
        self.retry_after = cause.retry_after if isinstance(cause, RateLimited) else None


class Journal:
    """Where the Attempt stands for journal keys: the checkpoint it continues from, the answer it brought
    (until its next checkpoint), and how often each step was called since."""

    def __init__(self, session: Session, replays: bool, start: Checkpoint | None, answer: str | None) -> None:
        self.session = session
        self.replays = replays
        self.checkpoint = start
        self.answer = answer
        self.calls: Counter[str] = Counter()
        self.written = 0
        self._warned = False

    def moved_to(self, checkpoint: Checkpoint | None) -> None:
        """The agent stands at `checkpoint` (its latest): after a new one, keys start again from it (and
        the answer is in its state now)."""
        if checkpoint is not None and checkpoint is not self.checkpoint:
            self.checkpoint, self.answer = checkpoint, None
            self.calls.clear()
            self.written = 0

    def next_key(self, step: str) -> tuple[str, int]:
        index = self.calls[step]
        self.calls[step] += 1
        scope = self.checkpoint.spec.id if self.checkpoint else None
        return journal_entry_name(self.session.me.run, scope, self.answer, step, index), index

    async def recorded(self, name: str, step: str) -> tuple[bool, Any]:
        """(True, result) when an earlier Attempt recorded this key and this Attempt may replay it."""
        if not self.replays:
            return False, None
        entry = await self.session.read_journal(name)
        if entry is None or entry.spec.kind != CheckpointKind.JOURNAL or entry.spec.step != step:
            return False, None
        scope = self.checkpoint.spec.id if self.checkpoint else None
        if entry.spec.parent != scope or not isinstance(entry.spec.state, dict):
            return False, None
        if self.checkpoint is not None and entry.spec.lease_epoch < self.checkpoint.spec.lease_epoch:
            return False, None  # written under an older lease than the checkpoint it hangs from: stale
        ref = entry.spec.state_ref
        if ref is not None:  # a large result: in the store, read and verified
            stored = await self.session.value_of(None, ref, f"journal entry {name}")
            if not isinstance(stored, dict):
                raise StateUnverifiable(f"journal entry {name}: its blob holds no result", key=ref.key)
            return True, stored.get("result")
        return True, entry.spec.state.get("result")

    async def record(self, name: str, step: str, index: int, value: Any) -> None:
        if self.written >= MAX_JOURNAL_ENTRIES:
            if not self._warned:
                log.warning("%d journal entries since the last checkpoint: not journaling more", self.written)
                self._warned = True
            return
        await self.session.save_journal(name, step, value, index, self.checkpoint)
        self.written += 1


async def _call(fn: Callable[[], Any]) -> Any:
    value = fn()
    return await value if inspect.isawaitable(value) else value


async def run_step(
    session: Session,
    *,
    journal: Journal,
    usage: UsageMeter,
    name: str,
    fn: Callable[[], Any],
    retry: StepRetry | None,
    journaled: bool,
    retry_on: tuple[type[BaseException], ...] = (),
) -> Any:
    if not name or len(name) > MAX_STEP_NAME_LENGTH:
        raise PermanentError(f"a step name has 1 to {MAX_STEP_NAME_LENGTH} characters: {name!r}")
    policy = retry or DEFAULT_RETRY
    key, index = journal.next_key(name)
    with session.tracing.span("step", {"agentrun.step": name, "agentrun.journal": journaled}) as span:
        if journaled:
            found, value = await journal.recorded(key, name)
            if found:
                if span is not None:
                    span.set_attribute("agentrun.replayed", True)
                return value
        failed = 0
        while True:
            try:
                value = await _call(fn)
                break
            except (TransientError, RateLimited, *retry_on) as exc:  # type: ignore[misc]
                failed += 1
                cause = exc if isinstance(exc, AgentError) else TransientError(f"{type(exc).__name__}: {exc}")
                retry_after = exc.retry_after if isinstance(exc, RateLimited) else None
                wait = step_delay(policy, failed, retry_after, random.random())
                if wait is None:
                    message = f"step {name!r} failed after {failed} tries: {cause}"
                    raise StepFailed(message, cause) from exc
                usage.add(step_retries=1)
                if span is not None:
                    span.add_event("retry", {"agentrun.try": failed, "agentrun.wait_seconds": wait})
                log.info("step %s: %s; try %d in %.2fs", name, exc, failed + 1, wait)
                await _backoff(session, wait, name)
        if journaled:
            await journal.record(key, name, index, value)
        if span is not None:
            span.set_attribute("agentrun.tries", failed + 1)
        return value


async def _backoff(session: Session, seconds: float, step: str) -> None:
    """Waits, or stops at once when the Run is cancelled or the lease lost (the agent task is cancelled
    then too; this also covers a step run outside worker.main's task)."""
    stop = asyncio.ensure_future(_first(session.cancelled, session.lost))
    try:
        done, _ = await asyncio.wait({stop}, timeout=seconds)
    finally:
        stop.cancel()
    if done and session.lost.is_set():
        raise LeaseLost(f"the lease was lost while step {step!r} waited to retry")
    if done:
        raise Cancelled(f"the Run was cancelled while step {step!r} waited to retry")


async def _first(*events: asyncio.Event) -> None:
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
