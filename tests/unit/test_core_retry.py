"""core.retry: capped exponential backoff with deterministic jitter, repeats, and the retry decision."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from agentrun.api import DEFAULT_RETRY_ON, AttemptFailure, FailureClass, RetryPolicy
from agentrun.core.failures import failure
from agentrun.core.retry import JITTER, backoff_seconds, decide_retry, repeated_failures

SEED = "0b6c1f2e-8d3a-4c55-9e21-5f0a7b9c1d2e"
SEEDS = [f"run-uid-{i}" for i in range(200)]


def policy(**fields: Any) -> RetryPolicy:
    return RetryPolicy.model_validate(fields)


def backoff(initial: int = 5, factor: float = 2.0, maximum: int = 300, **fields: Any) -> RetryPolicy:
    return policy(backoff={"initialSeconds": initial, "factor": factor, "maxSeconds": maximum}, **fields)


def err(failure_class: FailureClass = FailureClass.TRANSIENT, message: str = "timeout") -> AttemptFailure:
    return failure(failure_class, message, 1)


A = err(message="timeout after 3012ms")
A_AGAIN = err(message="timeout after 2990ms")  # the same error: only the number differs
B = err(message="connection refused")
C = err(message="502 bad gateway")


# ---- backoff -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("initial", "factor", "failed", "exponential"),
    [
        (5, 2.0, 1, 5),
        (5, 2.0, 2, 10),
        (5, 2.0, 3, 20),
        (5, 2.0, 5, 80),
        (2, 3.0, 4, 54),
        (10, 1.0, 7, 10),
        (5, 2.0, 0, 5),  # defensive: no failure yet counts as the first
    ],
    ids=["first", "second", "third", "fifth", "factor-3", "factor-1-constant", "zero-failures"],
)
def test_backoff_is_exponential_within_jitter(
    initial: int, factor: float, failed: int, exponential: float
) -> None:
    p = backoff(initial, factor, maximum=86400)
    for seed in SEEDS:
        delay = backoff_seconds(p, failed, seed)
        assert exponential * (1 - JITTER) <= delay < exponential * (1 + JITTER), seed


def test_jitter_spreads_over_the_whole_band() -> None:
    p = backoff(100, 2.0, maximum=86400)
    delays = [backoff_seconds(p, 1, seed) for seed in SEEDS]

    assert min(delays) < 85 and max(delays) > 115  # close to both ends of [80, 120)
    assert len(set(delays)) == len(SEEDS)


@pytest.mark.parametrize("failed", [1, 2, 3, 4, 5, 6])
def test_backoff_grows_with_every_failure(failed: int) -> None:
    # With factor 2, even the lowest draw (0.8 * 2x) beats the highest before it (1.2x).
    p = backoff(1, 2.0, maximum=86400)
    for seed in SEEDS[:50]:
        assert backoff_seconds(p, failed + 1, seed) > backoff_seconds(p, failed, seed)


@pytest.mark.parametrize(
    ("initial", "factor", "maximum", "failed"),
    [(5, 2.0, 300, 10), (5, 2.0, 7, 2), (60, 10.0, 300, 3), (300, 2.0, 300, 1)],
    ids=["far-beyond", "just-beyond", "big-factor", "initial-at-the-cap"],
)
def test_backoff_is_capped(initial: int, factor: float, maximum: int, failed: int) -> None:
    p = backoff(initial, factor, maximum)
    delays = [backoff_seconds(p, failed, seed) for seed in SEEDS]

    assert max(delays) == maximum  # jitter never lifts a delay above the cap
    assert all(d <= maximum for d in delays)


def test_backoff_is_deterministic_per_seed_and_failure() -> None:
    p = backoff()
    for failed in (1, 2, 3):
        first = [backoff_seconds(p, failed, seed) for seed in SEEDS]
        again = [backoff_seconds(p, failed, seed) for seed in SEEDS]
        assert first == again


def test_backoff_differs_across_seeds() -> None:
    p = backoff()
    assert backoff_seconds(p, 1, "run-a") != backoff_seconds(p, 1, "run-b")


def test_jitter_is_drawn_afresh_for_every_failure() -> None:
    p = backoff(10, 1.0, maximum=86400)  # factor 1: only the jitter varies
    assert len({backoff_seconds(p, n, SEED) for n in range(1, 11)}) == 10


# ---- repeats -----------------------------------------------------------------------------------------------

REPEATS: dict[str, tuple[Sequence[AttemptFailure | None], int]] = {
    "nothing": ([], 0),
    "newest-did-not-fail": ([A, None], 0),
    "one": ([A], 1),
    "two-in-a-row": ([A, A], 2),
    "same-error-different-numbers": ([A, A_AGAIN], 2),
    "three-in-a-row": ([A, A, A], 3),
    "interleaved": ([A, B, A], 1),
    "interrupted-by-a-success": ([A, None, A], 1),
    "older-ones-differ": ([B, C, A, A], 2),
    "newest-differs": ([A, A, B], 1),
}


@pytest.mark.parametrize(("history", "count"), REPEATS.values(), ids=REPEATS.keys())
def test_repeated_failures(history: Sequence[AttemptFailure | None], count: int) -> None:
    assert repeated_failures(history) == count


def test_repeats_are_counted_per_class() -> None:
    same_text = err(FailureClass.RATE_LIMITED, "timeout after 3012ms")
    assert repeated_failures([A, same_text]) == 1


# ---- the decision ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Retry:
    policy: RetryPolicy
    attempts_started: int
    history: Sequence[AttemptFailure | None]
    retry: bool
    reason: str


NOT_RETRIED_BY_DEFAULT = [c for c in FailureClass if c not in DEFAULT_RETRY_ON]

DECISIONS: dict[str, Retry] = {
    **{f"retry-on-{c.value}": Retry(policy(), 1, [err(c)], True, "Retrying") for c in DEFAULT_RETRY_ON},
    **{
        f"not-retried-{c.value}": Retry(policy(), 1, [err(c)], False, "NotRetryable")
        for c in NOT_RETRIED_BY_DEFAULT
    },
    "class-dropped-from-retry-on": Retry(
        policy(retryOn=["transient"]), 1, [err(FailureClass.INFRASTRUCTURE)], False, "NotRetryable"
    ),
    "class-added-to-retry-on": Retry(
        policy(retryOn=["deterministic"]), 1, [err(FailureClass.DETERMINISTIC)], True, "Retrying"
    ),
    "empty-retry-on": Retry(policy(retryOn=[]), 1, [A], False, "NotRetryable"),
    "within-budget": Retry(policy(maxAttempts=3), 2, [B, A], True, "Retrying"),
    "budget-exhausted": Retry(policy(maxAttempts=3), 3, [C, B, A], False, "RetryBudgetExhausted"),
    "single-attempt-budget": Retry(policy(maxAttempts=1), 1, [A], False, "RetryBudgetExhausted"),
    "same-error-twice": Retry(policy(sameErrorLimit=2), 2, [A, A_AGAIN], False, "RepeatedFailure"),
    "same-error-not-consecutive": Retry(policy(maxAttempts=5), 3, [A, B, A], True, "Retrying"),
    "same-error-after-a-success": Retry(policy(maxAttempts=5), 3, [A, None, A], True, "Retrying"),
    "same-error-below-limit-3": Retry(policy(maxAttempts=5, sameErrorLimit=3), 2, [A, A], True, "Retrying"),
    "same-error-at-limit-3": Retry(
        policy(maxAttempts=5, sameErrorLimit=3), 3, [A, A, A], False, "RepeatedFailure"
    ),
    "limit-1-stops-at-once": Retry(policy(sameErrorLimit=1), 1, [A], False, "RepeatedFailure"),
    # When several rules stop the Run, the most specific reason is reported.
    "not-retryable-wins-over-repeats": Retry(
        policy(), 2, [err(FailureClass.DETERMINISTIC)] * 2, False, "NotRetryable"
    ),
    "repeats-win-over-budget": Retry(policy(maxAttempts=2), 2, [A, A], False, "RepeatedFailure"),
}


@pytest.mark.parametrize("case", DECISIONS.values(), ids=DECISIONS.keys())
def test_decide_retry(case: Retry) -> None:
    decision = decide_retry(case.policy, case.attempts_started, case.history, SEED)

    assert (decision.retry, decision.reason) == (case.retry, case.reason), decision.message
    if case.retry:
        assert decision.delay_seconds == backoff_seconds(case.policy, case.attempts_started, SEED)
    else:
        assert decision.delay_seconds == 0


@pytest.mark.parametrize(
    ("reason", "words"),
    [
        ("NotRetryable", "retryOn"),
        ("RetryBudgetExhausted", "maxAttempts"),
        ("RepeatedFailure", "sameErrorLimit"),
    ],
)
def test_stop_messages_name_the_setting(reason: str, words: str) -> None:
    case = next(c for c in DECISIONS.values() if c.reason == reason)
    decision = decide_retry(case.policy, case.attempts_started, case.history, SEED)
    assert words in decision.message


def test_retry_delay_follows_the_number_of_attempts() -> None:
    p = backoff(10, 3.0, 86400, maxAttempts=10)
    delays = [
        decide_retry(p, n, [C] * (n - 1) + [err(message=f"e{n}x")], SEED).delay_seconds for n in (1, 2, 3)
    ]

    assert 8 <= delays[0] < 12
    assert 24 <= delays[1] < 36
    assert 72 <= delays[2] < 108


RATE_LIMITED = {
    "raises-the-delay": (120, 120.0),
    "beyond-the-backoff-cap": (600, 600.0),
    "below-the-backoff": (1, None),  # None: the backoff's own delay stays
    "zero": (0, None),
}


@pytest.mark.parametrize(("retry_after", "expected"), RATE_LIMITED.values(), ids=RATE_LIMITED.keys())
def test_retry_after_is_a_lower_bound(retry_after: int, expected: float | None) -> None:
    p = backoff(5, 2.0, 300)
    told = err(FailureClass.RATE_LIMITED, "429").model_copy(update={"retry_after_seconds": retry_after})

    decision = decide_retry(p, 1, [told], SEED)

    assert decision.retry
    assert decision.delay_seconds == (expected if expected is not None else backoff_seconds(p, 1, SEED))
