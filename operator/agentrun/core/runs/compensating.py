"""The Compensating phase in the Run's table: compensation Attempts started, watched and concluded within
their own budget, and spec.compensateRequest judged (the decisions themselves: core.compensation)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from types import MappingProxyType
from typing import Any, Final

from agentrun.api import (
    FINISHED_ATTEMPT_PHASES,
    Attempt,
    AttemptFailure,
    AttemptPhase,
    AttemptReason,
    CompensationProgress,
    ControlOp,
    FailureClass,
    RunPhase,
)
from agentrun.core import compensation, controls, failures
from agentrun.core.compensation import INCOMPLETE, attempt_input, policy_of
from agentrun.core.controls import KeyUse
from agentrun.core.plan import CreateAttempt, DeletePod, PatchAttemptStatus, WriteLease
from agentrun.core.pods import PodView
from agentrun.core.retry import decide_retry
from agentrun.core.runs.builder import Builder, failure_fields
from agentrun.core.runs.chain import Rule, SubTable
from agentrun.core.runs.transition import SetPhase, Step, Transition
from agentrun.core.runs.world import RECHECK_SECONDS, World, rfc3339


def compensating(w: World) -> Transition | None:
    """Compensating -> the compensation Attempts followed: the first granted once no earlier Attempt's Pod
    is left, each one's end concluded (back to the Run's phase, another after a backoff, or
    NeedsReconciliation CompensationIncomplete). Neither a cancel nor the deadline stops it."""
    if w.run.status.phase != RunPhase.COMPENSATING:
        return None
    return COMPENSATING.decide(w)


def compensate_first(w: World, t: Transition) -> Transition | None:
    """A transition to Cancelled or Failed whose Run's policy compensates on it, with something to undo
    -> Compensating first, the transition's reason and message kept; the Run returns to that phase after
    (core.compensation.redirect). Applied to every rule's transition: no path to the end bypasses it."""
    steps: list[Step] = []
    for step in t.steps:
        if isinstance(step, SetPhase):
            phase, fields = compensation.redirect(w, step.phase, step.reason, dict(step.fields))
            if phase != step.phase:
                steps.append(SetPhase(phase, step.reason, step.message, MappingProxyType(fields)))
                continue
        steps.append(step)
    return replace(t, steps=tuple(steps)) if tuple(steps) != t.steps else None


def judge_request(b: Builder) -> bool:
    """Judges spec.compensateRequest once per key (like the other control requests); True when it was,
    so the Run waits for that write."""
    run = b.run
    request = run.spec.compensate_request
    if request is None:
        return False
    key, digest = request.idempotency_key, compensation.request_digest(request.effects)
    use = controls.key_use(run, key, ControlOp.COMPENSATE, digest)
    if use == KeyUse.REPEAT:
        return False
    if use == KeyUse.NEW:
        verdict, started = compensation.judge(run, b.w.side_effects)
    else:
        verdict, started = controls.key_refusal(use, key), None
    record = controls.control_record(ControlOp.COMPENSATE, key, digest, verdict, b.w.now)
    spent = controls.with_spent(run, key, ControlOp.COMPENSATE, digest) if use == KeyUse.NEW else None
    progress = b.status.compensating
    if started is None and verdict.accepted and progress is not None and compensation.is_incomplete(run):
        # An incomplete compensation with nothing left to settle or undo (a person resolved the records,
        # or the last Attempt finished its work but not its exit): it is complete, the Run goes back.
        _return(b, progress, controls=controls.with_record(run, record), spentKeys=spent)
        return True
    if started is None:
        b.record_control(record, spent=spent)
        if not verdict.accepted:
            b.event("Warning", "CompensateRejected", f"{verdict.reason}: {verdict.message}")
        return True
    b.set_phase(
        RunPhase.COMPENSATING,
        "CompensateRequested",
        verdict.message,
        controls=controls.with_record(run, record),
        spentKeys=spent,
        compensating=started,
        nextAttemptTime=None,
    )
    b.event("Normal", "CompensateRequested", verdict.message)
    return True


# ---- the Compensating sub-table: one row per situation of the compensation, tried in order ------------


