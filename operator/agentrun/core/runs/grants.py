"""Starting an Attempt, as Transitions: the Lease to it, the Run's status, the Attempt and its Pod; and
the refusal that comes first when its Pods may not run as the Run's ServiceAccount (not opted in, or
not bound to the attempt role)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentrun.api import (
    FINISHED_ATTEMPT_PHASES,
    RUN_LABEL,
    Attempt,
    FailureClass,
    PodGC,
    RunPhase,
    SdkRead,
    SideEffect,
    StartReason,
    attempt_name,
)
from agentrun.core.failures import fingerprint
from agentrun.core.identity import NOT_ALLOWED, ROLE_NOT_BOUND, agent_account, role_refusal
from agentrun.core.lease import epoch_for_grant
from agentrun.core.plan import CreateAttempt, CreatePod, DeletePod, SaveLogTail, WriteLease
from agentrun.core.pods import PodView, attempt_pod, owner_reference
from agentrun.core.runs import store_credentials
from agentrun.core.runs.transition import NOTHING, Transition, event, set_phase, writes
from agentrun.core.runs.world import World


def failure_fields(
    failure_class: FailureClass, reason: str, message: str, print_: str | None = None
) -> dict[str, Any]:
    """status.failure of a Run that stops for `reason` (fingerprinted from the message unless given)."""
    return {
        "class": failure_class.value,
        "reason": reason,
        "message": message[:1024],
        "fingerprint": print_ or fingerprint(failure_class, message),
    }


def account_refused(w: World, **fields: Any) -> Transition | None:
    """The Run Failed when its Pods may not run as its ServiceAccount (checked before any Lease grant,
        Attempt or Pod exists for it): not opted in, or not bound to the attempt role, whose 403 inside the
        agent would otherwise pass for the agent's own deterministic failure; or without the namespace's
    state-store credentials (StateStoreCredentialsMissing). None when they may."""
    reason, message = NOT_ALLOWED, w.account_refusal
    if message is None:
        reason, message = ROLE_NOT_BOUND, role_refusal(agent_account(w.run), w.attempt_role_denied)
    if message is None:
        # Nor can they start without the namespace's state-store credentials (a Secret deleted since).
        return store_credentials.refused(w, **fields)
    failure = failure_fields(FailureClass.DETERMINISTIC, reason, message)
    return set_phase(RunPhase.FAILED, reason, message, failure=failure, nextAttemptTime=None, **fields).then(
        event("Warning", reason, message)
    )


def grant(
    w: World,
    number: int,
    reason: str,
    input_value: Any = None,
    resume_from: str | None = None,
    *,
    phase: RunPhase = RunPhase.RUNNING,
    **status_fields: Any,
) -> Transition:
    """Lease to the new Attempt, then Run.status.leaseEpoch, then the Attempt, then its Pod. The Attempt
    continues from `resume_from`, else from the Run's latest Checkpoint."""
    # A control request that asked for this grant stays recorded; the failure replaces any cleared one.
    refused = account_refused(w, **{k: v for k, v in status_fields.items() if k != "failure"})
    if refused is not None:
        return refused
    run, status = w.run, w.run.status
    name = attempt_name(str(run.metadata.name), number)
    t = superseded_pods_deleted(w, name)
    epoch, write = epoch_for_grant(w.lease, name, status.lease_epoch or 0)
    if write:
        rv = w.lease.resource_version if w.lease else None
        t = t.then(WriteLease(name, epoch, run.spec.lease.duration_seconds, rv))
    message = f"Attempt {number} ({reason}) holds lease epoch {epoch}"
    t = t.then(
        set_phase(
            phase,
            "AttemptRunning" if phase == RunPhase.RUNNING else phase.value,
            message,
            currentAttempt=number,
            attempts=max(number, status.attempts or 0),
            leaseEpoch=epoch,
            observedCancelEpoch=run.spec.cancel_epoch,
            nextAttemptTime=None,
            **status_fields,
        )
    )
    attempt = attempt_object(
        w, number, epoch, reason, input_value, resume_from=resume_from or status.latest_checkpoint
    )
    t = t.then(CreateAttempt(attempt.to_api()), pod_created(w, attempt))
    if number > 1:  # a Run's first Attempt is no news: the Run's phase says it
        t = t.then(event("Normal", "AttemptStarted", message, name))
    return t


