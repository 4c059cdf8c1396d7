"""The rules of the Run state machine, each a pure function World -> Transition | None (core.runs.table
orders them). A rule returns None when it does not apply; each builds its own Transition."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from agentrun.api import (
    FINISHED_ATTEMPT_PHASES,
    TERMINAL_PHASES,
    WAITING_PHASES,
    Attempt,
    AttemptPhase,
    AttemptReason,
    FailureClass,
    RunPhase,
    RunSpec,
)
from agentrun.api.budgets import POD_SPEC_BUDGET, RUN_INPUT_BUDGET, over_budget
from agentrun.core import identity
from agentrun.core.runs import attempts, controls, stopping
from agentrun.core.runs.grants import failure_fields, grant
from agentrun.core.runs.promises import automatic_retry, or_promised
from agentrun.core.runs.transition import Transition, event, finish_attempt, set_phase, wake_in
from agentrun.core.runs.upkeep import rejections
from agentrun.core.runs.world import RECHECK_SECONDS, World

# ---- rules that apply in any phase ---------------------------------------------------------------------


def deleted(w: World) -> Transition | None:
    """Being deleted -> no write: the garbage collector removes what the Run owns."""
    return Transition() if w.run.metadata.deletion_timestamp is not None else None


def name_squatted(w: World) -> Transition | None:
    """A name the Run needs (its Lease, an Attempt, an Attempt's Pod) is held by an object the Run does
    not own, as a create of it found (World.squatted) -> Failed (NameSquatted): the object is never
    adopted, nor written or deleted, and the message says what to delete. The Run's own Lease, if any, is
    revoked first, so no Pod, however named, writes for it any more. Not redirected to Compensating
    (core.compensation.NO_PODS): no Pod may run for the Run."""
    if not w.squatted:
        return None
    name = min(w.squatted)
    message = identity.squatted(w.squatted[name], name)
    epoch, revoke = stopping.revoked(w) if w.lease is not None else (None, Transition())
    fields = {"leaseEpoch": epoch} if epoch is not None else {}
    failure = failure_fields(FailureClass.DETERMINISTIC, identity.NAME_SQUATTED, message)
    failed = set_phase(
        RunPhase.FAILED, identity.NAME_SQUATTED, message, failure=failure, nextAttemptTime=None, **fields
    )
    return revoke.then(failed, event("Warning", identity.NAME_SQUATTED, message))


def commit_refused(w: World) -> Transition | None:
    """An Attempt recorded a refused commit -> it is marked Rejected; the rest is decided on the
    Attempts as recorded, at once."""
    rejected = rejections(w)
    return Transition(steps=rejected).wake_in(0) if rejected else None


def committed(w: World) -> Transition | None:
    """Running or CancelRequested, the current Attempt committed -> Succeeded: the commit passed the
    fence, so it came before any cancel or deadline, and it stands."""
    attempt, by = w.current, w.run.status.committed_by
    if attempt is None or by is None or by.attempt != attempt.metadata.name:
        return None
    t = finish_attempt(w, attempt, AttemptPhase.SUCCEEDED, None).then(
        attempts.after_attempt(w, attempt, None, phase=AttemptPhase.SUCCEEDED)
    )
    if w.run.spec.cancel_epoch > by.cancel_epoch:
        t = t.then(event("Normal", "CancelTooLate", "the result was committed before the cancel arrived"))
    return t


def cancel_asked(w: World) -> Transition | None:
    """spec.cancelEpoch grew -> CancelRequested (its Pod stopped) or, with no Pod running, Cancelled.
    The cancelEpoch a Run is first seen with is no cancel."""
    if w.run.spec.cancel_epoch <= (w.run.status.observed_cancel_epoch or 0):
        return None
    attempt, promised = or_promised(w, w.current)
    return promised.then(stopping.request_cancel(w, attempt, w.current_pod))


def deadline_passed(w: World) -> Transition | None:
    """Not stopped, past spec.deadlineSeconds -> Failed (DeadlineExceeded), the Lease revoked."""
    if not stopping.deadline_passed(w):
        return None
    attempt, promised = or_promised(w, w.current)
    return promised.then(stopping.stop_for_deadline(w, attempt, w.current_pod))


def hold_ending(w: World) -> Transition | None:
    """Waiting while the Attempt that asked still lives, and it no longer holds the request (released, its
    Pod ended, its lease ran out) -> its end is recorded (the request stands), or its Pod's end awaited."""
    attempt = _waiting_attempt(w)
    if attempt is None or _holds_alive(w):
        return None
    pod = w.current_pod
    if pod is None or pod.finished or attempts.hold_expired(w, attempt):
        return attempts.end_of_hold(w, attempt, pod)
    return wake_in(RECHECK_SECONDS)  # released: its Pod's end wakes us sooner


def control_request(w: World) -> Transition | None:
    """A retry, cancel, pause or resume request not judged yet -> judged and recorded once per key: a
    resume or a retry accepted starts the next Attempt (or continues the holding one)."""
    judged = controls.judge_requests(w, w.run.status.current_attempt or 0)
    return None if judged is None else _hold_wake(w, judged)


def stopped(w: World) -> Transition | None:
    """Succeeded, Failed, Cancelled or NeedsReconciliation -> leftover Attempts aborted, a cancelled Run's
    Pending SideEffects settled, an ended Run's leftover pending request dropped, the report kept current;
    only a manual retry moves it on."""
    return stopping.kept_in_order(w)


def request_expired(w: World) -> Transition | None:
    """Waiting past the pending request's expiresAt -> Failed (RequestExpired)."""
    request = w.run.status.pending_request
    if request is None or request.expires_at is None or w.now < request.expires_at:
        return None
    return _hold_wake(w, controls.fail_expired_request(w))


# ---- rules by phase ----------------------------------------------------------------------------------


def first_attempt(w: World) -> Transition | None:
    """First seen (no phase yet), or Queued -> Attempt 1 granted in this reconcile; Failed at once when
    the spec is over a byte budget or its Pods may not run as its ServiceAccount (not opted in:
    ServiceAccountNotAllowed; the attempt role not bound: AttemptRoleNotBound)."""
    if over := spec_over_budget(w.run.spec):
        reason, message = over
        failure = failure_fields(FailureClass.DETERMINISTIC, reason, message)
        over_budget = set_phase(RunPhase.FAILED, reason, message, failure=failure)
        return _deadline_wake(w, over_budget.then(event("Warning", reason, message)))
    return _deadline_wake(w, grant(w, 1, AttemptReason.INITIAL))


def takeover_unfinished(w: World) -> Transition | None:
    """RetryBackoff while the current Attempt has not ended -> a takeover was interrupted after its Run
    write: the Attempt is marked LeaseLost and its Pod stopped."""
    attempt = w.current
    if attempt is None or attempt.status.phase in FINISHED_ATTEMPT_PHASES:
        return None
    due = w.run.status.next_attempt_time
    lost = stopping.finish_lost(w, attempt, w.current_pod, stopping.lease_lost(w))
    return _deadline_wake(w, lost.wake_in(0 if due is None else (due - w.now).total_seconds()))


def retry_due(w: World) -> Transition | None:
    """RetryBackoff at status.nextAttemptTime -> the next Attempt granted (an automatic retry)."""
    due = w.run.status.next_attempt_time
    if due is not None and w.now < due:
        return None
    number = (w.run.status.current_attempt or 0) + 1
    return _deadline_wake(w, grant(w, number, *automatic_retry(w, number)))


def backing_off(w: World) -> Transition | None:
    """RetryBackoff before status.nextAttemptTime -> no write; look again then."""
    due = w.run.status.next_attempt_time
    if due is None:
        return None
    return _deadline_wake(w, Transition().wake_in((due - w.now).total_seconds()))


def running(w: World) -> Transition | None:
    """Running -> the current Attempt followed: created as promised, its Pod created or its start
    recorded, a hold, its end (Succeeded, waiting, a retry or Failed), or a lease takeover."""
    number = w.run.status.current_attempt
    if not number:
        return None
    return _deadline_wake(w, attempts.RUNNING.decide(w))


def cancelling(w: World) -> Transition | None:
    """CancelRequested -> Cancelled once the Attempt's Pod is gone (its stop repeated if it was lost)."""
    return _deadline_wake(w, stopping.finish_cancel(w, w.current, w.current_pod))


def resting(w: World) -> Transition:
    """Anything else (waiting for an answer) -> no write; look again when the holder's lease, the request
    or the deadline runs out."""
    rest = _hold_wake(w, Transition())
    request = w.run.status.pending_request
    if w.run.status.phase in WAITING_PHASES and request is not None and request.expires_at is not None:
        rest = rest.wake_in((request.expires_at - w.now).total_seconds())
    return _deadline_wake(w, rest)


# ---- shared by the rules -----------------------------------------------------------------------------


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


def _waiting_attempt(w: World) -> Attempt | None:
    """The current Attempt of a waiting Run, while it has not ended."""
    attempt = w.current
    if w.run.status.phase not in WAITING_PHASES or attempt is None:
        return None
    return None if attempt.status.phase in FINISHED_ATTEMPT_PHASES else attempt


def _holds_alive(w: World) -> bool:
    """A waiting Run's current Attempt holds the request and lives to take the answer."""
    attempt, pod, pending = _waiting_attempt(w), w.current_pod, w.run.status.pending_request
    if attempt is None or pending is None or pending.held_by != attempt.metadata.name:
        return False
    return pod is not None and not pod.finished and not attempts.hold_expired(w, attempt)


def _hold_wake(w: World, t: Transition) -> Transition:
    """While an Attempt holds the request, look again when its lease runs out unless renewed."""
    if not _holds_alive(w):
        return t
    if w.lease_expires_in is not None:
        return t.wake_at_lease_expiry(w.lease_expires_in + 0.05)
    return t.wake_in(RECHECK_SECONDS)


def _deadline_wake(w: World, t: Transition) -> Transition:
    created, limit = w.run.metadata.creation_timestamp, w.run.spec.deadline_seconds
    if limit and created and w.run.status.phase not in TERMINAL_PHASES:
        return t.wake_in((created + timedelta(seconds=limit) - w.now).total_seconds())
    return t
