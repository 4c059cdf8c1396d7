"""A name the Run needs held by an object it does not own (World.squatted, observed by the executor's
creates), decided by the table's NameSquatted rule: the Run fails, its own Lease revoked first, nothing of
the squatter written. On a real cluster: tests/integration/test_identity.py (squatters)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from agentrun.api import FailureClass, RunPhase
from agentrun.core.plan import WriteLease
from agentrun.core.runs import TABLE, World, decide
from unit.factories import (
    events,
    failure_of,
    kinds,
    make_attempt,
    make_lease,
    make_run,
    make_side_effect,
    make_world,
    of_type,
    run_patch,
    run_status,
)
from unit.run_worlds import backing_off, queued, stopped, supervising, waiting

NAME_SQUATTED = "NameSquatted"
TICKET = make_side_effect("ticket", "Confirmed")


def compensating_on_failure() -> World:
    """A Running Run whose policy compensates a failure, with a ticket to undo, its next Pod not seen."""
    run = make_run(
        run_status("Running", current=1, lease_epoch=1),
        spec={"retry": {"maxAttempts": 1}, "compensation": {"onFailure": "Compensate"}},
    )
    return replace(supervising(pod=None), run=run, side_effects=[TICKET])


@dataclass(frozen=True)
class Case:
    world: World
    squatted: dict[str, str]
    writes: list[str]  # the plan's writes in order (Events left out)
    epoch: int | None  # status.leaseEpoch written (the Run's own Lease revoked), None: none written
    said: str  # the object the message names


CASES: dict[str, Case] = {
    # a first grant whose Lease create found another's: no Lease of the Run's to revoke (a Run's first
    # status write starts its counters at 0)
    "first-grant-lease": Case(
        make_world(make_run()), {"triage": "Lease"}, ["PatchRunStatus"], 0, "Lease triage"
    ),
    "queued-lease": Case(queued(), {"triage": "Lease"}, ["PatchRunStatus"], None, "Lease triage"),
    # its Attempt's Pod squatted while it runs: the Lease held by a1 taken (epoch 2), then the Run fails
    "running-pod": Case(
        supervising(pod=None), {"triage-a1": "Pod"}, ["WriteLease", "PatchRunStatus"], 2, "Pod triage-a1"
    ),
    # a Lease nobody holds was revoked already: its epoch adopted, not bumped
    "running-pod-lease-revoked": Case(
        supervising(pod=None, lease=make_lease(None, 3)), {"triage-a1": "Pod"}, ["PatchRunStatus"], 3, "Pod"
    ),
    "retry-attempt": Case(
        backing_off(), {"triage-a2": "Attempt"}, ["WriteLease", "PatchRunStatus"], 2, "Attempt triage-a2"
    ),
    "waiting-resume-pod": Case(waiting(), {"triage-a2": "Pod"}, ["WriteLease", "PatchRunStatus"], 2, "Pod"),
    "needs-reconciliation-retry": Case(
        stopped("NeedsReconciliation"), {"triage-a2": "Pod"}, ["WriteLease", "PatchRunStatus"], 2, "Pod"
    ),
    # two names: the first by name is said (one decision, the same on every pass)
    "two-names": Case(
        supervising(pod=None),
        {"triage-a2": "Pod", "triage-a1": "Attempt"},
        ["WriteLease", "PatchRunStatus"],
        2,
        "Attempt triage-a1",
    ),
    # never redirected to Compensating: no Pod may run for the Run
    "policy-compensates-failure": Case(
        compensating_on_failure(), {"triage-a1": "Pod"}, ["WriteLease", "PatchRunStatus"], 2, "Pod"
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_squatted_name_fails_the_run_and_says_what_to_delete(case: Case) -> None:
    plan = decide(replace(case.world, squatted=case.squatted))

    assert kinds(plan) == case.writes
    patch = run_patch(plan)
    assert (patch["phase"], patch["failure"]["reason"]) == ("Failed", NAME_SQUATTED)
    assert patch["failure"]["class"] == FailureClass.DETERMINISTIC.value
    assert "compensating" not in patch
    assert patch["nextAttemptTime"] is None
    assert patch.get("leaseEpoch") == case.epoch
    assert case.said in patch["message"] and "is not owned by this Run" in patch["message"]
    assert "delete the" in patch["message"] and "retryRequest" in patch["message"]
    assert events(plan) == [("Warning", NAME_SQUATTED)]
    assert all(w.holder is None for w in of_type(plan, WriteLease)), "only ever revoked"


ENDED = {
    "failed": stopped("Failed"),
    "succeeded": stopped("Succeeded"),
    "cancelled": stopped("Cancelled"),
}


@pytest.mark.parametrize("world", ENDED.values(), ids=ENDED.keys())
def test_an_ended_run_is_not_written_for_a_squatted_name(world: World) -> None:
    assert decide(replace(world, squatted={"triage-a2": "Pod"})) == decide(world)


def test_the_table_declares_the_move_of_every_phase_but_the_ends_to_failed() -> None:
    rule = next(r for r in TABLE.rules if r.name == NAME_SQUATTED)
    ends = {RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.CANCELLED}

    assert set(rule.moves) == {(p, RunPhase.FAILED) for p in [None, *RunPhase] if p not in ends}
    assert TABLE.names.index(NAME_SQUATTED) == 1, "decided right after Deleted, before any other rule"


def test_a_squatted_name_comes_before_everything_but_a_deletion() -> None:
    """A Run being deleted is not written (its objects go with it); a deadline passed or a commit seen is
    not what the Run fails for while a name it needs is held."""
    world = replace(supervising(pod=None), squatted={"triage-a1": "Pod"})
    deleting = world.run.model_copy(
        update={"metadata": world.run.metadata.model_copy(update={"deletion_timestamp": world.now})}
    )

    assert list(decide(replace(world, run=deleting)).actions) == []
    failed = make_attempt(1, phase="Failed", failure=failure_of(FailureClass.DETERMINISTIC))
    assert run_patch(decide(replace(world, attempts={1: failed})))["failure"]["reason"] == NAME_SQUATTED
