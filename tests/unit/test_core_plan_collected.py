"""core.plan.consistency_of for what a finished Run leaves behind (core.runs.compaction): the log tail of a
stopped Pod, that Pod deleted (spec.podGC), the Run's Lease deleted with the Event that says so. Right on
any view of the Run, so they cost no fresh read of it; every other write keeps needing one. And an
Attempt that ends with its Pod stopped, collected at its end, records its log tail in the same write."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agentrun.api import FailureClass
from agentrun.core.plan import (
    Action,
    Consistency,
    DeleteLease,
    DeletePod,
    PatchAttemptStatus,
    RecordEvent,
    SaveLogTail,
    consistency_of,
)
from agentrun.core.runs import World, decide
from unit.factories import (
    committed_by,
    ended_pod,
    failed_attempt,
    held_by,
    kinds,
    make_run,
    name_of,
    of_type,
    run_status,
)
from unit.run_worlds import stopped, supervising


def ended_run(*, lease: bool, log_tail: bool, pod: bool = True) -> World:
    """A Run Failed after Attempt 1 (without a store), its Pod stopped under podGC OnAttemptEnd."""
    attempt = failed_attempt(1, FailureClass.TRANSIENT)
    if log_tail:
        body = attempt.to_api()
        body["status"]["logTail"] = {"text": "Traceback ...\n", "time": "2026-03-01T12:09:00Z"}
        attempt = type(attempt).model_validate(body)
    world = stopped("Failed", spec={"podGC": "OnAttemptEnd"})
    pods = {name_of(1): ended_pod(1, 75)} if pod else {}
    return replace(
        world, lease=held_by(1) if lease else None, has_store=False, attempts={1: attempt}, pods=pods
    )


@pytest.mark.parametrize(
    ("world", "written"),
    [
        pytest.param(ended_run(lease=True, log_tail=False, pod=False), ["DeleteLease"], id="the Lease"),
        pytest.param(ended_run(lease=False, log_tail=False), ["SaveLogTail"], id="a log tail"),
        pytest.param(ended_run(lease=False, log_tail=True), ["DeletePod"], id="a Pod collected"),
        pytest.param(ended_run(lease=True, log_tail=True), ["DeleteLease", "DeletePod"], id="both"),
    ],
)
def test_what_a_finished_run_leaves_behind_is_collected_from_the_cached_run(
    world: World, written: list[str]
) -> None:
    plan = decide(world)

    assert kinds(plan) == written
    assert plan.consistency == Consistency.CACHED_RUN and not plan.needs_fresh_run


def test_the_pod_collected_is_marked_and_the_lease_goes_with_its_event() -> None:
    plan = decide(ended_run(lease=True, log_tail=True))

    [pod] = of_type(plan, DeletePod)
    assert pod.collected
    assert [type(a) for a in plan.actions] == [DeleteLease, RecordEvent, DeletePod]


def test_a_pod_a_grant_deletes_at_once_still_needs_the_run_read_first() -> None:
    status = run_status("RetryBackoff", current=1, lease_epoch=1, nextAttemptTime="2026-03-01T12:00:00Z")
    world = ended_run(lease=True, log_tail=False)
    world = replace(world, run=make_run(status, spec={"podGC": "OnAttemptEnd"}))

    plan = decide(world)

    assert kinds(plan)[:2] == ["SaveLogTail", "DeletePod"]
    assert not of_type(plan, DeletePod)[0].collected
    assert plan.needs_fresh_run


RELEASED = RecordEvent("Normal", "LeaseReleased", "the Run has ended: its Lease is deleted")


@pytest.mark.parametrize(
    "actions",
    [
        pytest.param([RELEASED], id="an Event alone"),
        pytest.param([DeletePod("p")], id="a Pod deleted, not collected"),
        pytest.param([DeleteLease("7"), DeletePod("p", grace_seconds=0)], id="a Pod stopped after"),
        pytest.param([DeleteLease("7"), RELEASED, RELEASED], id="a second Event"),
        pytest.param([SaveLogTail("a", "p"), RELEASED], id="an Event after a tail"),
    ],
)
def test_anything_else_still_needs_the_run_read_first(actions: list[Action]) -> None:
    assert consistency_of(actions, committed=False) == Consistency.FRESH_RUN


def test_collected_says_how_a_pod_is_deleted_not_what_is_written() -> None:
    assert DeletePod("p", collected=True) == DeletePod("p")


# ---- the log tail kept with the Attempt's end ----------------------------------------------------------


def ending(**spec: str) -> PatchAttemptStatus:
    """The write that ends Attempt 1 (committed), its Pod stopped (exit 0)."""
    world = supervising(
        pod=ended_pod(1, 0),
        spec=dict(spec),
        committedBy=committed_by(1, 1),
        result={"ticket": "T-1"},
    )
    [end] = [a for a in of_type(decide(world), PatchAttemptStatus) if "phase" in a.patch]
    assert end.patch["phase"] == "Succeeded"
    return end


def test_an_attempt_whose_pod_is_collected_at_its_end_keeps_its_log_tail_in_the_same_write() -> None:
    assert ending(podGC="OnAttemptEnd").log_tail_of == name_of(1)


@pytest.mark.parametrize("policy", ["OnRunEnd", "Never"])
def test_a_pod_not_collected_at_the_attempts_end_has_no_tail_read_with_it(policy: str) -> None:
    assert ending(podGC=policy).log_tail_of is None


def test_an_attempt_ended_with_its_pod_gone_or_still_going_reads_no_tail() -> None:
    world = supervising(pod=None)
    ends = [a for a in of_type(decide(world), PatchAttemptStatus) if "phase" in a.patch]
    assert ends and all(a.log_tail_of is None for a in ends)