def no_progress(w: World) -> Transition | None:
    """No status.compensating (written by hand or by an older operator) -> NeedsReconciliation: nothing
    says where to return."""
    if w.run.status.compensating is not None:
        return None
    b = Builder(w)
    _incomplete(b, "the Run is Compensating without status.compensating: nothing says what to undo")
    return b.transition()


def earlier_running(w: World) -> Transition | None:
    """A Pod of an Attempt before the compensation is still there -> it is stopped (and its Attempt
    aborted) first: an Attempt still sending could race the compensation."""
    progress = w.run.status.compensating
    assert progress is not None
    if not _earlier_pods(w, progress):
        return None
    b = _earlier_aborted(w, progress, stop_pods=True)
    b.plan.wake_in(RECHECK_SECONDS)  # the Pod's end wakes us sooner
    return b.transition()


def first_grant(w: World) -> Transition | None:
    """No compensation Attempt yet -> the first one granted (reason compensate)."""
    progress = w.run.status.compensating
    assert progress is not None
    if (w.run.status.current_attempt or 0) >= progress.first_attempt:
        return None
    b = _earlier_aborted(w, progress)
    _grant(b, progress.first_attempt, progress)
    return b.transition()


def attempt_promised(w: World) -> Transition | None:
    """The current compensation Attempt not seen -> a grant interrupted after the Run's write: the
    Attempt it promised created now, then its Pod."""
    progress = w.run.status.compensating
    assert progress is not None
    if w.current is not None:
        return None
    b = _earlier_aborted(w, progress)
    epoch, reason = b.status.lease_epoch or 0, AttemptReason.COMPENSATE
    promised = b.attempt_object(b.status.current_attempt or 0, epoch, reason, attempt_input(progress), None)
    b.plan.add(CreateAttempt(promised.to_api()))
    b.ensure_pod(promised)
    return b.transition()


def attempt_ended(w: World) -> Transition | None:
    """The compensation Attempt's end recorded -> back to the Run's phase, the next one when its backoff
    is due, or NeedsReconciliation."""
    progress, attempt = w.run.status.compensating, w.current
    assert progress is not None and attempt is not None
    if attempt.status.phase not in FINISHED_ATTEMPT_PHASES:
        return None
    b = _earlier_aborted(w, progress)
    ok = attempt.status.phase == AttemptPhase.SUCCEEDED
    _after(b, attempt, None if ok else attempt.status.failure or failures.pod_lost(), progress, seen=True)
    return b.transition()


def pod_not_created(w: World) -> Transition | None:
    """Not started and no Pod seen -> its Pod created (creating is idempotent)."""
    progress, attempt = w.run.status.compensating, w.current
    assert progress is not None and attempt is not None
    if w.current_pod is not None or attempt.status.start_time is not None:
        return None
    b = _earlier_aborted(w, progress)
    b.ensure_pod(attempt)
    return b.transition()


def pod_lost(w: World) -> Transition | None:
    """Started, and its Pod is gone -> the compensation Attempt Failed (pod lost), concluded."""
    progress, attempt = w.run.status.compensating, w.current
    assert progress is not None and attempt is not None
    if w.current_pod is not None:
        return None
    b = _earlier_aborted(w, progress)
    _end(b, attempt, AttemptPhase.FAILED, failures.pod_lost(), progress)
    return b.transition()


def pod_ended(w: World) -> Transition | None:
    """Its container ended -> Succeeded (exit 0) or Failed, concluded."""
    progress, attempt, pod = w.run.status.compensating, w.current, w.current_pod
    assert progress is not None and attempt is not None and pod is not None
    if not pod.finished:
        return None
    b = _earlier_aborted(w, progress)
    end = pod.exit or failures.ContainerExit(exit_code=0 if pod.phase == "Succeeded" else 1)
    failure = failures.classify_exit(end)
    _end(b, attempt, AttemptPhase.FAILED if failure else AttemptPhase.SUCCEEDED, failure, progress)
    return b.transition()


