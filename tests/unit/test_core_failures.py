"""core.failures: from how an attempt container ended to a failure class, message and fingerprint."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import pytest

from agentrun.api import AttemptFailure, FailureClass
from agentrun.core.failures import ContainerExit, classify_exit, failure, fingerprint, lease_lost, pod_lost


def sdk_report(failure_class: str, message: str | None = None, **extra: Any) -> str:
    """The termination message the worker SDK writes."""
    report: dict[str, Any] = {"class": failure_class, **extra}
    if message is not None:
        report["message"] = message
    return json.dumps(report)


# ---- classification ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Exit:
    end: ContainerExit
    failure_class: FailureClass
    message: str  # a regular expression the message must match in full
    retry_after: int | None = None


def ended(
    code: int, message: str | None = None, *, reason: str | None = None, pod_reason: str | None = None
) -> ContainerExit:
    return ContainerExit(exit_code=code, reason=reason, message=message, pod_reason=pod_reason)


SDK_EXIT_CODE = {FailureClass.TRANSIENT: 75}  # the SDK exits 75 for transient failures, 1 otherwise

CLASSIFIED = {
    # The SDK's report names the class, whatever it is.
    **{
        f"sdk-{cls.value}": Exit(
            ended(SDK_EXIT_CODE.get(cls, 1), sdk_report(cls.value, f"{cls.value} went wrong")),
            cls,
            re.escape(f"{cls.value} went wrong"),
        )
        for cls in FailureClass
    },
    "sdk-rate-limited-with-retry-after": Exit(
        ended(1, sdk_report("rate_limited", "429 from the LLM API", retryAfterSeconds=30)),
        FailureClass.RATE_LIMITED,
        "429 from the LLM API",
        retry_after=30,
    ),
    "sdk-retry-after-fraction-rounds-up": Exit(
        ended(1, sdk_report("rate_limited", "slow down", retryAfterSeconds=12.2)),
        FailureClass.RATE_LIMITED,
        "slow down",
        retry_after=13,
    ),
    "sdk-retry-after-beyond-a-day-clamped": Exit(
        ended(1, sdk_report("rate_limited", "come back next week", retryAfterSeconds=7 * 86400)),
        FailureClass.RATE_LIMITED,
        "come back next week",
        retry_after=86400,
    ),
    "sdk-retry-after-negative-clamped": Exit(
        ended(1, sdk_report("rate_limited", "whenever", retryAfterSeconds=-5)),
        FailureClass.RATE_LIMITED,
        "whenever",
        retry_after=0,
    ),
    "sdk-retry-after-not-a-number-ignored": Exit(
        ended(1, sdk_report("rate_limited", "soon", retryAfterSeconds="soon")),
        FailureClass.RATE_LIMITED,
        "soon",
    ),
    "sdk-retry-after-infinite-ignored": Exit(
        ended(1, '{"class": "rate_limited", "message": "never", "retryAfterSeconds": Infinity}'),
        FailureClass.RATE_LIMITED,
        "never",
    ),
    "sdk-retry-after-boolean-ignored": Exit(
        ended(1, sdk_report("rate_limited", "yes", retryAfterSeconds=True)),
        FailureClass.RATE_LIMITED,
        "yes",
    ),
    "sdk-without-message-uses-class": Exit(
        ended(1, sdk_report("transient")), FailureClass.TRANSIENT, "transient"
    ),
    "sdk-report-wins-over-exit-75": Exit(
        ended(75, sdk_report("deterministic", "bad input")), FailureClass.DETERMINISTIC, "bad input"
    ),
    "sdk-report-wins-over-oom": Exit(
        ended(137, sdk_report("transient", "flaky"), reason="OOMKilled"), FailureClass.TRANSIENT, "flaky"
    ),
    "sdk-report-with-leading-whitespace": Exit(
        ended(1, "  \n" + sdk_report("infrastructure", "disk full")), FailureClass.INFRASTRUCTURE, "disk full"
    ),
    # What the container runtime and the kubelet say.
    "oom-killed": Exit(ended(137, reason="OOMKilled"), FailureClass.INFRASTRUCTURE, ".*OOMKilled.*"),
    "oom-killed-wins-over-log-tail": Exit(
        ended(137, "Traceback ...", reason="OOMKilled"), FailureClass.INFRASTRUCTURE, ".*OOMKilled.*"
    ),
    **{
        f"pod-{why.lower()}": Exit(
            ended(137, "The node was low on resource: memory.", pod_reason=why),
            FailureClass.INFRASTRUCTURE,
            f"the attempt Pod was {why}",
        )
        for why in ("Evicted", "NodeLost", "Preempting", "NodeShutdown")
    },
    "evicted-wins-over-exit-75": Exit(
        ended(75, pod_reason="Evicted"), FailureClass.INFRASTRUCTURE, ".*Evicted"
    ),
    # The exit code alone.
    "exit-75-transient": Exit(ended(75), FailureClass.TRANSIENT, "the agent exited with code 75"),
    "exit-75-keeps-log-tail": Exit(
        ended(75, "ConnectionResetError: peer went away"),
        FailureClass.TRANSIENT,
        "ConnectionResetError: peer went away",
    ),
    "sigkill-137": Exit(ended(137), FailureClass.INFRASTRUCTURE, ".*killed by signal 9"),
    "sigterm-143": Exit(ended(143), FailureClass.INFRASTRUCTURE, ".*killed by signal 15"),
    "sigint-130": Exit(ended(130), FailureClass.INFRASTRUCTURE, ".*killed by signal 2"),
    **{
        f"exit-{code}-deterministic": Exit(
            ended(code), FailureClass.DETERMINISTIC, f"the agent exited with code {code}"
        )
        for code in (1, 2, 126, 127, 128)
    },
    "exit-1-keeps-log-tail": Exit(
        ended(1, "KeyError: 'ticket'"), FailureClass.DETERMINISTIC, re.escape("KeyError: 'ticket'")
    ),
    # Malformed reports fall back to the exit code.
    "truncated-json-falls-back": Exit(
        ended(1, '{"class": "transient", "mess'),
        FailureClass.DETERMINISTIC,
        re.escape('{"class": "transient", "mess'),
    ),
    "unknown-class-falls-back-to-75": Exit(
        ended(75, sdk_report("cosmic_rays", "bit flip")), FailureClass.TRANSIENT, ".*cosmic_rays.*"
    ),
    "missing-class-falls-back-to-signal": Exit(
        ended(137, '{"message": "no class"}'), FailureClass.INFRASTRUCTURE, ".*signal 9"
    ),
    "null-class-falls-back": Exit(ended(2, '{"class": null}'), FailureClass.DETERMINISTIC, ".*null.*"),
    "list-class-falls-back": Exit(
        ended(2, '{"class": ["transient"]}'), FailureClass.DETERMINISTIC, ".*transient.*"
    ),
    "json-array-is-not-a-report": Exit(
        ended(75, '["transient"]'), FailureClass.TRANSIENT, re.escape('["transient"]')
    ),
}


@pytest.mark.parametrize("case", CLASSIFIED.values(), ids=CLASSIFIED.keys())
def test_classify_exit(case: Exit) -> None:
    got = classify_exit(case.end)

    assert got is not None
    assert got.failure_class == case.failure_class
    assert re.fullmatch(case.message, got.message or ""), got.message
    assert got.exit_code == case.end.exit_code
    assert got.retry_after_seconds == case.retry_after
    assert got.fingerprint


@pytest.mark.parametrize(
    "end",
    [
        ended(0),
        ended(0, ""),
        ended(0, "done, 3 tickets filed", reason="Completed"),
        ended(0, '{"class": "transient", "mess'),  # malformed report: the exit code decides
        ended(0, '{"class": "cosmic_rays"}'),
        ended(0, reason="OOMKilled"),  # the agent had finished: nothing failed
    ],
    ids=["plain", "empty-message", "log-tail", "malformed-json", "unknown-class", "oom-reason-but-exit-0"],
)
def test_exit_0_is_no_failure(end: ContainerExit) -> None:
    assert classify_exit(end) is None


def test_sdk_fingerprint_is_kept() -> None:
    got = classify_exit(ended(75, sdk_report("transient", "timeout", fingerprint="sdk-fp-1")))

    assert got is not None
    assert got.fingerprint == "sdk-fp-1"


def test_missing_sdk_fingerprint_is_computed() -> None:
    got = classify_exit(ended(75, sdk_report("transient", "timeout after 3012ms")))

    assert got is not None
    assert got.fingerprint == fingerprint(FailureClass.TRANSIENT, "timeout after 3012ms")


def test_long_messages_are_truncated() -> None:
    tail = "x" * 5000
    for end in (ended(1, tail), ended(1, sdk_report("transient", tail))):
        got = classify_exit(end)
        assert got is not None
        assert got.message == "x" * 1024


def test_failure_is_valid_api_object() -> None:
    made = failure(FailureClass.TRANSIENT, "timeout after 3012ms", 75)

    assert AttemptFailure.model_validate(made.to_api()) == made
    assert made.to_api() == {
        "class": "transient",
        "message": "timeout after 3012ms",
        "fingerprint": fingerprint(FailureClass.TRANSIENT, "timeout after 3012ms"),
        "exitCode": 75,
    }


@pytest.mark.parametrize(
    ("made", "failure_class", "message"),
    [
        (pod_lost(), FailureClass.INFRASTRUCTURE, "the attempt Pod disappeared before it finished"),
        (lease_lost(45), FailureClass.LEASE_LOST, "the worker did not renew its lease within 45s"),
    ],
    ids=["pod-lost", "lease-lost"],
)
def test_operator_observed_failures(made: AttemptFailure, failure_class: FailureClass, message: str) -> None:
    assert made.failure_class == failure_class
    assert made.message == message
    assert made.exit_code is None
    assert made.fingerprint == fingerprint(failure_class, message)


# ---- fingerprints ------------------------------------------------------------------------------------------

SAME_ERROR = {
    "milliseconds": ("timeout after 3012ms", "timeout after 2990ms"),
    "several-numbers": ("retry 3 of 5 failed after 12.5s", "retry 4 of 5 failed after 0.25s"),
    "hex-literal": ("object 0x7f3a2b9c not found", "object 0xdeadbeef not found"),
    "hex-id": ("request 5f2b9c1d7a3e failed", "request a0b1c2d3e4f5 failed"),
    "uuid": (
        "run 0b6c1f2e-8d3a-4c55-9e21-5f0a7b9c1d2e vanished",
        "run 11111111-2222-4333-8444-555555555555 vanished",
    ),
    "case-and-surrounding-space": ("  Connection Refused on port 8080\n", "connection refused on port 443"),
}


@pytest.mark.parametrize(("first", "second"), SAME_ERROR.values(), ids=SAME_ERROR.keys())
def test_fingerprint_masks_what_varies(first: str, second: str) -> None:
    assert fingerprint(FailureClass.TRANSIENT, first) == fingerprint(FailureClass.TRANSIENT, second)


DIFFERENT_ERROR = {
    "different-words": (FailureClass.TRANSIENT, "timeout", FailureClass.TRANSIENT, "connection refused"),
    "same-words-different-class": (
        FailureClass.TRANSIENT,
        "timeout after 3012ms",
        FailureClass.RATE_LIMITED,
        "timeout after 3012ms",
    ),
    "word-order": (FailureClass.DETERMINISTIC, "a failed b", FailureClass.DETERMINISTIC, "b failed a"),
}


@pytest.mark.parametrize(
    ("cls1", "msg1", "cls2", "msg2"), DIFFERENT_ERROR.values(), ids=DIFFERENT_ERROR.keys()
)
def test_fingerprint_tells_errors_apart(cls1: FailureClass, msg1: str, cls2: FailureClass, msg2: str) -> None:
    assert fingerprint(cls1, msg1) != fingerprint(cls2, msg2)


def test_fingerprint_is_short_hex() -> None:
    assert re.fullmatch(r"[0-9a-f]{16}", fingerprint(FailureClass.TRANSIENT, "timeout"))


def test_classified_log_tails_with_varying_numbers_share_a_fingerprint() -> None:
    first = classify_exit(ended(75, "timeout after 3012ms"))
    second = classify_exit(ended(75, "timeout after 2990ms"))

    assert first is not None
    assert second is not None
    assert first.fingerprint == second.fingerprint
