"""Small builders of what core/ decides on: Runs, Attempts, Pod and Lease views, Worlds; and readers of Plans.

Everything is fixed (names, uid, clock) so that tables of cases stay short and results are reproducible.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from agentrun.api import Attempt, AttemptFailure, Checkpoint, FailureClass, Run, SideEffect, attempt_name
from agentrun.api.run import LeaseSpec
from agentrun.core import failures
from agentrun.core.failures import ContainerExit
from agentrun.core.lease import LeaseView
from agentrun.core.ledger import side_effect_name
from agentrun.core.plan import PatchAttemptStatus, PatchRunStatus, Plan, RecordEvent
from agentrun.core.pods import PodView
from agentrun.core.runs import World
from agentrun.core.traces import run_trace

RUN = "triage"
NAMESPACE = "team-a"
RUN_UID = "0b6c1f2e-8d3a-4c55-9e21-5f0a7b9c1d2e"
TRACE_ID = run_trace(RUN_UID, None).run.trace_id  # the Run's trace (core.traces)
GENERATION = 3
RUN_RESOURCE_VERSION = "1001"
LEASE_RESOURCE_VERSION = "4711"
LEASE_SECONDS = LeaseSpec().duration_seconds  # the default spec.lease.durationSeconds
IMAGE = "agentrun/agent:dev"
CREATED = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
NOW = CREATED + timedelta(minutes=10)
EARLIER = CREATED + timedelta(minutes=1)  # when conditions were last written, in Runs that have some

A = TypeVar("A")


def ts(moment: datetime) -> str:
    """RFC 3339 in whole seconds, as the API server writes times."""
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def name_of(number: int) -> str:
    return attempt_name(RUN, number)


# ---- Runs --------------------------------------------------------------------------------------------------


def make_run(
    status: dict[str, Any] | None = None,
    *,
    spec: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
) -> Run:
    """A Run as read from the API server (defaults applied by the model), with `status` as given."""
    body: dict[str, Any] = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "Run",
        "metadata": {
            "name": RUN,
            "namespace": NAMESPACE,
            "uid": RUN_UID,
            "generation": GENERATION,
            "resourceVersion": RUN_RESOURCE_VERSION,
            "creationTimestamp": ts(CREATED),
            **(metadata or {}),
        },
        # Pods are not collected unless a test asks (spec.podGC): the table's rows show their own rule's
        # writes; Pod collection has its own tests (test_core_runs_compaction).
        "spec": {
            "agent": {"image": IMAGE, "command": ["python", "-m", "agent"]},
            "podGC": "Never",
            **(spec or {}),
        },
    }
    if status is not None:
        body["status"] = status
    return Run.model_validate(body)


def run_status(
    phase: str,
    *,
    current: int | None = None,
    lease_epoch: int = 0,
    cancel_epoch: int = 0,
    **extra: Any,
) -> dict[str, Any]:
    """status of a Run in `phase` whose latest Attempt is `current`; extra fields in camelCase."""
    status: dict[str, Any] = {
        "phase": phase,
        "observedGeneration": GENERATION,
        "attempts": current or 0,
        "leaseEpoch": lease_epoch,
        "observedCancelEpoch": cancel_epoch,
    }
    if current is not None:
        status["currentAttempt"] = current
    status.update(extra)
    return status


def committed_by(number: int, lease_epoch: int, cancel_epoch: int = 0) -> dict[str, Any]:
    return {"attempt": name_of(number), "leaseEpoch": lease_epoch, "cancelEpoch": cancel_epoch}


def pending_request(reason: str = "input_required", request_id: str = "req-1") -> dict[str, Any]:
    return {"requestId": request_id, "reason": reason, "checkpointId": "ckpt-2", "prompt": "Which one?"}


# ---- Attempts ----------------------------------------------------------------------------------------------


def failure_of(
    failure_class: FailureClass, message: str = "boom", retry_after: int | None = None
) -> AttemptFailure:
    made = failures.failure(failure_class, message, 1)
    return made.model_copy(update={"retry_after_seconds": retry_after}) if retry_after else made


def make_attempt(
    number: int,
    *,
    phase: str | None = "Running",
    lease_epoch: int | None = None,
    cancel_epoch: int = 0,
    reason: str | None = None,
    failure: AttemptFailure | None = None,
    started: bool = True,
    resume_from: str | None = None,
    input_value: Any = None,
) -> Attempt:
    """Attempt `number` as read from the API server; lease epoch `number` unless said otherwise.

    reason: "initial" for Attempt 1 and "retry:transient" for later ones unless said otherwise, so that
    Attempts 1..n make one retry series (spec.retry.maxAttempts counts them together).
    """
    if reason is None:
        reason = "initial" if number == 1 else "retry:transient"
    spec: dict[str, Any] = {
        "runName": RUN,
        "number": number,
        "leaseEpoch": number if lease_epoch is None else lease_epoch,
        "cancelEpoch": cancel_epoch,
        "reason": reason,
    }
    if resume_from:
        spec["resumeFrom"] = resume_from
    if input_value is not None:
        spec["input"] = input_value
    status: dict[str, Any] = {}
    if phase is not None:
        status = {"phase": phase, "podName": name_of(number)}
        if phase != "Pending":
            status["traceId"] = TRACE_ID  # the operator records it with the Running phase
    if started:
        status["startTime"] = ts(NOW - timedelta(minutes=5))
    if failure is not None:
        status["failure"] = failure.to_api()
        status["completionTime"] = ts(NOW - timedelta(minutes=1))
    return Attempt.model_validate(
        {
            "apiVersion": "agentrun.dev/v1alpha1",
            "kind": "Attempt",
            "metadata": {
                "name": name_of(number),
                "namespace": NAMESPACE,
                "uid": f"attempt-uid-{number}",
                "resourceVersion": f"20{number}",
            },
            "spec": spec,
            "status": status,
        }
    )


def failed_attempt(number: int, failure_class: FailureClass, message: str = "boom", **kw: Any) -> Attempt:
    return make_attempt(number, phase="Failed", failure=failure_of(failure_class, message), **kw)


# ---- SideEffects and Checkpoints --------------------------------------------------------------------------

NO_SIDE_EFFECTS = {"confirmed": 0, "compensated": 0, "unknown": 0, "irreversible": 0}


def make_side_effect(
    key: str,
    state: str | None = "Confirmed",
    *,
    tool: str = "create_ticket",
    target: str | None = None,
    reversible: bool = False,
    reference: str | None = None,
    digest: str | None = None,
    created: datetime | None = EARLIER,
    step: str | None = None,
    confirmed: datetime | None = None,
    operation_id: str | None = None,
    sends: list[dict[str, Any]] | None = None,
) -> SideEffect:
    """The ledger record of one external action, named from its key as the SDK names it; state None: the
    record has no status yet (it counts as Pending). confirmed: when its history says it became Confirmed;
    operation_id and sends as the SDK records them."""
    metadata: dict[str, Any] = {
        "name": side_effect_name(RUN, key),
        "namespace": NAMESPACE,
        "labels": {"agentrun.dev/run": RUN},
    }
    if created is not None:
        metadata["creationTimestamp"] = ts(created)
    spec: dict[str, Any] = {
        "runName": RUN,
        "tool": tool,
        "idempotencyKey": key,
        "reversible": reversible,
        "compensation": "undo_" + tool if reversible else "",
    }
    if target is not None:
        spec["target"] = target
    if digest is not None:
        spec["requestDigest"] = digest
    if step is not None:
        spec["step"] = step
    if operation_id is not None:
        spec["operationId"] = operation_id
    body: dict[str, Any] = {"apiVersion": "agentrun.dev/v1alpha1", "kind": "SideEffect", "metadata": metadata}
    body["spec"] = spec
    if state is not None:
        body["status"] = {"state": state, **({"externalReference": reference} if reference else {})}
        if confirmed is not None:
            body["status"]["history"] = [{"state": "Confirmed", "time": ts(confirmed)}]
        if sends is not None:
            body["status"]["sends"] = sends
    return SideEffect.model_validate(body)


def make_checkpoint(checkpoint_id: str, sequence: int, attempt: int = 1) -> Checkpoint:
    """A Checkpoint named by its id, as the SDK names them."""
    return Checkpoint.model_validate(
        {
            "apiVersion": "agentrun.dev/v1alpha1",
            "kind": "Checkpoint",
            "metadata": {"name": checkpoint_id, "namespace": NAMESPACE, "labels": {"agentrun.dev/run": RUN}},
            "spec": {
                "runName": RUN,
                "id": checkpoint_id,
                "sequence": sequence,
                "attempt": name_of(attempt),
                "leaseEpoch": attempt,
                "state": {"step": sequence},
            },
        }
    )


# ---- Pods and the Lease ------------------------------------------------------------------------------------


def pending_pod(number: int) -> PodView:
    return PodView(name=name_of(number), phase="Pending", deleting=False, running_since=None, exit=None)


def running_pod(number: int, *, deleting: bool = False) -> PodView:
    since = ts(NOW - timedelta(minutes=5))
    return PodView(name=name_of(number), phase="Running", deleting=deleting, running_since=since, exit=None)


def ended_pod(
    number: int,
    exit_code: int,
    *,
    message: str | None = None,
    reason: str | None = None,
    pod_reason: str | None = None,
) -> PodView:
    end = ContainerExit(exit_code=exit_code, reason=reason, message=message, pod_reason=pod_reason)
    phase = "Succeeded" if exit_code == 0 else "Failed"
    return PodView(name=name_of(number), phase=phase, deleting=False, running_since=None, exit=end)


def make_lease(
    holder: str | None, epoch: int, *, resource_version: str = LEASE_RESOURCE_VERSION
) -> LeaseView:
    return LeaseView(holder=holder, epoch=epoch, resource_version=resource_version)


def held_by(number: int, epoch: int | None = None) -> LeaseView:
    """The Lease held by Attempt `number`, at epoch `number` unless said otherwise."""
    return make_lease(name_of(number), number if epoch is None else epoch)


# ---- Worlds and Plans --------------------------------------------------------------------------------------


def make_world(
    run: Run,
    *,
    attempts: Iterable[Attempt] = (),
    pods: Iterable[PodView] = (),
    lease: LeaseView | None = None,
    now: datetime = NOW,
    expires_in: float | None = None,
    side_effects: Iterable[SideEffect] = (),
    checkpoints: Iterable[Checkpoint] = (),
    account_refusal: str | None = None,
    attempt_role_denied: tuple[str, ...] = (),
) -> World:
    return World(
        run=run,
        attempts={a.spec.number: a for a in attempts},
        pods={p.name: p for p in pods},
        lease=lease,
        now=now,
        lease_expires_in=expires_in,
        side_effects=tuple(side_effects),
        checkpoints=tuple(checkpoints),
        account_refusal=account_refusal,
        attempt_role_denied=attempt_role_denied,
    )


def kinds(plan: Plan) -> list[str]:
    """The plan's writes in order, by action type (Events left out: they change no state)."""
    return [type(a).__name__ for a in plan.actions if not isinstance(a, RecordEvent)]