def lease_expired(w: World) -> Transition | None:
    """Its agent runs and its Lease ran out -> revoked (a late write of the frozen worker is refused), its
    Pod stopped, the Attempt LeaseLost, concluded."""
    progress, attempt, pod, lease = w.run.status.compensating, w.current, w.current_pod, w.lease
    assert progress is not None and attempt is not None and pod is not None
    if not _judged(w, attempt, pod) or w.lease_expires_in is None or w.lease_expires_in > 0:
        return None
    assert lease is not None
    b = _seen_running(w, attempt, pod, progress)
    epoch = lease.epoch + 1
    b.plan.add(WriteLease(None, epoch, b.run.spec.lease.duration_seconds, lease.resource_version))
    b.plan.add(DeletePod(pod.name, grace_seconds=0))
    lost = failures.lease_lost(b.run.spec.lease.duration_seconds)
    _end(b, attempt, AttemptPhase.LEASE_LOST, lost, progress, leaseEpoch=epoch)
    return b.transition()


def live(w: World) -> Transition:
    """Its Pod goes on -> its start recorded once its agent runs; look again when its Lease runs out."""
    progress, attempt, pod = w.run.status.compensating, w.current, w.current_pod
    assert progress is not None and attempt is not None and pod is not None
    b = _seen_running(w, attempt, pod, progress)
    if not _judged(w, attempt, pod) or w.lease_expires_in is None:
        b.plan.wake_in(RECHECK_SECONDS)
    else:
        b.plan.wake_at_lease_expiry(w.lease_expires_in + 0.05)
    return b.transition()


COMPENSATING: Final = SubTable(
    (
        Rule("NoProgress", no_progress),
        Rule("EarlierRunning", earlier_running),
        Rule("FirstGrant", first_grant),
        Rule("AttemptPromised", attempt_promised),
        Rule("AttemptEnded", attempt_ended),
        Rule("PodNotCreated", pod_not_created),
        Rule("PodLost", pod_lost),
        Rule("PodEnded", pod_ended),
        Rule("LeaseExpired", lease_expired),
        Rule("Live", live),
    )
)


def _earlier_pods(w: World, progress: CompensationProgress) -> list[PodView]:
    """The Pods still there of the Attempts before the compensation."""
    pods = (w.pods.get(str(a.metadata.name)) for n, a in w.attempts.items() if n < progress.first_attempt)
    return [pod for pod in pods if pod is not None and not pod.finished]


def _earlier_aborted(w: World, progress: CompensationProgress, *, stop_pods: bool = False) -> Builder:
    """A Builder whose first steps abort the Attempts before the compensation that have not ended (and
    stop their Pods still there, with `stop_pods`)."""
    b = Builder(w)
    for number, attempt in w.attempts.items():
        if number >= progress.first_attempt:
            continue
        if attempt.status.phase not in FINISHED_ATTEMPT_PHASES:
            b.finish_attempt(
                attempt, AttemptPhase.ABORTED, failures.failure(FailureClass.CANCELLED, "the Run compensates")
            )
        pod = w.pods.get(str(attempt.metadata.name))
        if stop_pods and pod is not None and not pod.finished and not pod.deleting:
            b.plan.add(DeletePod(pod.name))
    return b


def _seen_running(w: World, attempt: Attempt, pod: PodView, progress: CompensationProgress) -> Builder:
    """_earlier_aborted, then the agent's start recorded if its Pod shows it and the Attempt not."""
    b = _earlier_aborted(w, progress)
    if pod.running_since and attempt.status.phase != AttemptPhase.RUNNING:
        patch = {
            "phase": "Running",
            "startTime": pod.running_since,
            "podName": pod.name,
            "traceId": b.trace_id,
        }
        b.plan.add(PatchAttemptStatus(str(attempt.metadata.name), patch, attempt.metadata.resource_version))
    return b


def _judged(w: World, attempt: Attempt, pod: PodView) -> bool:
    """Whether the Attempt's lease is judged now: it holds the Lease at its epoch, and its agent runs."""
    lease, name = w.lease, attempt.metadata.name
    holds = lease is not None and lease.holder == name and lease.epoch == attempt.spec.lease_epoch
    return holds and bool(pod.running_since)


def _grant(b: Builder, number: int, progress: CompensationProgress) -> None:
    b.grant(number, AttemptReason.COMPENSATE, attempt_input(progress), phase=RunPhase.COMPENSATING)


