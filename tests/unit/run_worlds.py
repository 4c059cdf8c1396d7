"""Worlds of Runs the state machine tests decide on (core.runs), and the Transition of a table case."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from agentrun.api import (
    Attempt,
    AttemptPhase,
    Checkpoint,
    FailureClass,
    RunPhase,
    SideEffect,
)
from agentrun.core import controls, report
from agentrun.core.lease import LeaseView
from agentrun.core.plan import (
    Plan,
)
from agentrun.core.pods import PodView
from agentrun.core.runs import World
from unit.factories import (
    EARLIER,
    NO_SIDE_EFFECTS,
    NOW,
    committed_by,
    ended_pod,
    failed_attempt,
    failure_of,
    held_by,
    make_attempt,
    make_checkpoint,
    make_run,
    make_side_effect,
    make_world,
    pending_pod,
    pending_request,
    run_patch,
    run_status,
    running_pod,
    ts,
)

GRANT = ["WriteLease", "PatchRunStatus", "CreateAttempt", "CreatePod"]
# The Attempt is marked, the Lease revoked at once (a new epoch), its Pod killed, then the Run moves on.
LEASE_LOST = ["WriteLease", "PatchRunStatus", "DeletePod", "PatchAttemptStatus"]
ADOPTED_GRANT = ["PatchRunStatus", "CreateAttempt", "CreatePod"]
# A grant after an earlier Attempt first deletes that Attempt's Pod, whose token could still write.
SUCCESSOR_GRANT = ["DeletePod", *GRANT]
CONDITION_TYPES = ["Succeeded", "Waiting", "CancelRequested", "LeaseHeld"]
FINISHED = [
    AttemptPhase.SUCCEEDED,
    AttemptPhase.FAILED,
    AttemptPhase.INTERRUPTED,
    AttemptPhase.ABORTED,
    AttemptPhase.LEASE_LOST,
    AttemptPhase.REJECTED,
]
TIMEOUT_1 = "timeout after 3012ms"
TIMEOUT_2 = "timeout after 2990ms"  # the same error as far as the fingerprint goes
LATEST_CHECKPOINT = "ckpt-7"


# ---- worlds ------------------------------------------------------------------------------------------------


def supervising(
    number: int = 1,
    *,
    pod: PodView | str | None = "running",
    attempt: Attempt | None = None,
    history: tuple[Attempt, ...] = (),
    lease: LeaseView | None = None,
    expires_in: float | None = 30.0,
    spec: dict[str, Any] | None = None,
    now: datetime = NOW,
    **status: Any,
) -> World:
    """A Run in phase Running whose current Attempt `number` holds lease epoch `number`.

    pod: "running" (the default), "pending", None (no Pod seen) or a PodView.
    """
    run = make_run(run_status("Running", current=number, lease_epoch=number, **status), spec=spec)
    if isinstance(pod, PodView):
        pods = [pod]
    else:
        pods = {"running": [running_pod(number)], "pending": [pending_pod(number)], None: []}[pod]
    return make_world(
        run,
        attempts=[*history, attempt or make_attempt(number)],
        pods=pods,
        lease=lease or held_by(number),
        expires_in=expires_in,
        now=now,
    )


def ended(number: int, code: int, message: str | None = None, **kw: Any) -> PodView:
    return ended_pod(number, code, message=message, **kw)


def sdk(failure_class: str, message: str, **extra: Any) -> str:
    return json.dumps({"class": failure_class, "message": message, **extra})


def backing_off(
    number: int = 1,
    *,
    due: datetime | None = NOW - timedelta(seconds=1),
    previous: Attempt | None = None,
    history: tuple[Attempt, ...] = (),
    lease: LeaseView | None = None,
    spec: dict[str, Any] | None = None,
    **status: Any,
) -> World:
    """A Run in RetryBackoff after its Attempt `number` failed (transient unless said otherwise)."""
    if due is not None:
        status["nextAttemptTime"] = ts(due)
    run = make_run(run_status("RetryBackoff", current=number, lease_epoch=number, **status), spec=spec)
    previous = previous or failed_attempt(number, FailureClass.TRANSIENT)
    return make_world(
        run,
        attempts=[*history, previous],
        pods=[ended(number, 75)],
        lease=lease or held_by(number),
    )


def at_rest(phase: str, number: int = 1, **status: Any) -> World:
    """A Run in `phase` after Attempt `number` ended, its Pod gone."""
    run = make_run(run_status(phase, current=number, lease_epoch=number, **status))
    attempt_phase = {"Succeeded": "Succeeded", "InputRequired": "Interrupted"}.get(phase, "Failed")
    failure = failure_of(FailureClass.DETERMINISTIC) if attempt_phase == "Failed" else None
    return make_world(run, attempts=[make_attempt(number, phase=attempt_phase, failure=failure)])


def cancelled(world: World, epoch: int = 1) -> World:
    """The same World after the user raised spec.cancelEpoch."""
    spec = world.run.spec.model_copy(update={"cancel_epoch": epoch})
    return replace(world, run=world.run.model_copy(update={"spec": spec}))


def queued(**status: Any) -> World:
    return make_world(make_run(run_status("Queued", **status)))


DEADLINE = {"deadlineSeconds": 300}  # the Run was created 600 s before NOW
ONE_IRREVERSIBLE = {"confirmed": 1, "compensated": 0, "unknown": 0, "irreversible": 1}
WAITING = pending_request("input_required")
LOST = make_attempt(1, phase="LeaseLost", failure=failure_of(FailureClass.LEASE_LOST))
NOT_STARTED = make_attempt(1, phase="Pending", started=False)


# The status of each condition (in CONDITION_TYPES order) in each phase: the same facts as the phase.
CONDITION_FACTS = {
    RunPhase.QUEUED: ["Unknown", "False", "False", "False"],
    RunPhase.RUNNING: ["Unknown", "False", "False", "True"],
    RunPhase.RETRY_BACKOFF: ["Unknown", "False", "False", "False"],
    RunPhase.INPUT_REQUIRED: ["Unknown", "True", "False", "False"],
    RunPhase.AUTH_REQUIRED: ["Unknown", "True", "False", "False"],
    RunPhase.PAUSED: ["Unknown", "True", "False", "False"],
    RunPhase.CANCEL_REQUESTED: ["Unknown", "False", "True", "True"],
    RunPhase.COMPENSATING: ["Unknown", "False", "False", "True"],
    RunPhase.CANCELLED: ["False", "False", "True", "False"],
    RunPhase.SUCCEEDED: ["True", "False", "False", "False"],
    RunPhase.FAILED: ["False", "False", "False", "False"],
    RunPhase.NEEDS_RECONCILIATION: ["False", "False", "False", "False"],
}


# (case, the ended Attempt, its Pod, Run status fields, the phase the Run moves to)
CATCHING_UP: list[tuple[str, Attempt, PodView | None, dict[str, Any], str]] = [
    ("failed-attempt", failed_attempt(1, FailureClass.TRANSIENT), ended(1, 75), {}, "RetryBackoff"),
    ("failed-attempt-pod-gone", failed_attempt(1, FailureClass.TRANSIENT), None, {}, "RetryBackoff"),
    (
        "deterministic-attempt",
        failed_attempt(1, FailureClass.DETERMINISTIC),
        ended(1, 1),
        {},
        "Failed",
    ),
    (
        "succeeded-attempt",
        make_attempt(1, phase="Succeeded"),
        ended(1, 0),
        {"committedBy": committed_by(1, 1)},
        "Succeeded",
    ),
    (
        "interrupted-attempt",
        make_attempt(1, phase="Interrupted"),
        ended(1, 0),
        {"pendingRequest": WAITING},
        "InputRequired",
    ),
    ("rejected-attempt", make_attempt(1, phase="Rejected"), ended(1, 1), {}, "RetryBackoff"),
    (
        "attempt-failed-by-the-executor",  # its Pod was refused (bad podTemplate): never created
        failed_attempt(1, FailureClass.DETERMINISTIC, "the attempt Pod was refused", started=False),
        None,
        {},
        "Failed",
    ),
]


# ---- the transition table ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Transition:
    world: World
    writes: list[str]  # action types in order, Events left out
    phase: str | None = None  # the phase the Run status patch sets; None: no Run status patch
    attempts: dict[int, str] = field(default_factory=dict)  # the phase each patched Attempt ends with
    stop_reason: str | None = None  # status.failure.reason of a Failed Run
    requeue: float | str | None = None  # "backoff": exactly until status.nextAttemptTime
    lease_check: float | None = None  # when to look again unless the Lease was renewed meanwhile
    # The exact fields of a Run status patch that sets no phase (a control record, a report refresh).
    status_fields: frozenset[str] | None = None


# ---- control requests, commits, reports and retention: worlds ----------------------------------------------

CHECKPOINT = "ckpt-2"  # where WAITING's request waits
SCHEMA = {"type": "object", "required": ["choice"], "properties": {"choice": {"enum": ["a", "b"]}}}
PAUSED = pending_request("paused", "pause-1")


def request_digest(key: str, op: str) -> str:
    """The digest of the request that spec builders below send with `key` (resume, retry_spec, ...)."""
    spec = {
        "Resume": lambda: resume(key=key),
        "Retry": lambda: retry_spec(key),
        "Pause": lambda: pause_spec(key),
    }
    run = make_run(run_status("Running"), spec=spec[op]())
    if op == "Resume":
        assert run.spec.resume is not None
        return controls.resume_digest(run.spec.resume)
    return controls.retry_digest(run) if op == "Retry" else controls.pause_digest(run)


def record(key: str, op: str, outcome: str = "Accepted", reason: str = "Accepted") -> dict[str, Any]:
    """An entry of status.controls, for the request the spec builders below send with `key`."""
    return {
        "idempotencyKey": key,
        "op": op,
        "digest": request_digest(key, op),
        "outcome": outcome,
        "reason": reason,
        "time": ts(EARLIER),
    }


def resume(
    value: Any = None, *, request_id: str = "req-1", checkpoint: str = CHECKPOINT, key: str = "answer-1"
) -> dict[str, Any]:
    """spec fields answering a request."""
    value = {"choice": "a"} if value is None else value
    return {
        "resume": {"requestId": request_id, "checkpointId": checkpoint, "value": value, "idempotencyKey": key}
    }


def retry_spec(key: str = "retry-1", from_checkpoint: str | None = None) -> dict[str, Any]:
    request: dict[str, Any] = {"idempotencyKey": key, "reason": "fixed the credentials"}
    if from_checkpoint:
        request["fromCheckpoint"] = from_checkpoint
    return {"retryRequest": request}


def pause_spec(request_id: str = "pause-1") -> dict[str, Any]:
    return {"pause": {"requestId": request_id, "reason": "maintenance window"}}


def waiting(
    phase: str = "InputRequired",
    *,
    request: dict[str, Any] | None = None,
    spec: dict[str, Any] | None = None,
    **status: Any,
) -> World:
    """A Run waiting in `phase` for `request` (WAITING) at CHECKPOINT after Attempt 1 was interrupted."""
    fields = {"latestCheckpoint": CHECKPOINT, "sideEffects": NO_SIDE_EFFECTS, **status}
    run = make_run(
        run_status(phase, current=1, lease_epoch=1, pendingRequest=request or WAITING, **fields), spec=spec
    )
    return make_world(run, attempts=[make_attempt(1, phase="Interrupted")], lease=held_by(1))


def stopped(
    phase: str = "Failed",
    *,
    spec: dict[str, Any] | None = None,
    side_effects: tuple[SideEffect, ...] = (),
    checkpoints: tuple[Checkpoint, ...] = (),
    **status: Any,
) -> World:
    """A Run that stopped in `phase` (Failed, NeedsReconciliation...) after Attempt 1 failed, its report up
    to date, the Lease still held by Attempt 1."""
    status.setdefault("sideEffects", report.side_effect_counts(side_effects))
    status.setdefault("latestCheckpoint", CHECKPOINT)
    run = make_run(run_status(phase, current=1, lease_epoch=1, **status), spec=spec)
    return make_world(
        run,
        attempts=[failed_attempt(1, FailureClass.DETERMINISTIC)],
        lease=held_by(1),
        side_effects=side_effects,
        checkpoints=checkpoints,
    )


def expiring_at(moment: datetime, request: dict[str, Any] = WAITING) -> dict[str, Any]:
    return {**request, "expiresAt": ts(moment)}


def with_checkpoints(world: World, *checkpoints: Checkpoint, retention: int | None = None) -> World:
    run = world.run
    if retention is not None:
        run = run.model_copy(update={"spec": run.spec.model_copy(update={"checkpoint_retention": retention})})
    return replace(world, run=run, checkpoints=checkpoints)


CHAIN = tuple(make_checkpoint(f"ckpt-{n}", n) for n in range(1, 6))  # ckpt-1 .. ckpt-5, sequences 1..5
UNKNOWN_EFFECT = make_side_effect("ticket-1", "Unknown")
COMMITTED: dict[str, Any] = {"committedBy": committed_by(1, 1), "result": {"ticket": "T-1"}}
# A control request recorded (refused, or a pause noted): its record and observedGeneration, nothing else.
CONTROLS = RECORD = frozenset({"controls", "observedGeneration", "spentKeys"})


REPORTING = frozenset(
    {RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.CANCELLED, RunPhase.NEEDS_RECONCILIATION}
)
EFFECTS = (
    make_side_effect("ticket-1", "Confirmed", reference="T-1", created=EARLIER),
    make_side_effect(
        "mail-1", "Compensated", tool="send_mail", reversible=True, created=EARLIER + timedelta(seconds=5)
    ),
    make_side_effect(
        "refund-1", "Unknown", tool="refund", target="order-7", created=EARLIER + timedelta(seconds=9)
    ),
)
EFFECT_COUNTS = {"confirmed": 1, "compensated": 1, "unknown": 1, "irreversible": 1}


def merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386)."""
    out = copy.deepcopy(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def next_attempt_time(plan: Plan) -> datetime:
    return datetime.fromisoformat(run_patch(plan)["nextAttemptTime"].replace("Z", "+00:00"))