def of_type(plan: Plan, kind: type[A]) -> list[A]:
    return [a for a in plan.actions if isinstance(a, kind)]


def run_patch(plan: Plan) -> dict[str, Any]:
    """The plan's one Run status patch."""
    patches = of_type(plan, PatchRunStatus)
    assert len(patches) == 1, f"expected one Run status patch, got {patches}"
    return patches[0].patch


def attempt_patches(plan: Plan) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for action in of_type(plan, PatchAttemptStatus):
        out.setdefault(action.name, []).append(action.patch)
    return out


def events(plan: Plan) -> list[tuple[str, str]]:
    return [(e.type, e.reason) for e in of_type(plan, RecordEvent)]


# The downward-API environment of the first Attempt's Pod, as the worker SDK reads it.
POD_ENV = {
    "AGENTRUN_RUN": "triage",
    "AGENTRUN_NAMESPACE": "team",
    "AGENTRUN_ATTEMPT": "triage-a1",
    "AGENTRUN_LEASE_EPOCH": "1",
    "AGENTRUN_CANCEL_EPOCH": "0",
    "AGENTRUN_RESUME_FROM": "",
    "AGENTRUN_ATTEMPT_REASON": "initial",
    "AGENTRUN_ATTEMPT_INPUT": "",
    "AGENTRUN_LEASE_RESOURCE_VERSION": "812",
}