def _end(
    b: Builder,
    attempt: Attempt,
    phase: AttemptPhase,
    failure: AttemptFailure | None,
    progress: CompensationProgress,
    **fields: Any,
) -> None:
    b.finish_attempt(attempt, phase, failure)
    ok = phase == AttemptPhase.SUCCEEDED
    _after(b, attempt, None if ok else failure or failures.pod_lost(), progress, seen=False, **fields)


def _after(
    b: Builder,
    attempt: Attempt,
    failure: AttemptFailure | None,
    progress: CompensationProgress,
    *,
    seen: bool,
    **fields: Any,
) -> None:
    """The compensation Attempt ended (failure None: it did all it had to), recorded now or `seen`
    recorded before: back to the Run's phase, another compensation Attempt after a backoff, or
    NeedsReconciliation. The worker ends a compensation Attempt well only when everything in its scope
    is settled and compensated; anything left open makes it fail with unknown_side_effect."""
    if failure is None or not compensation.needs_compensation(b.w.side_effects, progress.effects):
        # Ended well, or failed after doing all it had to (killed once the last record was marked
        # Compensated): nothing is left to settle or undo, so no other Attempt and no person is needed.
        _return(b, progress, **fields)
        return
    due = b.status.next_attempt_time
    if seen and due is not None:
        if b.w.now >= due:
            _grant(b, attempt.spec.number + 1, progress)
        else:
            b.plan.wake_in((due - b.w.now).total_seconds())
        return
    retry, message = retry_after_failure(b, attempt.spec.number, failure, progress)
    if retry is None:
        _incomplete(b, message, **fields)
        return
    at = b.w.now + timedelta(seconds=retry)
    if at.microsecond:  # status holds whole seconds: round up, so the retry never starts early
        at = at.replace(microsecond=0) + timedelta(seconds=1)
    text = f"compensation Attempt {attempt.spec.number} failed ({failure.failure_class}: {failure.message}); "
    b.set_phase(
        RunPhase.COMPENSATING,
        "CompensationRetry",
        text + f"the next starts at {rfc3339(at)}",
        nextAttemptTime=rfc3339(at),
        **fields,
    )
    b.event("Normal", "CompensationRetry", message)
    b.plan.wake_in((at - b.w.now).total_seconds())


def retry_after_failure(
    b: Builder, number: int, failure: AttemptFailure, progress: CompensationProgress
) -> tuple[float | None, str]:
    """(seconds until the next compensation Attempt, or None: give up; why). The Run's retry policy
    decides with spec.compensation.maxAttempts as the budget; an open or conflicting record
    (unknown_side_effect) needs a person, never another try."""
    if failure.failure_class == FailureClass.UNKNOWN_SIDE_EFFECT:
        return None, failure.message or "a side effect could not be settled or compensated"
    budget = policy_of(b.run).max_attempts
    policy = b.run.spec.retry.model_copy(update={"max_attempts": budget})
    history = [b.w.failure_of(n) for n in range(progress.first_attempt, number)] + [failure]
    decision = decide_retry(
        policy, number - progress.first_attempt + 1, history, seed=str(b.run.metadata.uid)
    )
    if not decision.retry:
        return None, f"{decision.message}; last failure: {failure.message}"
    return max(decision.delay_seconds, float(failure.retry_after_seconds or 0)), decision.message


def _return(b: Builder, progress: CompensationProgress, **fields: Any) -> None:
    phase = RunPhase(progress.return_phase)
    message = f"side effects compensated; the Run is {phase.value} again"
    failure = b.status.failure
    if failure is not None and failure.reason == INCOMPLETE and phase != RunPhase.FAILED:
        fields["failure"] = None  # the incomplete compensation was completed: nothing failed
    b.set_phase(phase, "Compensated", message, compensating=None, nextAttemptTime=None, **fields)
    b.event("Normal", "Compensated", message)


def _incomplete(b: Builder, message: str, **fields: Any) -> None:
    text = f"{INCOMPLETE}: {message}; resolve the SideEffects, then ask again (spec.compensateRequest)"
    failure = failure_fields(FailureClass.UNKNOWN_SIDE_EFFECT, INCOMPLETE, message)
    b.set_phase(
        RunPhase.NEEDS_RECONCILIATION, INCOMPLETE, text, failure=failure, nextAttemptTime=None, **fields
    )
    b.event("Warning", INCOMPLETE, text)
