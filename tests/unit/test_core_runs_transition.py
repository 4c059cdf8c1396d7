"""A rule's decision as a value (core.runs.transition.Transition), how render turns it into writes, and
the consistency the Plan states for them: all decided in core."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from agentrun.api import AttemptPhase, FailureClass, RejectedCommitReason, RunPhase
from agentrun.api.causes import RefusalCause
from agentrun.core.fence import refusal_cause
from agentrun.core.plan import Consistency, CreatePod, DeletePod, PatchRunStatus, WriteLease
from agentrun.core.runs import TABLE, decide
from agentrun.core.runs.transition import EndAttempt, SetPhase, Transition, render
from unit.factories import (
    committed_by,
    ended_pod,
    held_by,
    make_attempt,
    make_run,
    make_side_effect,
    make_world,
    run_status,
)


def ended(exit_code: int, **status: Any) -> Any:
    run = make_run(run_status("Running", current=1, lease_epoch=1, **status))
    return make_world(
        run, attempts=[make_attempt(1)], pods=[ended_pod(1, exit_code)], lease=held_by(1), expires_in=30.0
    )


def test_a_transition_says_its_rule_phase_reason_and_what_happens_to_the_attempt() -> None:
    rule, transition = TABLE.transition(ended(137))  # killed: infrastructure, retried

    assert rule.name == "Running"
    assert transition.rule == "Running/PodEnded"  # the row of the Running sub-table
    assert transition.phase == RunPhase.RETRY_BACKOFF
    assert transition.reason == "RetryScheduled"
    assert [(e.attempt, e.phase) for e in transition.attempt_ends] == [("triage-a1", AttemptPhase.FAILED)]
    assert all(not isinstance(a, SetPhase | EndAttempt) for a in transition.actions)


def test_render_writes_the_steps_in_the_order_of_the_transition() -> None:
    world = ended(1)
    transition = TABLE.transition(world)[1]
    plan = render(world, transition)

    assert len(plan.actions) == len(transition.steps)
    assert plan == decide(world)
    assert plan.requeue_after == transition.requeue_after


@pytest.mark.parametrize(
    ("world", "consistency"),
    [
        pytest.param(make_world(make_run()), Consistency.CACHED_RUN, id="first grant: Lease created first"),
        pytest.param(ended(1), Consistency.FRESH_RUN, id="an Attempt ended from its Pod's exit alone"),
        pytest.param(
            ended(0, committedBy=committed_by(1, 1), result={"ok": True}),
            Consistency.CACHED_RUN,
            id="an Attempt ended after the commit was seen",
        ),
    ],
)
def test_the_plan_states_the_consistency_its_writes_need(world: Any, consistency: Consistency) -> None:
    assert decide(world).consistency == consistency


def test_a_first_grant_writes_the_lease_first() -> None:
    plan = decide(make_world(make_run()))

    assert isinstance(plan.actions[0], WriteLease) and isinstance(plan.actions[1], PatchRunStatus)
    assert not plan.needs_fresh_run


def test_the_compensation_before_an_end_is_a_named_row() -> None:
    """A Run failing for good with something to undo and onFailure Compensate: the rule says Failed,
    the CompensateFirst row makes it Compensating, in the open."""
    spec = {"retry": {"maxAttempts": 1}, "compensation": {"onFailure": "Compensate"}}
    run = make_run(run_status("Running", current=1, lease_epoch=1), spec=spec)
    world = make_world(
        run,
        attempts=[make_attempt(1)],
        pods=[ended_pod(1, 1, message='{"class": "deterministic", "message": "boom"}')],
        lease=held_by(1),
        side_effects=[make_side_effect("ticket", "Confirmed", reversible=True)],
    )
    rule, transition = TABLE.transition(world)

    assert rule.name == "Running"
    assert transition.rule == "Running/PodEnded+CompensateFirst"
    assert transition.phase == RunPhase.COMPENSATING
    assert transition.phase_change is not None
    assert transition.phase_change.fields["compensating"] == {"returnPhase": "Failed", "firstAttempt": 2}


def test_an_empty_transition_renders_no_write() -> None:
    world = make_world(make_run())
    plan = render(world, Transition().wake_in(3))

    assert plan.actions == [] and plan.requeue_after == 3 and not plan.needs_fresh_run


@pytest.mark.parametrize("cause", list(RefusalCause))
def test_every_refusal_cause_is_classified_from_the_message_it_writes(cause: RefusalCause) -> None:
    assert refusal_cause(cause.says("something")) == (cause, cause.fence)
    assert RefusalCause.of(cause.says("x")) == cause


def test_only_the_lost_fences_are_recorded_as_rejected_commits() -> None:
    fences = {cause: cause.fence for cause in RefusalCause if cause.fence is not None}

    assert fences == {
        RefusalCause.STALE_AFTER_CANCEL: RejectedCommitReason.STALE_AFTER_CANCEL,
        RefusalCause.STALE_WORKER: RejectedCommitReason.STALE_WORKER,
        RefusalCause.NOT_CURRENT_ATTEMPT: RejectedCommitReason.STALE_WORKER,
    }


# ---- a Pod the API server refused: an observation, decided in core -------------------------------------


def refused_pod_world(phase: str = "Running", **spec: Any) -> Any:
    """Attempt 1 granted (not started), its Pod refused as invalid by the API server."""
    run = make_run(run_status(phase, current=1, lease_epoch=1), spec=spec or None)
    world = make_world(run, attempts=[make_attempt(1, phase=None, started=False)], lease=held_by(1))
    return replace(world, refused_pods={"triage-a1": 'Pod "triage-a1" is invalid: spec.containers: Required'})


def test_a_refused_pod_fails_its_attempt_in_core() -> None:
    world = refused_pod_world()
    transition = TABLE.transition(world)[1]
    plan = decide(world)

    assert transition.rule == "Running/PodRefused"
    [ended] = transition.attempt_ends
    assert (ended.attempt, ended.phase) == ("triage-a1", AttemptPhase.FAILED)
    assert ended.failure is not None and ended.failure.failure_class == FailureClass.DETERMINISTIC
    refusal = 'Pod "triage-a1" is invalid: spec.containers: Required'
    assert ended.failure.message == f"the attempt Pod was refused: {refusal}"
    assert transition.phase == RunPhase.FAILED  # deterministic: not retried
    assert plan.needs_fresh_run  # the Attempt ends from the API server's word alone: read the Run first
    assert not any(isinstance(a, CreatePod) for a in plan.actions)  # not asked for again


def test_without_the_refusal_the_pod_is_created() -> None:
    world = replace(refused_pod_world(), refused_pods={})

    assert TABLE.transition(world)[1].rule == "Running/PodNotCreated"
    assert any(isinstance(a, CreatePod) for a in decide(world).actions)


def test_a_refused_compensation_pod_fails_the_compensation_attempt() -> None:
    run = make_run(
        run_status(
            "Compensating",
            current=1,
            lease_epoch=1,
            compensating={"returnPhase": "Failed", "firstAttempt": 1},
        ),
    )
    world = make_world(
        run,
        attempts=[make_attempt(1, phase=None, started=False, reason="compensate")],
        lease=held_by(1),
        side_effects=[make_side_effect("ticket", "Confirmed", reversible=True)],
    )
    world = replace(world, refused_pods={"triage-a1": "invalid"})
    transition = TABLE.transition(world)[1]

    assert transition.rule == "Compensating/PodRefused"
    assert [(e.phase, e.failure and e.failure.message) for e in transition.attempt_ends] == [
        (AttemptPhase.FAILED, "the attempt Pod was refused: invalid")
    ]


def test_transitions_compose_in_order_with_the_earliest_wake_and_the_last_lease_expiry() -> None:
    first = Transition(steps=(DeletePod("a"),), requeue_after=30.0, lease_expires_in=10.0)
    second = Transition(steps=(DeletePod("b"),), requeue_after=5.0)
    third = Transition(lease_expires_in=20.0)

    composed = first.then(second, DeletePod("c"), third)

    assert composed.steps == (DeletePod("a"), DeletePod("b"), DeletePod("c"))
    assert composed.requeue_after == 5.0
    assert composed.lease_expires_in == 20.0
    assert first.steps == (DeletePod("a"),)  # values: composing changes none of them