def superseded_pods_deleted(w: World, successor: str) -> Transition:
    """Before a new Attempt is granted, the Pods of the earlier ones go, at once (no grace): a Pod's
    bound token is refused as soon as the Pod object is gone, and the admission policies can check
    only names, so a superseded Pod must not be left holding credentials. The tail of a stopped one's log
    is kept first, if it was not yet (Run spec.podGC), as far as it can be read at once."""
    pods = [pod for pod in w.pods.values() if pod.name != successor]
    return writes(*tails_first(w, pods), *(DeletePod(pod.name, grace_seconds=0) for pod in pods))


def tails_first(w: World, pods: list[PodView]) -> list[SaveLogTail]:
    if w.run.spec.pod_gc == PodGC.NEVER:
        return []
    by_pod = {str(a.metadata.name): a for a in w.attempts.values()}
    return [
        SaveLogTail(pod.name, pod.name, best_effort=True)
        for pod in pods
        if pod.finished
        and (attempt := by_pod.get(pod.name)) is not None
        and attempt.status.phase in FINISHED_ATTEMPT_PHASES
        and attempt.status.log_tail is None
    ]


def reads_refs(attempt: Attempt) -> bool:
    """Whether the Attempt's SDK stated that it reads values in the state store by reference."""
    return SdkRead.BLOB_REFS in (attempt.status.sdk_reads or ())


def state_in_store(w: World) -> bool:
    """Whether the Run's state may be (partly) in the state store, by reference, so that an SDK that
    predates the store must not be given it: a reference seen in what the Run owns (a Checkpoint's
    stateRef, a SideEffect's resultRef, the result, a fork's source), or an earlier
    Attempt that was started so or whose SDK stated it reads references (it may have written one the
    cache shows later). Once true for a Run, it stays true: an Attempt keeps its spec."""
    run, source = w.run, w.fork_source
    from_fork = run.spec.fork_from is not None and source is not None
    return (
        run.status.result_ref is not None
        or any(a.spec.state_in_store or reads_refs(a) for a in w.attempts.values())
        or any(c.spec.state_ref is not None for c in w.checkpoints)
        or _results_stored(w.side_effects)
        or (
            from_fork
            and source is not None
            and source.checkpoint is not None
            and source.checkpoint.spec.state_ref is not None
        )
        or (from_fork and source is not None and _results_stored(source.side_effects))
    )


def _results_stored(records: Sequence[SideEffect]) -> bool:
    return any(e.status is not None and e.status.result_ref is not None for e in records)


def attempt_object(
    w: World, number: int, epoch: int, reason: str, input_value: Any, *, resume_from: str | None
) -> Attempt:
    run = w.run
    spec: dict[str, Any] = {
        "runName": run.metadata.name,
        "number": number,
        "leaseEpoch": epoch,
        "cancelEpoch": run.spec.cancel_epoch,
        "reason": reason,
    }
    if state_in_store(w):
        spec["stateInStore"] = True
    if resume_from:
        spec["resumeFrom"] = resume_from
    if input_value is not None:
        spec["input"] = input_value
    return Attempt.model_validate(
        {
            "metadata": {
                "name": attempt_name(str(run.metadata.name), number),
                "namespace": run.metadata.namespace,
                "labels": {RUN_LABEL: run.metadata.name},
                "ownerReferences": [owner_reference(run, controller=True)],
            },
            "spec": spec,
        }
    )


def pod_created(w: World, attempt: Attempt) -> Transition:
    """Creates the Attempt's Pod (idempotent: its name is the Attempt's). The Attempt keeps no phase
        until its agent runs: no phase means pending. The Pod is owned by the Attempt too; an Attempt about
        to be created has no uid yet, so the I/O layer fills in the uid the create returned. With a state
    store, the Pod is told its URL and takes the namespace's credentials from its Secret. The Run Failed
        instead when its Pods may no longer run as its ServiceAccount (e.g. the label was taken off since
        the grant: its Attempt is aborted)."""
    refused = account_refused(w)
    if refused is not None:
        return refused
    return NOTHING.then(CreatePod(attempt_pod(w.run, attempt, w.state_store)))


def attempts_in_series(w: World, number: int) -> int:
    """Attempts counted against spec.retry.maxAttempts: those since the Run last started afresh
    (its first Attempt, a resume, a manual retry), so answering a question renews the budget."""
    for n in range(number, 0, -1):
        attempt = w.attempts.get(n)
        if attempt is not None and StartReason.parse(attempt.spec.reason).fresh:
            return number - n + 1
    return number
