"""What a rule of the Run's table decides, as a value: a `Transition`. `render` turns it into the Plan.

A Transition says, in the order they are to be written: the Run's new phase with its reason and message
(`SetPhase`), what happens to an Attempt (`EndAttempt`), and the other writes wanted (plain Plan actions).
It carries no computed status: the conditions, the side-effect counts and the report of a phase change,
an Attempt's completion time are derived by `render` from the World, in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Final, Literal

from agentrun.api import (
    FINISHED_ATTEMPT_PHASES,
    STOPPED_PHASES,
    TERMINAL_PHASES,
    Attempt,
    AttemptFailure,
    AttemptPhase,
    PodGC,
    RunPhase,
)
from agentrun.core import report
from agentrun.core.conditions import conditions_for
from agentrun.core.plan import (
    Action,
    PatchAttemptStatus,
    PatchRunStatus,
    Plan,
    RecordEvent,
    consistency_of,
)
from agentrun.core.runs.world import World, rfc3339
from agentrun.core.traces import run_trace

EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True)
class SetPhase:
    """The Run moves to `phase` (why: `reason`, `message`); `fields` are the status fields written with it
    (a None value clears a field)."""

    phase: RunPhase
    reason: str
    message: str
    fields: Mapping[str, Any] = field(default_factory=lambda: EMPTY)


@dataclass(frozen=True)
class EndAttempt:
    """What happens to an Attempt: it ends in `phase` (with `failure`), preconditioned on the
    resourceVersion the decision saw, so a stale view never rewrites how it ended."""

    attempt: str
    phase: AttemptPhase
    failure: AttemptFailure | None
    expected_resource_version: str | None
    # The Run's trace, recorded on an Attempt that ended before it was seen running (else None).
    trace_id: str | None = None


Step = Action | SetPhase | EndAttempt


@dataclass(frozen=True)
class Transition:
    """One rule's decision: its steps in write order, and when to look at the Run again."""

    rule: str = ""
    steps: tuple[Step, ...] = ()
    requeue_after: float | None = None
    # When the current holder's Lease runs out unless renewed (core.plan.Plan.lease_expires_in).
    lease_expires_in: float | None = None

    @property
    def phase_change(self) -> SetPhase | None:
        """The Run's phase change, if the rule changes its phase."""
        return next((s for s in self.steps if isinstance(s, SetPhase)), None)

    @property
    def phase(self) -> RunPhase | None:
        change = self.phase_change
        return change.phase if change else None

    @property
    def reason(self) -> str | None:
        change = self.phase_change
        return change.reason if change else None

    @property
    def message(self) -> str | None:
        change = self.phase_change
        return change.message if change else None

    @property
    def attempt_ends(self) -> tuple[EndAttempt, ...]:
        """What happens to the Attempts: those that end, and how."""
        return tuple(s for s in self.steps if isinstance(s, EndAttempt))

    @property
    def actions(self) -> tuple[Action, ...]:
        """The other writes wanted (Leases, Attempts and Pods created or deleted, Events, records)."""
        return tuple(s for s in self.steps if not isinstance(s, SetPhase | EndAttempt))

    def wake_in(self, seconds: float) -> Transition:
        seconds = max(seconds, 0.0)
        earliest = seconds if self.requeue_after is None else min(self.requeue_after, seconds)
        return replace(self, requeue_after=earliest)

    def wake_at_lease_expiry(self, seconds: float) -> Transition:
        return replace(self, lease_expires_in=max(seconds, 0.0))

    def after(self, steps: tuple[Step, ...]) -> Transition:
        """The same transition with `steps` written first."""
        return replace(self, steps=(*steps, *self.steps))

    def then(self, *others: Transition | Step) -> Transition:
        """This transition's steps, then the others' (a Step alone is one); the earliest look again, and
        the last lease expiry given."""
        result = self
        for other in others:
            if not isinstance(other, Transition):
                result = replace(result, steps=(*result.steps, other))
                continue
            earliest = result.requeue_after
            if other.requeue_after is not None:
                earliest = other.requeue_after if earliest is None else min(earliest, other.requeue_after)
            expiry = result.lease_expires_in if other.lease_expires_in is None else other.lease_expires_in
            result = Transition(result.rule, (*result.steps, *other.steps), earliest, expiry)
        return result


NOTHING: Final = Transition()


def set_phase(phase: RunPhase, reason: str, message: str, **fields: Any) -> Transition:
    """The Run moves to `phase`, writing `fields` with it."""
    return Transition(steps=(SetPhase(phase, reason, message, MappingProxyType(fields)),))


