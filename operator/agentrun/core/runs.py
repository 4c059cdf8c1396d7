"""The Run state machine: from what the operator observes now to the writes that move the Run on.

`decide(world)` is a pure function. It is level-based: it looks only at the current objects, never at
what happened in memory before, so an operator restart at any line simply calls it again. Every write
it asks for is idempotent (deterministic names) or preconditioned (resourceVersion), and each write
sequence is ordered so that a crash between two writes leaves a state this function continues from.
Stopping (cancel, deadline) lives in core.stopping, requests from outside in core.external.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from agentrun.api import (
    Attempt,
    AttemptFailure,
    AttemptPhase,
    AttemptReason,
    ControlOp,
    ControlOutcome,
    FailureClass,
    PendingRequest,
    RunPhase,
    RunReport,
    RunSpec,
)
from agentrun.api.budgets import POD_SPEC_BUDGET, RUN_INPUT_BUDGET, over_budget
from agentrun.api.sideeffect import MAX_HISTORY
from agentrun.api.usage import Usage, usage_sum
from agentrun.core import (
    compensation,
    controls,
    external,
    failures,
    identity,
    ledger,
    report,
    requests,
    retention,
    stopping,
)
from agentrun.core.conditions import TERMINAL_PHASES
from agentrun.core.decision import FINISHED_ATTEMPT, RECHECK_SECONDS, Decision, World, rfc3339
from agentrun.core.plan import (
    CreateAttempt,
    DeleteCheckpoint,
    DeletePod,
    PatchAttemptStatus,
    PatchRunStatus,
    PatchSideEffectStatus,
    Plan,
)
from agentrun.core.pods import PodView

__all__ = ["RECHECK_SECONDS", "World", "decide", "fail_squatted"]


def decide(world: World) -> Plan:
    d = Decision(world)
    run, status, spec = world.run, world.run.status, world.run.spec
    if run.metadata.deletion_timestamp is not None:
        return d.plan  # the garbage collector removes what the Run owns
    phase = status.phase
    if phase is None:
        d.set_phase(
            RunPhase.QUEUED,
            "Queued",
            "Waiting for its first Attempt",
            attempts=0,
            leaseEpoch=0,
            observedCancelEpoch=spec.cancel_epoch,
        )
        d.event("Normal", "Queued", "Run accepted; starting Attempt 1")
        return d.plan.wake_in(0)
    if _record_rejections(d):
        return d.plan.wake_in(0)  # decide the rest on the Attempts as recorded
    for effect, approval in ledger.approvals_to_record(
        world.side_effects, world.attempts.values(), rfc3339(world.now)
    ):
        d.plan.add(PatchSideEffectStatus(effect, {"approval": approval}))
    _prune_checkpoints(d)
    _sum_usage(d)
    current = status.current_attempt
    attempt = world.attempts.get(current) if current else None
    pod = world.pods.get(str(attempt.metadata.name)) if attempt else None
    if phase == RunPhase.COMPENSATING:
        compensation.supervise(d, attempt, pod)
        return d.plan

    committed_by = status.committed_by
    if (
        attempt is not None
        and committed_by is not None
        and committed_by.attempt == attempt.metadata.name
        and phase in (RunPhase.RUNNING, RunPhase.CANCEL_REQUESTED)
    ):
        # The commit passed the fence, so it came before any cancel or deadline: it stands.
        d.finish_attempt(attempt, AttemptPhase.SUCCEEDED, None)
        _after_attempt(d, attempt, None, phase=AttemptPhase.SUCCEEDED)
        if spec.cancel_epoch > committed_by.cancel_epoch:
            d.event("Normal", "CancelTooLate", "the result was committed before the cancel arrived")
        return d.plan
    cancelable = phase not in (RunPhase.SUCCEEDED, RunPhase.CANCELLED, RunPhase.CANCEL_REQUESTED)
    if cancelable and spec.cancel_epoch > (status.observed_cancel_epoch or 0):
        stopping.request_cancel(d, _or_promised(d, attempt), pod)
        return d.plan
    stopped = phase in TERMINAL_PHASES or phase == RunPhase.NEEDS_RECONCILIATION
    if not stopped and stopping.deadline_passed(world):
        stopping.stop_for_deadline(d, _or_promised(d, attempt), pod)
        return d.plan
    live = attempt is not None and attempt.status.phase not in FINISHED_ATTEMPT
    if phase in controls.WAITING and attempt is not None and live and _supervise_hold(d, attempt, pod):
        return d.plan
    if external.judge_requests(d, current or 0):
        return d.plan
    if stopped:
        _abort_leftovers(d)
        if phase in (RunPhase.CANCELLED, RunPhase.FAILED) and not _live_attempts(d):
            # An ended Run never leaves a record Pending: what was in flight may have happened.
            for effect, patch, version in ledger.settle_after_cancel(
                world.side_effects, rfc3339(world.now), MAX_HISTORY, failed=phase == RunPhase.FAILED
            ):
                d.plan.add(PatchSideEffectStatus(effect, patch, version))
        _refresh_report(d)
        return d.plan  # only a manual retry (spec.retryRequest) moves a Failed Run on

    if phase in controls.WAITING and status.pending_request and status.pending_request.expires_at:
        expires_at = status.pending_request.expires_at
        if world.now >= expires_at:
            external.fail_expired_request(d)
            return d.plan
        d.plan.wake_in((expires_at - world.now).total_seconds())

    if phase == RunPhase.QUEUED:
        if over := spec_over_budget(spec):
            _fail_before_start(d, *over)
        else:
            d.grant(1, AttemptReason.INITIAL)
    elif phase == RunPhase.RETRY_BACKOFF:
        due = status.next_attempt_time
        if attempt is not None and attempt.status.phase not in FINISHED_ATTEMPT:
            # Only a lease takeover writes the backoff before ending its Attempt: it was interrupted.
            lost = failures.lease_lost(spec.lease.duration_seconds)
            _finish_lost(d, attempt, pod, lost)
            d.plan.wake_in(0 if due is None else (due - world.now).total_seconds())
        elif due is None or world.now >= due:
            number = (current or 0) + 1
            d.grant(number, *_automatic_retry(world, number))
        else:
            d.plan.wake_in((due - world.now).total_seconds())
    elif phase == RunPhase.RUNNING and current:
        _supervise(d, current, attempt, pod)
    elif phase == RunPhase.CANCEL_REQUESTED:
        stopping.finish_cancel(d, attempt, pod)
    if spec.deadline_seconds and run.metadata.creation_timestamp and phase not in TERMINAL_PHASES:
        deadline = run.metadata.creation_timestamp + timedelta(seconds=spec.deadline_seconds)
        d.plan.wake_in((deadline - world.now).total_seconds())
    return d.plan


def spec_over_budget(spec: RunSpec) -> tuple[str, str] | None:
    """(reason, message) when a free-form field the operator hands on (to the agent, into the attempt
    Pod) is over its byte budget (agentrun.api.budgets)."""
    checks: list[tuple[str, str, Any, int]] = [("InputTooLarge", "spec.input", spec.input, RUN_INPUT_BUDGET)]
    if spec.agent.pod_template is not None:
        template = spec.agent.pod_template.spec
        checks.append(("PodTemplateTooLarge", "spec.agent.podTemplate.spec", template, POD_SPEC_BUDGET))
    for reason, what, value, budget in checks:
        if message := over_budget(what, value, budget):
            return reason, message
    return None


def _fail_before_start(d: Decision, reason: str, message: str) -> None:
    """A Run that cannot start as written: Failed at once, deterministic (a retry would fail the same)."""
    cls = FailureClass.DETERMINISTIC
    failure = {
        "class": cls.value,
        "reason": reason,
        "message": message,
        "fingerprint": failures.fingerprint(cls, message),
    }
    d.set_phase(RunPhase.FAILED, reason, message, failure=failure)
    d.event("Warning", reason, message)


def fail_squatted(world: World, message: str) -> Plan:
    """An object this Run needs (its Lease, an Attempt, an Attempt's Pod) exists under its name but is not
    the Run's: it is never adopted, nor written or deleted. The Run fails and says what to delete; its own
    Lease, if any, is revoked first, so no Pod, however named, writes for it any more."""
    d = Decision(world)
    if world.run.status.phase in TERMINAL_PHASES:
        return d.plan
    fields: dict[str, Any] = {}
    if world.lease is not None:
        fields["leaseEpoch"] = stopping.revoke_lease(d)
    d.set_phase(
        RunPhase.FAILED,
        identity.NAME_SQUATTED,
        message,
        failure={
            "class": FailureClass.DETERMINISTIC.value,
            "reason": identity.NAME_SQUATTED,
            "message": message[:1024],
            "fingerprint": failures.fingerprint(FailureClass.DETERMINISTIC, message),
        },
        nextAttemptTime=None,
        **fields,
    )
    d.event("Warning", identity.NAME_SQUATTED, message)
    return d.plan


def _reason_after(previous: Attempt | None, world: World) -> str:
    """Why the next Attempt starts, from how the previous one ended."""
    if previous is None:
        return AttemptReason.INITIAL
    if previous.status.phase == AttemptPhase.LEASE_LOST:
        return AttemptReason.LEASE_EXPIRED
    failure = previous.status.failure
    if failure is not None:
        return AttemptReason.retry(failure.failure_class)
    return AttemptReason.retry(FailureClass.INFRASTRUCTURE)


def _supervise(d: Decision, number: int, attempt: Attempt | None, pod: PodView | None) -> None:
    w = d.w
    if attempt is None:
        d.ensure_pod(_create_promised(d, number))
        return
    name = str(attempt.metadata.name)
    if attempt.status.phase in FINISHED_ATTEMPT:
        if attempt.status.phase == AttemptPhase.LEASE_LOST and w.lease is not None:
            # The loss was recorded and the operator stopped before the takeover: finish it first.
            failure = attempt.status.failure or failures.lease_lost(w.run.spec.lease.duration_seconds)
            _take_over(d, attempt, pod, failure)
            return
        _after_attempt(d, attempt, attempt.status.failure)
        return
    if pod is None:
        if attempt.status.start_time is None:
            d.ensure_pod(attempt)  # not created yet, or not in the cache yet: creating is idempotent
        else:
            failure = failures.pod_lost()
            d.finish_attempt(attempt, AttemptPhase.FAILED, failure)
            d.after_failure(number, failure, AttemptPhase.FAILED)
        return
    if pod.finished:
        _conclude(d, attempt, pod)
        return
    if pod.running_since and attempt.status.phase != AttemptPhase.RUNNING:
        d.plan.add(
            PatchAttemptStatus(
                name,
                {
                    "phase": "Running",
                    "startTime": pod.running_since,
                    "podName": pod.name,
                    "traceId": d.trace_id,
                },
                attempt.metadata.resource_version,
            )
        )
    pending = d.status.pending_request
    if pending is not None and pending.held_by == name:
        # The worker saved its request and holds it (hold_seconds): the Run waits, the Attempt lives on.
        message = f"waiting for request {pending.request_id} ({pending.reason.value}); {name} holds it"
        d.set_phase(_waiting_phase(pending), _waiting_phase(pending).value, message, **_expiry(d, pending))
        d.event("Normal", "Holding", message, name)
        return
    lease = w.lease
    if lease is not None and lease.holder is None and lease.epoch > attempt.spec.lease_epoch:
        # Revoked, and the operator stopped before writing the Run: finish the takeover.
        _take_over(d, attempt, pod, failures.lease_lost(w.run.spec.lease.duration_seconds))
        return
    holds_lease = lease is not None and lease.holder == name and lease.epoch == attempt.spec.lease_epoch
    if not holds_lease or w.lease_expires_in is None or not pod.running_since:
        # The lease is judged once the agent runs: image pulls and scheduling do not count against it.
        d.plan.wake_in(RECHECK_SECONDS)
    elif w.lease_expires_in <= 0:
        _take_over(d, attempt, pod, failures.lease_lost(w.run.spec.lease.duration_seconds))
    else:
        d.plan.wake_at_lease_expiry(w.lease_expires_in + 0.05)


def _take_over(d: Decision, attempt: Attempt, pod: PodView | None, failure: AttemptFailure) -> None:
    """The Attempt lost its lease. Take the lease over now, not at the next grant: a frozen worker that
    wakes up during the backoff must already find its epoch stale. The Run's status write (the new
    epoch, preconditioned) is the point that decides between the takeover and a commit racing it: the
    Attempt is marked LeaseLost only after it, so an Attempt whose commit came first is never recorded
    as having lost. Then its Pod is stopped (a takeover interrupted after the Run's write is finished
    by the backoff, _finish_lost)."""
    epoch = stopping.revoke_lease(d)
    d.after_failure(attempt.spec.number, failure, AttemptPhase.LEASE_LOST, leaseEpoch=epoch)
    _finish_lost(d, attempt, pod, failure)


def _finish_lost(d: Decision, attempt: Attempt, pod: PodView | None, failure: AttemptFailure) -> None:
    if pod is not None and not pod.finished:
        d.plan.add(DeletePod(pod.name, grace_seconds=0))
    d.finish_attempt(attempt, AttemptPhase.LEASE_LOST, failure)


def _or_promised(d: Decision, attempt: Attempt | None) -> Attempt | None:
    """The current Attempt that a stop must end: the one seen, or the one a grant promised (created now)."""
    current = d.status.current_attempt
    if attempt is None and current and d.status.phase == RunPhase.RUNNING:
        return _create_promised(d, current)
    return attempt


def _create_promised(d: Decision, number: int) -> Attempt:
    """A grant interrupted after the Run's status was written: creates the Attempt it promised (so that
    status.attempts never counts one that does not exist, even if the Run stops before it runs)."""
    reason, input_value = _promised(d.w, number)
    promised = d.attempt_object(number, d.status.lease_epoch or 0, reason, input_value)
    d.plan.add(CreateAttempt(promised.to_api()))
    return promised


def _promised(world: World, number: int) -> tuple[str, Any]:
    """(reason, input) of Attempt `number`, whose grant was interrupted before the Attempt was created.

    The grant of a resume or a manual retry writes its Accepted control record in the same status write,
    so one Accepted record more than the Attempts started for that op names the missing Attempt (exact
    while status.controls holds the whole history: it drops its oldest records beyond
    MAX_RECORDED_CONTROLS). Otherwise the grant was an automatic retry, whose reason follows from how the
    previous Attempt ended.
    """
    status, resume = world.run.status, world.run.spec.resume
    accepted = [
        c.op
        for c in status.controls or []
        if c.outcome == ControlOutcome.ACCEPTED and c.reason != controls.ACCEPTED_IN_HOLD
    ]
    reasons = [a.spec.reason for a in world.attempts.values()]
    if accepted.count(ControlOp.RETRY) > reasons.count(AttemptReason.MANUAL_RETRY):
        return AttemptReason.MANUAL_RETRY, None
    resumed = sum(reason.startswith("resume:") for reason in reasons)
    if accepted.count(ControlOp.RESUME) > resumed and status.inputs:
        answer = status.inputs[-1]  # the newest accepted input
        same = resume is not None and resume.idempotency_key == answer.idempotency_key
        return AttemptReason.resume(answer.request_id), resume.value if same and resume else None
    return _automatic_retry(world, number)


def _automatic_retry(world: World, number: int) -> tuple[str, Any]:
    """(reason, input) of Attempt `number`, which the operator starts because Attempt `number - 1` failed.

    The input is the answer the failed Attempt was given if it saved no Checkpoint after it: the retry
    continues from the same waiting point, and without the answer the agent would ask again a question
    that was already answered (and accepted). Once a newer Checkpoint exists, the state carries it on.
    """
    previous = world.attempts.get(number - 1)
    latest = world.run.status.latest_checkpoint
    carried = None
    if previous is not None and previous.spec.resume_from == latest:
        carried = previous.spec.input
    elif previous is not None and latest:
        # An answer accepted while the Attempt held its request, before it saved a newer Checkpoint.
        held = [i for i in world.run.status.inputs or [] if i.checkpoint_id == latest]
        if held and _created_by(latest, previous):
            found, value = requests.recorded_value(world.run, held[-1])
            carried = value if found else None
    return _reason_after(previous, world), carried


def _created_by(checkpoint_id: str, attempt: Attempt) -> bool:
    """Checkpoint ids are <attempt>-s<sequence> (worker.session.save_checkpoint)."""
    return checkpoint_id.startswith(f"{attempt.metadata.name}-s")


def _conclude(d: Decision, attempt: Attempt, pod: PodView) -> None:
    """The agent container ended: what did the Attempt achieve?"""
    status = d.status
    name = str(attempt.metadata.name)
    assert pod.exit is not None or pod.phase in ("Succeeded", "Failed")
    end = pod.exit or failures.ContainerExit(exit_code=0 if pod.phase == "Succeeded" else 1)
    failure = failures.classify_exit(end)
    if failure is None:
        committed = status.committed_by is not None and status.committed_by.attempt == name
        if committed:
            d.finish_attempt(attempt, AttemptPhase.SUCCEEDED, None)
            _after_attempt(d, attempt, None, phase=AttemptPhase.SUCCEEDED)
            return
        if status.pending_request is not None:
            d.finish_attempt(attempt, AttemptPhase.INTERRUPTED, None)
            _after_attempt(d, attempt, None, phase=AttemptPhase.INTERRUPTED)
            return
        failure = failures.failure(
            FailureClass.DETERMINISTIC,
            "the agent exited 0 without committing a result or an input request (use agentrun.worker)",
            0,
        )
    d.finish_attempt(attempt, AttemptPhase.FAILED, failure)
    d.after_failure(attempt.spec.number, failure, AttemptPhase.FAILED)


def _after_attempt(
    d: Decision, attempt: Attempt, failure: AttemptFailure | None, phase: AttemptPhase | None = None
) -> None:
    """Moves the Run on from an Attempt whose end is already recorded (or being recorded now)."""
    phase = phase or attempt.status.phase
    name = str(attempt.metadata.name)
    if phase == AttemptPhase.SUCCEEDED:
        d.set_phase(RunPhase.SUCCEEDED, "Succeeded", f"{name} committed the result")
        d.event("Normal", "Succeeded", f"{name} committed the result", name)
    elif phase == AttemptPhase.INTERRUPTED:
        request = d.status.pending_request
        assert request is not None
        waiting = _waiting_phase(request)
        message = f"waiting for request {request.request_id} ({request.reason.value})"
        d.set_phase(waiting, waiting.value, message, **_expiry(d, request))
        d.event("Normal", "Interrupted", message, name)
    elif failure is not None:
        d.after_failure(attempt.spec.number, failure, phase or AttemptPhase.FAILED)
    else:
        d.after_failure(attempt.spec.number, failures.pod_lost(), AttemptPhase.FAILED)


def _waiting_phase(request: PendingRequest) -> RunPhase:
    return {
        "input_required": RunPhase.INPUT_REQUIRED,
        "auth_required": RunPhase.AUTH_REQUIRED,
        "paused": RunPhase.PAUSED,
    }[request.reason.value]


def _expiry(d: Decision, request: PendingRequest) -> dict[str, Any]:
    """The request's expiresAt, on the operator's clock, from the expiresInSeconds its worker asked for
    (a worker's clock may be off by any amount; DESIGN: expiry is judged on the operator's own clock)."""
    if request.expires_in_seconds is None or request.expires_at is not None:
        return {}
    expires_at = d.w.now + timedelta(seconds=request.expires_in_seconds)
    return {"pendingRequest": {"expiresAt": rfc3339(expires_at)}}


def _supervise_hold(d: Decision, attempt: Attempt, pod: PodView | None) -> bool:
    """The Run waits while its current Attempt is still alive: it holds the request, or released it and
    is on its way out. True when the Attempt ended (recorded now) or is still leaving: the requests
    wait for that, so an answer never starts a second Attempt beside a live one."""
    name, pending, w = str(attempt.metadata.name), d.status.pending_request, d.w
    held = pending is not None and pending.held_by == name
    lease = w.lease
    expired = (
        lease is not None
        and lease.holder == name
        and w.lease_expires_in is not None
        and w.lease_expires_in <= 0
    )
    if pod is None or pod.finished or expired:
        if held:  # the hold ends with its Attempt: an answer now starts a new one
            d.plan.add(PatchRunStatus({"pendingRequest": {"heldBy": None}}))
        if expired:
            if pod is not None and not pod.finished:
                d.plan.add(DeletePod(pod.name, grace_seconds=0))
            lost = failures.lease_lost(w.run.spec.lease.duration_seconds)
            d.finish_attempt(attempt, AttemptPhase.LEASE_LOST, lost)
        elif pod is None:
            d.finish_attempt(attempt, AttemptPhase.FAILED, failures.pod_lost())
        else:
            end = pod.exit or failures.ContainerExit(exit_code=0 if pod.phase == "Succeeded" else 1)
            failure = failures.classify_exit(end)
            # The request stands either way: the Run keeps waiting for its answer.
            phase = AttemptPhase.INTERRUPTED if failure is None else AttemptPhase.FAILED
            d.finish_attempt(attempt, phase, failure)
        return True
    if held:
        if w.lease_expires_in is not None:
            d.plan.wake_at_lease_expiry(w.lease_expires_in + 0.05)
        else:
            d.plan.wake_in(RECHECK_SECONDS)
        return False
    d.plan.wake_in(RECHECK_SECONDS)  # released: its Pod's end wakes us sooner
    return True


def _record_rejections(d: Decision) -> bool:
    """Attempts whose worker recorded a refused commit (rejectedCommit, the one thing it may write on its
    Attempt besides usage) are marked Rejected by the operator. True if any was."""
    marked = False
    for attempt in d.w.attempts.values():
        if attempt.status.rejected_commit is None or attempt.status.phase in (
            AttemptPhase.REJECTED,
            AttemptPhase.SUCCEEDED,
        ):
            continue
        patch: dict[str, Any] = {"phase": AttemptPhase.REJECTED.value}
        if attempt.status.completion_time is None:
            patch["completionTime"] = rfc3339(d.w.now)
        name = str(attempt.metadata.name)
        d.plan.add(PatchAttemptStatus(name, patch, attempt.metadata.resource_version))
        marked = True
    return marked


def _abort_leftovers(d: Decision) -> None:
    """A stopped Run has no Attempt still going. One its stop did not see (its grant raced with a cancel,
    or the operator's cache did not hold it yet) is aborted now and its Pod stopped: its writes are
    fenced off already, and its history must not read as if it were still running."""
    phase = d.status.phase.value if d.status.phase else "stopped"
    stop = d.status.failure
    for attempt in d.w.attempts.values():
        if attempt.status.phase in FINISHED_ATTEMPT:
            continue
        pod = d.w.pods.get(str(attempt.metadata.name))
        if (
            stop
            and stop.failure_class == FailureClass.LEASE_LOST
            and attempt.spec.number == d.status.current_attempt
        ):
            # The takeover that failed the Run was interrupted before it ended its Attempt.
            _finish_lost(d, attempt, pod, failures.lease_lost(d.run.spec.lease.duration_seconds))
            continue
        message = f"the Run was {phase} before this Attempt finished"
        d.finish_attempt(attempt, AttemptPhase.ABORTED, failures.failure(FailureClass.CANCELLED, message))
        if pod is not None and not pod.finished and not pod.deleting:
            d.plan.add(DeletePod(pod.name))


def _live_attempts(d: Decision) -> bool:
    """Whether an Attempt of the Run may still write (not finished, or its Pod not yet gone)."""
    for attempt in d.w.attempts.values():
        pod = d.w.pods.get(str(attempt.metadata.name))
        if attempt.status.phase not in FINISHED_ATTEMPT or (pod is not None and not pod.finished):
            return True
    return False


def _refresh_report(d: Decision) -> None:
    """A stopped Run keeps its report in step with its SideEffects (e.g. one resolved by a person)."""
    counts = report.side_effect_counts(d.w.side_effects)
    current = d.status.side_effects.to_api() if d.status.side_effects else None
    listed = report.run_report(d.w.side_effects)
    # Compared as stored (normalised by the model): a Pending record marked Unknown changes no count.
    stored = d.status.report
    stale = stored is not None and stored.to_api() != RunReport.model_validate(listed).to_api()
    if current != counts or stale:
        d.plan.add(PatchRunStatus({"sideEffects": counts, "report": listed}))


def _sum_usage(d: Decision) -> None:
    """Run.status.usage is the sum of its Attempts' (failed ones included), written when it changed: an
    Attempt's Pod writes its usage every few seconds at most, so this is no write per model call."""
    total = usage_sum([a.status.usage for a in d.w.attempts.values()])
    if total != (d.status.usage or Usage()):
        d.plan.add(PatchRunStatus({"usage": total.to_status()}))


def _prune_checkpoints(d: Decision) -> None:
    for name in retention.prunable(d.run, d.w.checkpoints, d.w.attempts.values()):
        d.plan.add(DeleteCheckpoint(name))
