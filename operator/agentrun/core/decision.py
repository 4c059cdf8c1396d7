"""What every Run transition builds on: the observed World, and the Decision that collects one Plan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from agentrun.api import (
    RUN_LABEL,
    Attempt,
    AttemptFailure,
    AttemptPhase,
    AttemptReason,
    Checkpoint,
    FailureClass,
    Run,
    RunPhase,
    SideEffect,
    attempt_name,
)
from agentrun.core import compensation, controls, ledger, report
from agentrun.core.conditions import TERMINAL_PHASES, conditions_for
from agentrun.core.failures import fingerprint
from agentrun.core.identity import NOT_ALLOWED
from agentrun.core.lease import LeaseView, epoch_for_grant
from agentrun.core.plan import (
    CreateAttempt,
    CreatePod,
    DeletePod,
    PatchAttemptStatus,
    PatchRunStatus,
    Plan,
    RecordEvent,
    WriteLease,
)
from agentrun.core.pods import PodView, attempt_pod, owner_reference
from agentrun.core.retry import decide_retry
from agentrun.core.traces import run_trace

FINISHED_ATTEMPT = frozenset(
    {
        AttemptPhase.SUCCEEDED,
        AttemptPhase.FAILED,
        AttemptPhase.INTERRUPTED,
        AttemptPhase.ABORTED,
        AttemptPhase.LEASE_LOST,
        AttemptPhase.REJECTED,
    }
)
# Without a sighting of the Lease yet (operator just started), look again this soon.
RECHECK_SECONDS = 5.0


@dataclass(frozen=True)
class World:
    """Everything the decision needs, as observed now."""

    run: Run
    attempts: Mapping[int, Attempt]
    pods: Mapping[str, PodView]
    lease: LeaseView | None
    now: datetime
    # Seconds before the current holder's lease expires on the operator's clock (<= 0: expired),
    # None while the operator has not seen the Lease yet.
    lease_expires_in: float | None = None
    side_effects: Sequence[SideEffect] = ()
    checkpoints: Sequence[Checkpoint] = ()
    # Why attempt Pods may not run as the Run's ServiceAccount (core.identity.account_refusal); None: they
    # may. The I/O layer looks it up whenever core.identity.may_start_pods says a Pod may be started.
    account_refusal: str | None = None

    def failure_of(self, number: int) -> AttemptFailure | None:
        attempt = self.attempts.get(number)
        return attempt.status.failure if attempt else None


def rfc3339(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class Decision:
    """Builds one Plan; helpers for the status patch every transition writes."""

    def __init__(self, world: World) -> None:
        self.w = world
        self.run = world.run
        self.status = world.run.status
        self.plan = Plan()

    # ---- writes --------------------------------------------------------------------------------------

    def set_phase(self, phase: RunPhase, reason: str, message: str, **fields: Any) -> None:
        # Cancelled or Failed under spec.compensation: first Compensating (core.compensation).
        phase, fields = compensation.redirect(self.w, phase, reason, fields)
        patch: dict[str, Any] = {
            "phase": phase.value,
            "message": message[:1024],
            "observedGeneration": self.run.metadata.generation,
            "conditions": conditions_for(
                phase,
                reason,
                message,
                generation=self.run.metadata.generation,
                previous=self.status.conditions,
                now=self.w.now,
            ),
            "sideEffects": report.side_effect_counts(self.w.side_effects),
            **fields,
        }
        if phase in TERMINAL_PHASES or phase == RunPhase.NEEDS_RECONCILIATION:
            patch["report"] = report.run_report(self.w.side_effects)
        self.plan.add(PatchRunStatus(patch))

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

    def event(self, type_: str, reason: str, message: str, attempt: str | None = None) -> None:
        assert type_ in ("Normal", "Warning")
        self.plan.add(RecordEvent(type_, reason, message, attempt))  # type: ignore[arg-type]

    @property
    def trace_id(self) -> str:
        """The Run's trace (core.traces): recorded on each Attempt with a write made anyway."""
        meta = self.run.metadata
        return run_trace(str(meta.uid or meta.name), meta.annotations).run.trace_id

    def finish_attempt(self, attempt: Attempt, phase: AttemptPhase, failure: AttemptFailure | None) -> None:
        if attempt.status.phase in FINISHED_ATTEMPT:
            return  # history is never rewritten
        patch: dict[str, Any] = {"phase": phase.value, "completionTime": rfc3339(self.w.now)}
        if failure is not None:
            patch["failure"] = failure.to_api()
        if attempt.status.trace_id is None:  # it ended before it was seen running
            patch["traceId"] = self.trace_id
        rv = attempt.metadata.resource_version
        self.plan.add(PatchAttemptStatus(str(attempt.metadata.name), patch, rv))

    # ---- transitions ---------------------------------------------------------------------------------

    def refuse_account(self, **fields: Any) -> bool:
        """Fails the Run when its Pods may not run as its ServiceAccount; checked before any Lease grant,
        Attempt or Pod exists for it. True when it did."""
        message = self.w.account_refusal
        if message is None:
            return False
        self.set_phase(
            RunPhase.FAILED,
            NOT_ALLOWED,
            message,
            failure={
                "class": FailureClass.DETERMINISTIC.value,
                "reason": NOT_ALLOWED,
                "message": message[:1024],
                "fingerprint": fingerprint(FailureClass.DETERMINISTIC, message),
            },
            nextAttemptTime=None,
            **fields,
        )
        self.event("Warning", NOT_ALLOWED, message)
        return True

    def grant(
        self,
        number: int,
        reason: str,
        input_value: Any = None,
        phase: RunPhase = RunPhase.RUNNING,
        **status_fields: Any,
    ) -> None:
        """Lease to the new Attempt, then Run.status.leaseEpoch, then the Attempt, then its Pod."""
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
        attempt = self.attempt_object(number, epoch, reason, input_value)
        self.plan.add(CreateAttempt(attempt.to_api()))
        self.ensure_pod(attempt)
        self.event("Normal", "AttemptStarted", message, name)

    def delete_superseded_pods(self, successor: str) -> None:
        """Before a new Attempt is granted, the Pods of the earlier ones go, at once (no grace): a Pod's
        bound token is refused as soon as the Pod object is gone, and the admission policies can check
        only names, so a superseded Pod must not be left holding credentials."""
        for pod in self.w.pods.values():
            if pod.name != successor:
                self.plan.add(DeletePod(pod.name, grace_seconds=0))

    def attempt_object(self, number: int, epoch: int, reason: str, input_value: Any) -> Attempt:
        run = self.run
        name = attempt_name(str(run.metadata.name), number)
        spec: dict[str, Any] = {
            "runName": run.metadata.name,
            "number": number,
            "leaseEpoch": epoch,
            "cancelEpoch": run.spec.cancel_epoch,
            "reason": reason,
        }
        if self.status.latest_checkpoint:
            spec["resumeFrom"] = self.status.latest_checkpoint
        if input_value is not None:
            spec["input"] = input_value
        return Attempt.model_validate(
            {
                "metadata": {
                    "name": name,
                    "namespace": run.metadata.namespace,
                    "labels": {RUN_LABEL: run.metadata.name},
                    "ownerReferences": [owner_reference(run, controller=True)],
                },
                "spec": spec,
            }
        )

    def ensure_pod(self, attempt: Attempt) -> None:
        # The Pod is owned by the Attempt too; an Attempt about to be created has no uid yet, so the
        # I/O layer fills in the uid the create returned (it is the same object either way).
        if self.refuse_account():  # e.g. the label was taken off since the grant: its Attempt is aborted
            return
        self.plan.add(CreatePod(attempt_pod(self.run, attempt)))
        if attempt.status.phase is None:
            self.plan.add(
                PatchAttemptStatus(
                    str(attempt.metadata.name),
                    {"phase": "Pending", "podName": attempt.metadata.name},
                    attempt.metadata.resource_version,
                )
            )

    def after_failure(self, number: int, failure: AttemptFailure, phase: AttemptPhase, **fields: Any) -> None:
        """The current Attempt failed: back off and retry, or fail the Run."""
        history = [*(self.w.failure_of(n) for n in range(1, number)), failure]
        decision = decide_retry(
            self.run.spec.retry, self.attempts_in_series(number), history, seed=str(self.run.metadata.uid)
        )
        name = attempt_name(str(self.run.metadata.name), number)
        self.event("Warning", "AttemptFailed", f"{failure.failure_class}: {failure.message}", name)
        if failure.failure_class == FailureClass.UNKNOWN_SIDE_EFFECT:
            # Never retried automatically: a retry could repeat an action that may have happened. The
            # reason is the SDK's (MaxSendsReached, ...), else read from the records (a crash).
            reason = failure.reason or ledger.unknown_reason(self.w.side_effects).value
            message = f"{failure.message}; resolve the SideEffect, then ask for a retry (spec.retryRequest)"
            self.set_phase(
                RunPhase.NEEDS_RECONCILIATION,
                reason,
                message,
                failure={
                    "class": failure.failure_class.value,
                    "reason": reason,
                    "message": (failure.message or "")[:1024],
                    "fingerprint": failure.fingerprint,
                },
                **fields,
            )
            self.event("Warning", "NeedsReconciliation", message)
            return
        if decision.retry:
            at = self.w.now + timedelta(seconds=decision.delay_seconds)
            if at.microsecond:  # status holds whole seconds: round up, so the retry never starts early
                at = at.replace(microsecond=0) + timedelta(seconds=1)
            self.set_phase(
                RunPhase.RETRY_BACKOFF,
                "RetryScheduled",
                f"Attempt {number} ended {phase.value} ({failure.failure_class}: {failure.message}); "
                f"Attempt {number + 1} starts at {rfc3339(at)}",
                nextAttemptTime=rfc3339(at),
                **fields,
            )
            self.event("Normal", "RetryScheduled", decision.message)
            self.plan.wake_in((at - self.w.now).total_seconds())
            return
        stop_reason = failure.reason or decision.reason  # the SDK's (IdempotencyKeyReused) is more precise
        self.set_phase(
            RunPhase.FAILED,
            stop_reason,
            f"{decision.message}; last failure: {failure.message}",
            failure={
                "class": failure.failure_class.value,
                "reason": stop_reason,
                "message": (failure.message or "")[:1024],
                "fingerprint": failure.fingerprint,
            },
            **fields,
        )
        self.event("Warning", decision.reason, decision.message)

    def attempts_in_series(self, number: int) -> int:
        """Attempts counted against spec.retry.maxAttempts: those since the Run last started afresh
        (its first Attempt, a resume, a manual retry), so answering a question renews the budget."""
        fresh = (AttemptReason.INITIAL, AttemptReason.MANUAL_RETRY)
        first = 1
        for n in range(number, 0, -1):
            attempt = self.w.attempts.get(n)
            if attempt is not None and (
                attempt.spec.reason in fresh or attempt.spec.reason.startswith("resume:")
            ):
                first = n
                break
        return number - first + 1
