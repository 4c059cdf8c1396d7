"""agentrun.api.StartReason: Attempt spec.reason parsed and written back as the same wire string."""

from __future__ import annotations

import pytest

from agentrun.api import AttemptReason, FailureClass, StartKind, StartReason

WIRE = {
    "initial": StartReason(StartKind.INITIAL),
    "lease_expired": StartReason(StartKind.LEASE_EXPIRED),
    "manual_retry": StartReason(StartKind.MANUAL_RETRY),
    "compensate": StartReason(StartKind.COMPENSATE),
    "retry:transient": StartReason(StartKind.RETRY, "transient"),
    "resume:approve-refund:1": StartReason(StartKind.RESUME, "approve-refund:1"),  # ids may hold a colon
}


@pytest.mark.parametrize(("text", "reason"), WIRE.items(), ids=WIRE.keys())
def test_a_reason_round_trips(text: str, reason: StartReason) -> None:
    assert StartReason.parse(text) == reason
    assert str(reason) == text


def test_the_constructors_write_what_parse_reads() -> None:
    assert StartReason.parse(AttemptReason.resume("ask-1")).answered_request == "ask-1"
    for failure_class in FailureClass:
        assert StartReason.parse(AttemptReason.retry(failure_class)).argument == failure_class.value


@pytest.mark.parametrize("text", ["retry", "resume:", "initial:x", "restart", ""])
def test_a_malformed_reason_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"reason|StartKind|valid"):
        StartReason.parse(text)


# (reason, counts as a fresh series against maxAttempts, replays journaled steps)
TRAITS = {
    "initial": (True, False),
    "manual_retry": (True, True),
    "resume:q-1": (True, False),
    "retry:transient": (False, True),
    "lease_expired": (False, True),
    "compensate": (False, False),
}


@pytest.mark.parametrize(("text", "traits"), TRAITS.items(), ids=TRAITS.keys())
def test_what_each_reason_means(text: str, traits: tuple[bool, bool]) -> None:
    reason = StartReason.parse(text)
    assert (reason.fresh, reason.replays_journal) == traits
