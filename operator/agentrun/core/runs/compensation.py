"""The Compensating phase in the Run's table (its sub-table): compensation Attempts started, watched and
concluded within their own budget; and the CompensateFirst rewrite that sends a Run there before it
ends (the decisions themselves: core.compensation)."""

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
    FailureClass,
    RunPhase,
)
from agentrun.core import compensation, failures
from agentrun.core.compensation import INCOMPLETE, attempt_input, policy_of
from agentrun.core.plan import CreateAttempt, DeletePod, WriteLease
from agentrun.core.pods import PodView
from agentrun.core.retry import decide_retry
from agentrun.core.runs.attempts import container_end
from agentrun.core.runs.chain import Rule, SubTable
from agentrun.core.runs.following import Following
from agentrun.core.runs.grants import attempt_object, failure_fields, grant
from agentrun.core.runs.transition import (
    NOTHING,
    SetPhase,
    Step,
    Transition,
    event,
    finish_attempt,
    set_phase,
    wake_in,
    writes,
)
from agentrun.core.runs.world import RECHECK_SECONDS, World, rfc3339


def compensating(w: World) -> Transition | None:
    """Compensating -> the compensation Attempts followed: the first granted once no earlier Attempt's Pod
    is left, each one's end concluded (back to the Run's phase, another after a backoff, or
    NeedsReconciliation CompensationIncomplete). Neither a cancel nor the deadline stops it."""
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


# ---- the Compensating sub-table: one row per situation of the compensation, tried in order ------------


def _progress(w: World) -> CompensationProgress:
    progress = w.run.status.compensating
    assert progress is not None  # the NoProgress row comes first
    return progress


def no_progress(w: World) -> Transition | None:
    """No status.compensating (written by hand or by an older operator) -> NeedsReconciliation: nothing
    says where to return."""
    if w.run.status.compensating is not None:
        return None
    return incomplete("the Run is Compensating without status.compensating: nothing says what to undo")


def earlier_running(w: World) -> Transition | None:
    """A Pod of an Attempt before the compensation is still there -> it is stopped (and its Attempt
    aborted) first: an Attempt still sending could race the compensation."""
    progress = _progress(w)
    if not _earlier_pods(w, progress):
        return None
    # The Pod's end wakes us sooner than the recheck.
    return _earlier_aborted(w, progress, stop_pods=True).then(wake_in(RECHECK_SECONDS))


def first_grant(w: World) -> Transition | None:
    """No compensation Attempt yet -> the first one granted (reason compensate)."""
    progress = _progress(w)
    if (w.run.status.current_attempt or 0) >= progress.first_attempt:
        return None
    return _earlier_aborted(w, progress).then(_grant(w, progress.first_attempt, progress))


class CompensatingFollowing(Following):
    """How the Compensating phase follows its compensation Attempt: the Attempts before the compensation
    that have not ended are aborted before each row's writes; an Attempt's end is concluded within the
    compensation's own budget (back to the Run's phase, another after a backoff, or NeedsReconciliation);
    a lease that ran out is revoked at once, its Pod stopped without grace."""

    def first(self, w: World) -> Transition:
        return _earlier_aborted(w, _progress(w))

    def promised(self, w: World) -> tuple[Attempt, Transition]:
        status, epoch = w.run.status, w.run.status.lease_epoch or 0
        number, effects = status.current_attempt or 0, attempt_input(_progress(w))
        promised = attempt_object(w, number, epoch, AttemptReason.COMPENSATE, effects, resume_from=None)
        return promised, writes(CreateAttempt(promised.to_api()))

    def end(
        self, w: World, attempt: Attempt, phase: AttemptPhase, failure: AttemptFailure | None
    ) -> Transition:
        return _end(w, attempt, phase, failure, _progress(w))

    def concluded(self, w: World, attempt: Attempt, pod: PodView) -> Transition:
        failure = failures.classify_exit(container_end(pod))
        phase = AttemptPhase.FAILED if failure else AttemptPhase.SUCCEEDED
        return _end(w, attempt, phase, failure, _progress(w))

    def taken_over(self, w: World, attempt: Attempt, pod: PodView) -> Transition:
        lease = w.lease
        assert lease is not None  # its lease is judged: it holds the Lease
        epoch, duration = lease.epoch + 1, w.run.spec.lease.duration_seconds
        lost = failures.lease_lost(duration)
        return writes(
            WriteLease(None, epoch, duration, lease.resource_version), DeletePod(pod.name, grace_seconds=0)
        ).then(_end(w, attempt, AttemptPhase.LEASE_LOST, lost, _progress(w), leaseEpoch=epoch))

    def ended(self, w: World, attempt: Attempt) -> Transition:
        ok = attempt.status.phase == AttemptPhase.SUCCEEDED
        failure = None if ok else attempt.status.failure or failures.pod_lost()
        return _after(w, attempt, failure, _progress(w), seen=True)