def event(
    type_: Literal["Normal", "Warning"], reason: str, message: str, attempt: str | None = None
) -> Transition:
    return Transition(steps=(RecordEvent(type_, reason, message, attempt),))


def writes(*actions: Action) -> Transition:
    return Transition(steps=actions)


def wake_in(seconds: float) -> Transition:
    return NOTHING.wake_in(seconds)


def finish_attempt(
    world: World, attempt: Attempt, phase: AttemptPhase, failure: AttemptFailure | None
) -> Transition:
    """The Attempt ends in `phase`; nothing if it has ended already (history is never rewritten)."""
    if attempt.status.phase in FINISHED_ATTEMPT_PHASES:
        return NOTHING
    # The trace is recorded on an Attempt that ended before it was seen running.
    trace = trace_of(world) if attempt.status.trace_id is None else None
    rv = attempt.metadata.resource_version
    return Transition(steps=(EndAttempt(str(attempt.metadata.name), phase, failure, rv, trace),))


def render(world: World, transition: Transition) -> Plan:
    """The writes of `transition`, in its order, with the consistency they need (core.plan)."""
    actions = [_write(world, step) for step in transition.steps]
    return Plan(
        actions,
        transition.requeue_after,
        transition.lease_expires_in,
        consistency=consistency_of(actions, committed=world.run.status.committed_by is not None),
    )


def _write(world: World, step: Step) -> Action:
    if isinstance(step, SetPhase):
        return PatchRunStatus(phase_patch(world, step))
    if isinstance(step, EndAttempt):
        patch: dict[str, Any] = {"phase": step.phase.value, "completionTime": rfc3339(world.now)}
        if step.failure is not None:
            patch["failure"] = step.failure.to_api()
        if step.trace_id is not None:
            patch["traceId"] = step.trace_id
        tail = _collected_at_end(world, step.attempt)
        return PatchAttemptStatus(step.attempt, patch, step.expected_resource_version, log_tail_of=tail)
    return step


def _collected_at_end(world: World, attempt: str) -> str | None:
    """The Pod of an Attempt ending now whose log tail is kept with its end (PatchAttemptStatus.log_tail_of):
    stopped, and collected once the end is recorded (spec.podGC OnAttemptEnd; core.runs.compaction)."""
    run, pod = world.run, world.pods.get(attempt)
    if run.spec.pod_gc != PodGC.ON_ATTEMPT_END or run.metadata.deletion_timestamp is not None:
        return None
    if pod is None or not pod.finished or pod.deleting:
        return None
    return pod.name


def phase_patch(world: World, change: SetPhase) -> dict[str, Any]:
    """The Run status patch of a phase change: its conditions, the side-effect counts (the report too
    once the Run stopped), the counters of a Run's first status write, then the change's own fields. A Run
    that ends (Succeeded, Failed, Cancelled) waits for nobody any more: its pending request goes with it,
    so no inbox and no WAITING FOR column shows it."""
    run, status = world.run, world.run.status
    generation = run.metadata.generation
    patch: dict[str, Any] = {
        "phase": change.phase.value,
        "message": change.message[:1024],
        "observedGeneration": generation,
        "conditions": conditions_for(
            change.phase,
            change.reason,
            change.message,
            generation=generation,
            previous=status.conditions,
            now=world.now,
            between_attempts=change.fields.get("nextAttemptTime", status.next_attempt_time) is not None,
        ),
        "sideEffects": report.side_effect_counts(world.side_effects),
    }
    if status.phase is None:
        # The Run's first status write: the cancelEpoch it was created with is no cancel request, and
        # the counters start at zero even when the Run fails before any grant (nothing was started).
        patch.update(observedCancelEpoch=run.spec.cancel_epoch, attempts=0, leaseEpoch=0)
    if change.phase in TERMINAL_PHASES and status.pending_request is not None:
        patch["pendingRequest"] = None
    if world.store_mode is not None:
        patch["stateStore"] = world.store_mode.value
    patch.update(change.fields)
    if change.phase in STOPPED_PHASES:
        patch["report"] = report.run_report(world.side_effects)
    return patch


def trace_of(world: World) -> str:
    """The Run's trace (core.traces): recorded on each Attempt with a write made anyway."""
    meta = world.run.metadata
    return run_trace(str(meta.uid or meta.name), meta.annotations).run.trace_id
