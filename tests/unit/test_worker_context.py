"""Which request an Attempt brings the answer to: the SDK's side of resume and of a carried answer."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.api import Attempt
from agentrun.worker.port import answered_request
from unit.factories import EARLIER, make_attempt, make_run, run_status, ts


def recorded(request_id: str, checkpoint_id: str) -> dict[str, Any]:
    digest = "sha256:" + "0" * 64
    return {
        "requestId": request_id,
        "checkpointId": checkpoint_id,
        "digest": digest,
        "idempotencyKey": f"answer-{request_id}",
        "time": ts(EARLIER),
    }


# Two answers at ckpt-2 (the same question asked twice: the newest answer counts), one at ckpt-5.
INPUTS = [recorded("req-1", "ckpt-2"), recorded("req-2", "ckpt-2"), recorded("req-3", "ckpt-5")]
CASES: dict[str, tuple[Attempt, str | None]] = {
    "a-resume-names-its-request": (make_attempt(2, reason="resume:req-3", input_value="x"), "req-3"),
    "a-retry-carrying-an-answer": (
        make_attempt(3, reason="retry:transient", resume_from="ckpt-2", input_value="x"),
        "req-2",
    ),
    "a-retry-without-an-answer": (make_attempt(3, reason="retry:transient", resume_from="ckpt-2"), None),
    "an-answer-for-no-recorded-checkpoint": (
        make_attempt(3, reason="lease_expired", resume_from="ckpt-9", input_value="x"),
        None,
    ),
    "the-first-attempt": (make_attempt(1), None),
}


@pytest.mark.parametrize(("attempt", "request_id"), CASES.values(), ids=CASES.keys())
def test_answered_request(attempt: Attempt, request_id: str | None) -> None:
    run = make_run(run_status("Running", current=attempt.spec.number, inputs=INPUTS))
    assert answered_request(run, attempt) == request_id