# The rows the Compensating sub-table shares with the Running one (core.runs.following).
FOLLOWING: Final = CompensatingFollowing()


COMPENSATING: Final = SubTable(
    (
        Rule("NoProgress", no_progress),
        Rule("EarlierRunning", earlier_running),
        Rule("FirstGrant", first_grant),
        Rule("AttemptPromised", FOLLOWING.attempt_promised),
        Rule("AttemptEnded", FOLLOWING.attempt_ended),
        Rule("PodRefused", FOLLOWING.pod_refused),
        Rule("PodNotCreated", FOLLOWING.pod_not_created),
        Rule("PodLost", FOLLOWING.pod_lost),
        Rule("PodEnded", FOLLOWING.pod_ended),
        Rule("LeaseExpired", FOLLOWING.lease_expired),
        Rule("Live", FOLLOWING.live),
    )
)


def _earlier_pods(w: World, progress: CompensationProgress) -> list[PodView]:
    """The Pods still there of the Attempts before the compensation."""
    pods = (w.pods.get(str(a.metadata.name)) for n, a in w.attempts.items() if n < progress.first_attempt)
    return [pod for pod in pods if pod is not None and not pod.finished]


def _earlier_aborted(w: World, progress: CompensationProgress, *, stop_pods: bool = False) -> Transition:
    """The Attempts before the compensation that have not ended, aborted (and their Pods still there
    stopped, with `stop_pods`)."""
    t = NOTHING
    for number, attempt in w.attempts.items():
        if number >= progress.first_attempt:
            continue
        if attempt.status.phase not in FINISHED_ATTEMPT_PHASES:
            aborted = failures.failure(FailureClass.CANCELLED, "the Run compensates")
            t = t.then(finish_attempt(w, attempt, AttemptPhase.ABORTED, aborted))
        pod = w.pods.get(str(attempt.metadata.name))
        if stop_pods and pod is not None and not pod.finished and not pod.deleting:
            t = t.then(DeletePod(pod.name))
    return t


def _grant(w: World, number: int, progress: CompensationProgress) -> Transition:
    return grant(w, number, AttemptReason.COMPENSATE, attempt_input(progress), phase=RunPhase.COMPENSATING)


# ---- how a compensation Attempt's end moves the Run on ------------------------------------------------


def _end(
    w: World,
    attempt: Attempt,
    phase: AttemptPhase,
    failure: AttemptFailure | None,
    progress: CompensationProgress,
    **fields: Any,
) -> Transition:
    ok = phase == AttemptPhase.SUCCEEDED
    return finish_attempt(w, attempt, phase, failure).then(
        _after(w, attempt, None if ok else failure or failures.pod_lost(), progress, seen=False, **fields)
    )


