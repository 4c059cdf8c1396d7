"""ctx.step's decisions: how long to wait before a step's next try, and how journal entries are keyed.

A step is the retry layer below the Attempt: a transient error or a rate limit retries the call inside
the same Attempt (no new Pod, no reload, no new lease), with capped, jittered exponential backoff. With
journal=True its result is recorded as one Journal Checkpoint, keyed by where the agent stands: the
checkpoint it continues from, the answer it brought (if any), the step's name and its call index since
that checkpoint. An Attempt that continues after a crash, a lease loss or a retry finds the same key
and returns the recorded result; after an answer or a pause the world must be observed again, so an
Attempt started by a resume never replays.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Final

from agentrun.api import StartReason

# Per checkpoint (and answer): beyond it a step is still run, just not journaled, so a loop of journaled
# steps cannot grow the Run's Checkpoints without bound between two State checkpoints.
MAX_JOURNAL_ENTRIES: Final = 200
MAX_STEP_NAME_LENGTH: Final = 128  # Checkpoint spec.step


@dataclass(frozen=True)
class StepRetry:
    """How a step retries transient errors and rate limits: at most max_attempts calls in all, waiting
    initial_seconds, then twice as long each time, at most max_seconds (a rate limit's retry_after,
    when longer, wins)."""

    max_attempts: int = 3
    initial_seconds: float = 1.0
    max_seconds: float = 30.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.initial_seconds < 0 or self.max_seconds < self.initial_seconds:
            raise ValueError(f"invalid {self}: need max_attempts >= 1 and 0 <= initial <= max seconds")


NO_RETRY: Final = StepRetry(max_attempts=1, initial_seconds=0.0, max_seconds=0.0)


def step_delay(
    policy: StepRetry, failed_calls: int, retry_after: float | None, jitter: float
) -> float | None:
    """Seconds to wait after the `failed_calls`-th failed call (1 for the first), or None when the step
    is out of tries. jitter in [0, 1): the wait is between half and all of the capped backoff (so that
    many workers told to retry at once do not come back at once), never less than retry_after."""
    if failed_calls >= policy.max_attempts:
        return None
    capped = min(policy.max_seconds, policy.initial_seconds * 2 ** (failed_calls - 1))
    wait: float = capped * (0.5 + jitter / 2)
    return max(wait, float(retry_after or 0.0))


def journal_replays(attempt_reason: str) -> bool:
    """Whether an Attempt started for this reason returns recorded step results: only one that continues
    the same observations (after a crash, a lease loss or a retry), never one that brings an answer or
    ends a pause (resume:<requestId>), nor a first Attempt or a compensation."""
    return StartReason.parse(attempt_reason).replays_journal


def journal_entry_name(run: str, checkpoint: str | None, answer: str | None, step: str, index: int) -> str:
    """The Journal Checkpoint's name (and id): deterministic, so a replaying Attempt reads it by name and
    a second write of the same entry is an AlreadyExists, never a duplicate."""
    key = json.dumps([checkpoint or "", answer or "", step, index], separators=(",", ":"))
    return f"{run}-j{hashlib.sha256(key.encode()).hexdigest()[:24]}"
