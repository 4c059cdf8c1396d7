"""Retry policy: whether a failed Attempt gets a successor, and after how long."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from agentrun.api import AttemptFailure, RetryPolicy

JITTER = 0.2  # each delay lands in [1 - JITTER, 1 + JITTER) of the exponential value, then is capped


@dataclass(frozen=True)
class RetryDecision:
    retry: bool
    reason: str  # CamelCase, for status and Events
    message: str
    delay_seconds: float = 0.0


def backoff_seconds(policy: RetryPolicy, failed_attempts: int, seed: str) -> float:
    """Capped exponential backoff with deterministic jitter.

    The jitter comes from a hash of (seed, failed_attempts), so many Runs failing together spread out,
    while the same Run always computes the same delay — an operator restart does not reshuffle it.
    """
    b = policy.backoff
    exponential = b.initial_seconds * b.factor ** max(failed_attempts - 1, 0)
    digest = hashlib.sha256(f"{seed}/{failed_attempts}".encode()).digest()
    unit = int.from_bytes(digest[:8], "big") / 2**64
    return float(min(exponential * (1 - JITTER + 2 * JITTER * unit), b.max_seconds))


def repeated_failures(history: Sequence[AttemptFailure | None]) -> int:
    """How many of the most recent failures (newest last) share the newest one's fingerprint."""
    if not history or history[-1] is None:
        return 0
    newest = history[-1].fingerprint
    count = 0
    for item in reversed(history):
        if item is None or item.fingerprint != newest:
            break
        count += 1
    return count


def decide_retry(
    policy: RetryPolicy, attempts_started: int, history: Sequence[AttemptFailure | None], seed: str
) -> RetryDecision:
    """history holds the failure of every ended Attempt in order (None for one that did not fail)."""
    failure = history[-1]
    assert failure is not None, "decide_retry is for a failed Attempt"
    cls = failure.failure_class
    if cls not in policy.retry_on:
        return RetryDecision(False, "NotRetryable", f"{cls} failures are not retried (spec.retry.retryOn)")
    repeats = repeated_failures(history)
    if repeats >= policy.same_error_limit:
        return RetryDecision(
            False,
            "RepeatedFailure",
            f"the same error ended {repeats} Attempts in a row (spec.retry.sameErrorLimit "
            f"{policy.same_error_limit}): retrying needs new information",
        )
    if attempts_started >= policy.max_attempts:
        return RetryDecision(
            False,
            "RetryBudgetExhausted",
            f"all {policy.max_attempts} Attempts (spec.retry.maxAttempts) failed",
        )
    delay = backoff_seconds(policy, attempts_started, seed)
    if failure.retry_after_seconds:
        delay = max(delay, float(failure.retry_after_seconds))
    return RetryDecision(True, "Retrying", f"{cls}: retrying in {delay:.1f}s", delay)
