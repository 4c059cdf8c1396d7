"""core.controls (resume, retry and pause requests: judged, recorded once per key) and core.retention."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from agentrun.api import Attempt, Checkpoint, ControlOp, ControlRecord, Run, json_digest
from agentrun.api.budgets import RESUME_VALUE_BUDGET
from agentrun.api.run import MAX_CONTROL_MESSAGE_LENGTH
from agentrun.core import controls, retention
from unit.factories import (
    EARLIER,
    NOW,
    make_attempt,
    make_checkpoint,
    make_run,
    pending_request,
    run_status,
    ts,
)

SCHEMA = {"type": "object", "required": ["choice"], "properties": {"choice": {"enum": ["a", "b"]}}}
WAITING = pending_request()  # req-1 at ckpt-2


def waiting_run(
    phase: str = "InputRequired",
    request: dict[str, Any] | None = None,
    spec: dict[str, Any] | None = None,
    **status: Any,
) -> Run:
    status.setdefault("latestCheckpoint", "ckpt-2")
    if request is not None or "pendingRequest" not in status:
        status["pendingRequest"] = request or WAITING
    return make_run(run_status(phase, current=1, lease_epoch=1, **status), spec=spec)


def resume_spec(value: Any = "a", request_id: str = "req-1", checkpoint: str = "ckpt-2") -> dict[str, Any]:
    return {
        "resume": {
            "requestId": request_id,
            "checkpointId": checkpoint,
            "value": value,
            "idempotencyKey": "k-1",
        }
    }


# ---- resume ------------------------------------------------------------------------------------------------

RESUMES: dict[str, tuple[Run, bool, str, str]] = {
    "accepted": (waiting_run(spec=resume_spec()), True, "Accepted", "req-1"),
    "accepted-auth-required": (
        waiting_run("AuthRequired", pending_request("auth_required"), resume_spec()),
        True,
        "Accepted",
        "",
    ),
    "accepted-paused": (
        waiting_run("Paused", pending_request("paused"), resume_spec()),
        True,
        "Accepted",
        "",
    ),
    "accepted-by-the-schema": (
        waiting_run(request={**WAITING, "acceptedSchema": SCHEMA}, spec=resume_spec({"choice": "b"})),
        True,
        "Accepted",
        "",
    ),
    "accepted-just-before-expiry": (
        waiting_run(request={**WAITING, "expiresAt": ts(NOW + timedelta(seconds=1))}, spec=resume_spec()),
        True,
        "Accepted",
        "",
    ),
    "running": (
        make_run(run_status("Running", current=1, lease_epoch=1), spec=resume_spec()),
        False,
        "NotWaiting",
        "Running",
    ),
    "failed": (waiting_run("Failed", spec=resume_spec()), False, "NotWaiting", "Failed"),
    "waiting-without-request": (
        make_run(run_status("InputRequired", current=1, lease_epoch=1), spec=resume_spec()),
        False,
        "NotWaiting",
        "",
    ),
    "another-request": (waiting_run(spec=resume_spec(request_id="req-2")), False, "UnknownRequest", "req-2"),
    "another-checkpoint": (waiting_run(spec=resume_spec(checkpoint="ckpt-1")), False, "StaleCheckpoint", ""),
    "latest-moved-on": (
        waiting_run(spec=resume_spec(), latestCheckpoint="ckpt-3"),
        False,
        "StaleCheckpoint",
        "ckpt-2",
    ),
    "expired-exactly-now": (
        waiting_run(request={**WAITING, "expiresAt": ts(NOW)}, spec=resume_spec()),
        False,
        "RequestExpired",
        "expired",
    ),
    "expired-and-stale": (  # the first reason found is given: the checkpoint, before the clock
        waiting_run(request={**WAITING, "expiresAt": ts(EARLIER)}, spec=resume_spec(checkpoint="ckpt-1")),
        False,
        "StaleCheckpoint",
        "",
    ),
    "schema-enum": (
        waiting_run(request={**WAITING, "acceptedSchema": SCHEMA}, spec=resume_spec({"choice": "z"})),
        False,
        "SchemaMismatch",
        "value at choice: 'z' is not one of ['a', 'b']",
    ),
    "schema-required": (
        waiting_run(request={**WAITING, "acceptedSchema": SCHEMA}, spec=resume_spec({})),
        False,
        "SchemaMismatch",
        "value at (root): 'choice' is a required property",
    ),
    "schema-null-value": (
        waiting_run(request={**WAITING, "acceptedSchema": SCHEMA}, spec=resume_spec(None)),
        False,
        "SchemaMismatch",
        "None is not of type 'object'",
    ),
    "value-over-its-budget": (  # before the schema: the Attempt that carries it could not be written
        waiting_run(
            request={**WAITING, "acceptedSchema": SCHEMA}, spec=resume_spec("x" * RESUME_VALUE_BUDGET)
        ),
        False,
        "ValueTooLarge",
        f"over its budget of {RESUME_VALUE_BUDGET} bytes: answer with a reference",
    ),
    "value-at-its-budget": (
        waiting_run(spec=resume_spec("x" * (RESUME_VALUE_BUDGET - 2))),
        True,
        "Accepted",
        "accepted",
    ),
    "schema-itself-invalid": (
        waiting_run(request={**WAITING, "acceptedSchema": {"type": 12}}, spec=resume_spec()),
        False,
        "SchemaMismatch",
        "the request's schema is invalid",
    ),
}


@pytest.mark.parametrize(("run", "accepted", "reason", "says"), RESUMES.values(), ids=RESUMES.keys())
def test_judge_resume(run: Run, accepted: bool, reason: str, says: str) -> None:
    verdict = controls.judge_resume(run, NOW)

    assert (verdict.accepted, verdict.reason) == (accepted, reason)
    assert says in verdict.message


def test_resume_digest_covers_request_checkpoint_and_value() -> None:
    def digest(**kw: Any) -> str:
        spec = resume_spec(**kw)["resume"]
        return controls.resume_digest(make_run(spec={"resume": spec}).spec.resume)  # type: ignore[arg-type]

    assert digest() == json_digest({"requestId": "req-1", "checkpointId": "ckpt-2", "value": "a"})
    assert len({digest(), digest(value="b"), digest(request_id="req-2"), digest(checkpoint="ckpt-3")}) == 4


def test_with_input_replaces_an_answer_to_the_same_request() -> None:
    earlier = [
        {
            "requestId": r,
            "checkpointId": "c",
            "digest": json_digest(r),
            "idempotencyKey": r,
            "time": ts(EARLIER),
        }
        for r in ("req-0", "req-1", "req-5")
    ]
    run = waiting_run(spec=resume_spec(), inputs=earlier)
    entries = controls.with_input(run, run.spec.resume, NOW)  # type: ignore[arg-type]

    assert [e["requestId"] for e in entries] == ["req-0", "req-5", "req-1"]
    assert entries[-1] == {
        "requestId": "req-1",
        "checkpointId": "ckpt-2",
        "digest": json_digest("a"),
        "idempotencyKey": "k-1",
        "time": ts(NOW),
    }


# ---- records -----------------------------------------------------------------------------------------------


def record(key: str) -> dict[str, Any]:
    verdict = controls.Verdict(True, "Accepted", "ok")
    return controls.control_record(ControlOp.RETRY, key, json_digest(key), verdict, NOW)


def test_control_record() -> None:
    verdict = controls.Verdict(False, "NotRetryable", "x" * 2000)
    entry = controls.control_record(ControlOp.RETRY, "k-9", json_digest(1), verdict, NOW)

    assert entry == {
        "idempotencyKey": "k-9",
        "op": "Retry",
        "digest": json_digest(1),
        "outcome": "Rejected",
        "reason": "NotRetryable",
        "message": "x" * MAX_CONTROL_MESSAGE_LENGTH,
        "time": ts(NOW),
    }
    ControlRecord.model_validate(entry)


@pytest.mark.parametrize(("earlier", "kept"), [(0, 1), (10, 11), (29, 30), (30, 30)])
def test_with_record_keeps_the_newest(earlier: int, kept: int) -> None:
    run = make_run(run_status("Failed", controls=[record(f"k-{n}") for n in range(earlier)]))
    entries = controls.with_record(run, record("new"))

    assert len(entries) == kept == min(earlier + 1, controls.MAX_RECORDS)
    assert entries[-1]["idempotencyKey"] == "new"
    if earlier:
        assert entries[-2]["idempotencyKey"] == f"k-{earlier - 1}"


def test_processed() -> None:
    run = make_run(run_status("Failed", controls=[record("k-1"), record("k-2")]))

    assert controls.processed(run, "k-2") == run.status.controls[1]  # type: ignore[index]
    assert controls.processed(run, "k-3") is None
    assert controls.processed(make_run(run_status("Failed")), "k-1") is None


# ---- manual retry ------------------------------------------------------------------------------------------


def retry_run(phase: str, from_checkpoint: str | None = None, **status: Any) -> Run:
    request: dict[str, Any] = {"idempotencyKey": "r-1", "reason": "new token"}
    if from_checkpoint:
        request["fromCheckpoint"] = from_checkpoint
    return make_run(run_status(phase, current=1, **status), spec={"retryRequest": request})


RETRIES: dict[str, tuple[Run, set[str], list[str], bool, str, str]] = {
    "failed": (
        retry_run("Failed", latestCheckpoint="c-2"),
        set(),
        [],
        True,
        "Accepted",
        "from c-2: new token",
    ),
    "needs-reconciliation": (retry_run("NeedsReconciliation"), set(), [], True, "Accepted", "the beginning"),
    "from-a-checkpoint": (retry_run("Failed", "c-1"), {"c-1", "c-2"}, [], True, "Accepted", "from c-1"),
    "running": (retry_run("Running"), set(), [], False, "NotRetryable", "Running"),
    "succeeded": (retry_run("Succeeded"), set(), [], False, "NotRetryable", "Succeeded"),
    "paused": (retry_run("Paused"), set(), [], False, "NotRetryable", "Paused"),
    "unknown-effects": (
        retry_run("NeedsReconciliation"),
        set(),
        [f"sfx-{n}" for n in range(7, 0, -1)],
        False,
        "UnresolvedSideEffects",
        "(sfx-1, sfx-2, sfx-3, sfx-4, sfx-5)",
    ),
    "unknown-checkpoint": (retry_run("Failed", "c-9"), {"c-1"}, [], False, "UnknownCheckpoint", "c-9"),
    "effects-before-checkpoint": (
        retry_run("Failed", "c-9"),
        set(),
        ["sfx-1"],
        False,
        "UnresolvedSideEffects",
        "sfx-1",
    ),
}


@pytest.mark.parametrize("case", RETRIES.values(), ids=RETRIES.keys())
def test_judge_retry(case: tuple[Run, set[str], list[str], bool, str, str]) -> None:
    """(Run, the ids of its Checkpoints, its Unknown SideEffects, accepted, reason, in the message)"""
    run, checkpoints, unknown, accepted, reason, says = case
    verdict = controls.judge_retry(run, checkpoints, unknown)

    assert (verdict.accepted, verdict.reason) == (accepted, reason)
    assert says in verdict.message


def test_retry_digest() -> None:
    assert controls.retry_digest(retry_run("Failed", "c-1")) == json_digest(
        {"fromCheckpoint": "c-1", "reason": "new token"}
    )
    assert controls.retry_digest(retry_run("Failed")) != controls.retry_digest(retry_run("Failed", "c-1"))


# ---- pause -------------------------------------------------------------------------------------------------


def pause_run(phase: str, pending: dict[str, Any] | None = None) -> Run:
    status = run_status(phase, current=1)
    if pending:
        status["pendingRequest"] = pending
    return make_run(status, spec={"pause": {"requestId": "p-1", "reason": "maintenance"}})


PAUSES: dict[str, tuple[Run, tuple[bool, str] | None]] = {
    "running": (pause_run("Running"), None),
    "queued": (pause_run("Queued"), None),
    "backing-off": (pause_run("RetryBackoff"), None),
    "paused-as-asked": (pause_run("Paused", pending_request("paused", "p-1")), (True, "Accepted")),
    "paused-for-another-request": (
        pause_run("Paused", pending_request("paused", "p-0")),
        (False, "NotRunning"),
    ),
    "waiting-for-input": (pause_run("InputRequired", pending_request()), (False, "NotRunning")),
    "cancel-requested": (pause_run("CancelRequested"), (False, "NotRunning")),
    "failed": (pause_run("Failed"), (False, "NotRunning")),
    "succeeded": (pause_run("Succeeded"), (False, "NotRunning")),
}


@pytest.mark.parametrize(("run", "verdict"), PAUSES.values(), ids=PAUSES.keys())
def test_judge_pause(run: Run, verdict: tuple[bool, str] | None) -> None:
    got = controls.judge_pause(run)
    assert (None if got is None else (got.accepted, got.reason)) == verdict


def test_pause_digest() -> None:
    assert controls.pause_digest(pause_run("Running")) == json_digest(
        {"requestId": "p-1", "reason": "maintenance"}
    )


# ---- checkpoint retention ----------------------------------------------------------------------------------

CHAIN = [make_checkpoint(f"c-{n}", n) for n in range(1, 8)]  # c-1 .. c-7, sequences 1..7


def kept_run(retention: int, latest: str | None = "c-7", pending: str | None = None) -> Run:
    status: dict[str, Any] = {}
    if latest:
        status["latestCheckpoint"] = latest
    if pending:
        status["pendingRequest"] = {**pending_request(), "checkpointId": pending}
    return make_run(run_status("Running", current=2, **status), spec={"checkpointRetention": retention})


RETENTION: dict[str, tuple[Run, list[Checkpoint], list[Attempt], list[str]]] = {
    "within-the-count": (kept_run(7), CHAIN, [], []),
    "beyond-the-count": (kept_run(4), CHAIN, [], ["c-3", "c-2", "c-1"]),
    "count-of-one": (kept_run(1), CHAIN, [], ["c-6", "c-5", "c-4", "c-3", "c-2", "c-1"]),
    "by-sequence-not-by-listing-order": (kept_run(5), list(reversed(CHAIN)), [], ["c-2", "c-1"]),
    "never-the-latest": (kept_run(2, latest="c-3"), CHAIN, [], ["c-5", "c-4", "c-2", "c-1"]),
    "never-the-pending-request": (kept_run(3, pending="c-1"), CHAIN, [], ["c-4", "c-3", "c-2"]),
    "never-a-resume-point": (
        kept_run(5),
        CHAIN,
        [make_attempt(1, resume_from="c-1"), make_attempt(2, resume_from="c-2")],
        [],
    ),
    "no-latest": (kept_run(6, latest=None), CHAIN, [], ["c-1"]),
    "no-checkpoints": (kept_run(1), [], [], []),
    "sequence-gaps": (
        kept_run(2),
        [make_checkpoint("x-10", 10), make_checkpoint("c-7", 7), make_checkpoint("x-3", 3)],
        [],
        ["x-3"],
    ),
}


@pytest.mark.parametrize(
    ("run", "checkpoints", "attempts", "pruned"), RETENTION.values(), ids=RETENTION.keys()
)
def test_prunable(
    run: Run, checkpoints: list[Checkpoint], attempts: list[Attempt], pruned: list[str]
) -> None:
    assert retention.prunable(run, checkpoints, attempts) == pruned