def _after(
    w: World,
    attempt: Attempt,
    failure: AttemptFailure | None,
    progress: CompensationProgress,
    *,
    seen: bool,
    **fields: Any,
) -> Transition:
    """The compensation Attempt ended (failure None: it did all it had to), recorded now or `seen`
    recorded before: back to the Run's phase, another compensation Attempt after a backoff, or
    NeedsReconciliation. The worker ends a compensation Attempt well only when everything in its scope
    is settled and compensated; anything left open makes it fail with unknown_side_effect."""
    if failure is None or not compensation.needs_compensation(w.side_effects, progress.effects):
        # Ended well, or failed after doing all it had to (killed once the last record was marked
        # Compensated): nothing is left to settle or undo, so no other Attempt and no person is needed.
        return returned(w, progress, **fields)
    due = w.run.status.next_attempt_time
    if seen and due is not None:
        if w.now >= due:
            return _grant(w, attempt.spec.number + 1, progress)
        return wake_in((due - w.now).total_seconds())
    retry, message = retry_after_failure(w, attempt.spec.number, failure, progress)
    if retry is None:
        return incomplete(message, **fields)
    at = w.now + timedelta(seconds=retry)
    if at.microsecond:  # status holds whole seconds: round up, so the retry never starts early
        at = at.replace(microsecond=0) + timedelta(seconds=1)
    text = f"compensation Attempt {attempt.spec.number} failed ({failure.failure_class}: {failure.message}); "
    return set_phase(
        RunPhase.COMPENSATING,
        "CompensationRetry",
        text + f"the next starts at {rfc3339(at)}",
        nextAttemptTime=rfc3339(at),
        **fields,
    ).then(event("Normal", "CompensationRetry", message), wake_in((at - w.now).total_seconds()))


def retry_after_failure(
    w: World, number: int, failure: AttemptFailure, progress: CompensationProgress
) -> tuple[float | None, str]:
    """(seconds until the next compensation Attempt, or None: give up; why). The Run's retry policy
    decides with spec.compensation.maxAttempts as the budget; an open or conflicting record
    (unknown_side_effect) needs a person, never another try."""
    if failure.failure_class == FailureClass.UNKNOWN_SIDE_EFFECT:
        return None, failure.message or "a side effect could not be settled or compensated"
    run = w.run
    budget = policy_of(run).max_attempts
    policy = run.spec.retry.model_copy(update={"max_attempts": budget})
    history = [w.failure_of(n) for n in range(progress.first_attempt, number)] + [failure]
    decision = decide_retry(policy, number - progress.first_attempt + 1, history, seed=str(run.metadata.uid))
    if not decision.retry:
        return None, f"{decision.message}; last failure: {failure.message}"
    return max(decision.delay_seconds, float(failure.retry_after_seconds or 0)), decision.message


def returned(w: World, progress: CompensationProgress, **fields: Any) -> Transition:
    """The compensation is complete: the Run is back in the phase it compensated from."""
    phase = RunPhase(progress.return_phase)
    message = f"side effects compensated; the Run is {phase.value} again"
    failure = w.run.status.failure
    if failure is not None and failure.reason == INCOMPLETE and phase != RunPhase.FAILED:
        fields["failure"] = None  # the incomplete compensation was completed: nothing failed
    return set_phase(phase, "Compensated", message, compensating=None, nextAttemptTime=None, **fields).then(
        event("Normal", "Compensated", message)
    )


def incomplete(message: str, **fields: Any) -> Transition:
    """What is left can be neither settled nor compensated by an Attempt: a person decides."""
    text = f"{INCOMPLETE}: {message}; resolve the SideEffects, then ask again (spec.compensateRequest)"
    failure = failure_fields(FailureClass.UNKNOWN_SIDE_EFFECT, INCOMPLETE, message)
    return set_phase(
        RunPhase.NEEDS_RECONCILIATION, INCOMPLETE, text, failure=failure, nextAttemptTime=None, **fields
    ).then(event("Warning", INCOMPLETE, text))
