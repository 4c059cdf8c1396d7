"""What a new Attempt is started with (its reason and input), and the Attempt an interrupted grant
promised: the Run's status names it (currentAttempt) but the Attempt was not created yet."""

from __future__ import annotations

from typing import Any

from agentrun.api import (
    Attempt,
    AttemptPhase,
    AttemptReason,
    ControlOp,
    ControlOutcome,
    FailureClass,
    RunPhase,
    StartKind,
    StartReason,
)
from agentrun.core import controls, interrupts
from agentrun.core.plan import CreateAttempt
from agentrun.core.runs.grants import attempt_object
from agentrun.core.runs.transition import NOTHING, Transition, writes
from agentrun.core.runs.world import World


def or_promised(w: World, attempt: Attempt | None) -> tuple[Attempt | None, Transition]:
    """The current Attempt that a stop must end: the one seen, or the one a grant promised (created now,
    the Transition's write)."""
    current, status = w.run.status.current_attempt, w.run.status
    if attempt is None and current and status.phase == RunPhase.RUNNING:
        return create_promised(w, current)
    return attempt, NOTHING


def create_promised(w: World, number: int) -> tuple[Attempt, Transition]:
    """A grant interrupted after the Run's status was written: the Attempt it promised, and its create
    (so that status.attempts never counts one that does not exist, even if the Run stops before it
    runs)."""
    reason, input_value = _promised(w, number)
    epoch, resume_from = w.run.status.lease_epoch or 0, w.run.status.latest_checkpoint
    promised = attempt_object(w, number, epoch, reason, input_value, resume_from=resume_from)
    return promised, writes(CreateAttempt(promised.to_api()))


def _promised(world: World, number: int) -> tuple[str, Any]:
    """(reason, input) of Attempt `number`, whose grant was interrupted before the Attempt was created.

    The grant of a resume or a manual retry writes its Accepted control record in the same status write,
    so one Accepted record more than the Attempts started for that op names the missing Attempt (exact
    while status.controls holds the whole history: it drops its oldest records beyond
    MAX_RECORDED_CONTROLS). Otherwise the grant was an automatic retry, whose reason follows from how the
    previous Attempt ended.
    """
    status = world.run.status
    accepted = [
        c.op
        for c in status.controls or []
        if c.outcome == ControlOutcome.ACCEPTED and c.reason != controls.ACCEPTED_IN_HOLD
    ]
    kinds = [StartReason.parse(a.spec.reason).kind for a in world.attempts.values()]
    if accepted.count(ControlOp.RETRY) > kinds.count(StartKind.MANUAL_RETRY):
        return AttemptReason.MANUAL_RETRY, None
    if accepted.count(ControlOp.RESUME) > kinds.count(StartKind.RESUME) and status.inputs:
        answer = status.inputs[-1]  # the newest accepted input
        _, value = interrupts.recorded_value(world.run, answer)
        return AttemptReason.resume(answer.request_id), value
    return automatic_retry(world, number)


def automatic_retry(world: World, number: int) -> tuple[str, Any]:
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
            found, value = interrupts.recorded_value(world.run, held[-1])
            carried = value if found else None
    return _reason_after(previous), carried


def _reason_after(previous: Attempt | None) -> str:
    """Why the next Attempt starts, from how the previous one ended."""
    if previous is None:
        return AttemptReason.INITIAL
    if previous.status.phase == AttemptPhase.LEASE_LOST:
        return AttemptReason.LEASE_EXPIRED
    failure = previous.status.failure
    return AttemptReason.retry(failure.failure_class if failure else FailureClass.INFRASTRUCTURE)


def _created_by(checkpoint_id: str, attempt: Attempt) -> bool:
    """Checkpoint ids are <attempt>-s<sequence> (worker.session.save_checkpoint)."""
    return checkpoint_id.startswith(f"{attempt.metadata.name}-s")
