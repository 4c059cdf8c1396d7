"""Builds the Transition of one rule: phase changes, grants, Attempt ends, as steps (core.runs.transition).

A Builder belongs to one rule's evaluation and is dropped with it: no rule sees another's Builder.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Literal

from agentrun.api import (
    FINISHED_ATTEMPT_PHASES,
    RUN_LABEL,
    Attempt,
    AttemptFailure,
    AttemptPhase,
    FailureClass,
    RunPhase,
    StartReason,
    attempt_name,
)
from agentrun.core import controls
from agentrun.core.failures import fingerprint
from agentrun.core.identity import NOT_ALLOWED
from agentrun.core.lease import epoch_for_grant
from agentrun.core.plan import (
    CreateAttempt,
    CreatePod,
    DeletePod,
    PatchRunStatus,
    RecordEvent,
    WriteLease,
)
from agentrun.core.pods import attempt_pod, owner_reference
from agentrun.core.runs.transition import EndAttempt, SetPhase, Steps, Transition, trace_of
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


class Builder:
    """Collects the steps of one rule's Transition; helpers for the steps the transitions share."""

    def __init__(self, world: World) -> None:
        self.w = world
        self.run = world.run
        self.status = world.run.status
        self.plan = Steps()

    def transition(self) -> Transition:
        return self.plan.transition()

    # ---- steps ---------------------------------------------------------------------------------------

    def set_phase(self, phase: RunPhase, reason: str, message: str, **fields: Any) -> None:
        self.plan.add(SetPhase(phase, reason, message, MappingProxyType(fields)))

    def record_control(self, record: dict[str, Any], spent: list[dict[str, Any]] | None = None) -> None:
        """A refused (or merely noted) control request: recorded (its key spent, when `spent` is the new
        status.spentKeys), and nothing else changes."""
        patch: dict[str, Any] = {
            "controls": controls.with_record(self.run, record),
            "observedGeneration": self.run.metadata.generation,
        }
        if spent is not None:
            patch["spentKeys"] = spent
        self.plan.add(PatchRunStatus(patch))

    def event(
        self, type_: Literal["Normal", "Warning"], reason: str, message: str, attempt: str | None = None
    ) -> None:
        self.plan.add(RecordEvent(type_, reason, message, attempt))

    @property
    def trace_id(self) -> str:
        """The Run's trace (core.traces): recorded on each Attempt with a write made anyway."""
        return trace_of(self.w)

    def finish_attempt(self, attempt: Attempt, phase: AttemptPhase, failure: AttemptFailure | None) -> None:
        if attempt.status.phase in FINISHED_ATTEMPT_PHASES:
            return  # history is never rewritten
        trace = (
            self.trace_id if attempt.status.trace_id is None else None
        )  # it ended before it was seen running
        rv = attempt.metadata.resource_version
        self.plan.add(EndAttempt(str(attempt.metadata.name), phase, failure, rv, trace))

    # ---- grants --------------------------------------------------------------------------------------

    def refuse_account(self, **fields: Any) -> bool:
        """Fails the Run when its Pods may not run as its ServiceAccount; checked before any Lease grant,
        Attempt or Pod exists for it. True when it did."""
        message = self.w.account_refusal
        if message is None:
            return False
        failure = failure_fields(FailureClass.DETERMINISTIC, NOT_ALLOWED, message)
        self.set_phase(RunPhase.FAILED, NOT_ALLOWED, message, failure=failure, nextAttemptTime=None, **fields)
        self.event("Warning", NOT_ALLOWED, message)
        return True

    def grant(
        self,
        number: int,
        reason: str,
        input_value: Any = None,
        resume_from: str | None = None,
        phase: RunPhase = RunPhase.RUNNING,
        **status_fields: Any,
    ) -> None:
        """Lease to the new Attempt, then Run.status.leaseEpoch, then the Attempt, then its Pod. The Attempt
        continues from `resume_from`, else from the Run's latest Checkpoint."""
        # A control request that asked for this grant stays recorded; the failure replaces any cleared one.
        if self.refuse_account(**{k: v for k, v in status_fields.items() if k != "failure"}):
            return
        run = self.run
        name = attempt_name(str(run.metadata.name), number)
        self.delete_superseded_pods(name)
        epoch, write = epoch_for_grant(self.w.lease, name)
        if write:
            rv = self.w.lease.resource_version if self.w.lease else None
            self.plan.add(WriteLease(name, epoch, run.spec.lease.duration_seconds, rv))
        message = f"Attempt {number} ({reason}) holds lease epoch {epoch}"
        self.set_phase(
            phase,
            "AttemptRunning" if phase == RunPhase.RUNNING else phase.value,
            message,
            currentAttempt=number,
            attempts=max(number, self.status.attempts or 0),
            leaseEpoch=epoch,
            observedCancelEpoch=run.spec.cancel_epoch,
            nextAttemptTime=None,
            **status_fields,
        )
        attempt = self.attempt_object(
            number, epoch, reason, input_value, resume_from or self.status.latest_checkpoint
        )
        self.plan.add(CreateAttempt(attempt.to_api()))
        self.ensure_pod(attempt)
        if number > 1:  # a Run's first Attempt is no news: the Run's phase says it
            self.event("Normal", "AttemptStarted", message, name)

    def delete_superseded_pods(self, successor: str) -> None:
        """Before a new Attempt is granted, the Pods of the earlier ones go, at once (no grace): a Pod's
        bound token is refused as soon as the Pod object is gone, and the admission policies can check
        only names, so a superseded Pod must not be left holding credentials."""
        for pod in self.w.pods.values():
            if pod.name != successor:
                self.plan.add(DeletePod(pod.name, grace_seconds=0))

    def attempt_object(
        self, number: int, epoch: int, reason: str, input_value: Any, resume_from: str | None
    ) -> Attempt:
        run = self.run
        spec: dict[str, Any] = {
            "runName": run.metadata.name,
            "number": number,
            "leaseEpoch": epoch,
            "cancelEpoch": run.spec.cancel_epoch,
            "reason": reason,
        }
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

    def ensure_pod(self, attempt: Attempt) -> None:
        """Creates the Attempt's Pod (idempotent: its name is the Attempt's). The Attempt keeps no phase
        until its agent runs: no phase means pending. The Pod is owned by the Attempt too; an Attempt about
        to be created has no uid yet, so the I/O layer fills in the uid the create returned."""
        if self.refuse_account():  # e.g. the label was taken off since the grant: its Attempt is aborted
            return
        self.plan.add(CreatePod(attempt_pod(self.run, attempt)))

    def attempts_in_series(self, number: int) -> int:
        """Attempts counted against spec.retry.maxAttempts: those since the Run last started afresh
        (its first Attempt, a resume, a manual retry), so answering a question renews the budget."""
        for n in range(number, 0, -1):
            attempt = self.w.attempts.get(n)
            if attempt is not None and StartReason.parse(attempt.spec.reason).fresh:
                return number - n + 1
        return number
