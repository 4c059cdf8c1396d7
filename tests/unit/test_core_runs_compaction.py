"""core.runs.compaction: a finished Run's Checkpoint index to the store, its superseded Checkpoints and its
Lease deleted, epochs that never go back after that, and the Pods of ended Attempts collected (spec.podGC)
after their log tail was kept. Restarts between any two of these writes: test_core_runs_simulation."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from agentrun.api import Checkpoint, FailureClass
from agentrun.core.lease import epoch_for_grant
from agentrun.core.plan import (
    CreateAttempt,
    DeleteCheckpoint,
    DeleteLease,
    DeletePod,
    PatchRunStatus,
    SaveLogTail,
    WriteCheckpointIndex,
    WriteLease,
)
from agentrun.core.runs import World, decide
from agentrun.core.runs.compaction import superseded
from unit.factories import (
    NAMESPACE,
    ended_pod,
    failed_attempt,
    held_by,
    kinds,
    make_attempt,
    make_checkpoint,
    make_lease,
    make_run,
    make_world,
    name_of,
    of_type,
    run_status,
)
from unit.run_worlds import CHAIN, UNKNOWN_EFFECT, retry_spec, stopped

INDEX = {"key": f"p/{NAMESPACE}/uid/sha256/{'a' * 64}", "sha256": "a" * 64, "size": 123, "links": True}


def finished(
    *,
    store: bool = True,
    lease: bool = True,
    index: dict[str, Any] | None = None,
    phase: str = "Succeeded",
    checkpoints: tuple[Checkpoint, ...] = CHAIN,
    spec: dict[str, Any] | None = None,
    **status: Any,
) -> World:
    """A Run that ended in `phase` after Attempt 1 (its Pod gone), Checkpoints ckpt-1..5 saved."""
    status.setdefault("latestCheckpoint", "ckpt-5")
    if index is not None:
        status["checkpointIndex"] = index
    world = stopped(phase, spec=spec, checkpoints=checkpoints, **status)
    return replace(world, lease=held_by(1) if lease else None, has_store=store)


# ---- compaction -------------------------------------------------------------------------------------


def test_a_finished_run_with_a_store_writes_its_index_then_deletes_its_lease() -> None:
    plan = decide(finished())

    assert kinds(plan) == ["WriteCheckpointIndex", "DeleteLease"]
    [index] = of_type(plan, WriteCheckpointIndex)
    assert [c["spec"]["id"] for c in index.checkpoints] == [f"ckpt-{n}" for n in range(1, 6)]
    assert index.checkpoints[0]["spec"]["state"] == {"step": 1}  # the executor moves it into a blob
    assert index.previous is None
    assert of_type(plan, DeleteLease) == [DeleteLease(held_by(1).resource_version)]


def test_once_the_index_is_recorded_and_the_lease_gone_the_superseded_checkpoints_go() -> None:
    plan = decide(finished(lease=False, index=INDEX))

    assert [a.name for a in of_type(plan, DeleteCheckpoint)] == ["ckpt-1", "ckpt-2", "ckpt-3", "ckpt-4"]


def test_a_compacted_run_keeps_what_is_pointed_at() -> None:
    """The latest (a retry continues there), a pending request's, an Attempt's resumeFrom."""
    world = finished(lease=False, index=INDEX, latestCheckpoint="ckpt-4")
    world = replace(world, attempts={1: failed_attempt(1, FailureClass.DETERMINISTIC, resume_from="ckpt-2")})

    gone = superseded(world.run, world.checkpoints, world.attempts.values())

    assert gone == ["ckpt-1", "ckpt-3"]  # ckpt-5, the newest, is kept too


def linked(n: int, **spec: Any) -> Checkpoint:
    """ckpt-n of a chain whose parents are recorded."""
    body = make_checkpoint(f"ckpt-{n}", n).to_api()
    body["spec"].update({"parent": f"ckpt-{n - 1}"} if n > 1 else {}, **spec)
    return Checkpoint.model_validate(body)


def test_entries_go_before_the_state_they_belong_to_and_a_delta_chain_is_kept() -> None:
    writes = make_checkpoint("ckpt-1-w1", 1).to_api()
    writes["spec"].update(kind="Writes", parent="ckpt-1")
    chain = (
        *(linked(n) for n in range(1, 5)),
        linked(5, deltaBase="ckpt-3"),
        Checkpoint.model_validate(writes),
    )
    world = finished(lease=False, index=INDEX, checkpoints=chain)

    # ckpt-5 is rebuilt from ckpt-4 and ckpt-3: they stay; the Writes entry of ckpt-1 goes before it
    assert superseded(world.run, world.checkpoints, ()) == ["ckpt-1-w1", "ckpt-1", "ckpt-2"]


def test_a_run_compacted_before_and_retried_merges_its_earlier_index() -> None:
    """A Lease on a finished Run means a grant happened since the index was written: written again,
    naming the earlier index, before anything is deleted."""
    plan = decide(finished(index=INDEX))

    assert kinds(plan) == ["WriteCheckpointIndex", "DeleteLease"]
    assert of_type(plan, WriteCheckpointIndex)[0].previous == INDEX


def test_without_a_store_only_the_lease_goes_and_every_checkpoint_stays() -> None:
    plan = decide(finished(store=False))

    assert kinds(plan) == ["DeleteLease"]
    assert not of_type(plan, DeleteCheckpoint)


def test_without_a_store_a_recorded_index_keeps_the_lease_that_says_it_is_behind() -> None:
    assert kinds(decide(finished(store=False, index=INDEX))) == []


@pytest.mark.parametrize(
    "world",
    [
        pytest.param(finished(phase="NeedsReconciliation"), id="needs-reconciliation"),
        pytest.param(
            replace(finished(phase="Failed"), side_effects=(UNKNOWN_EFFECT,)),
            id="an-effect-whose-outcome-is-open",
        ),
        pytest.param(
            replace(finished(), pods={name_of(1): replace(ended_pod(1, 1), exit=None, phase="Running")}),
            id="its-pod-still-running",
        ),
    ],
)
def test_no_compaction_while_a_person_or_a_pod_may_still_need_the_run(world: World) -> None:
    plan = decide(world)

    assert not of_type(plan, WriteCheckpointIndex)
    assert not of_type(plan, DeleteLease)
    assert not of_type(plan, DeleteCheckpoint)


# ---- epochs never go back ---------------------------------------------------------------------------


def test_a_grant_with_no_lease_takes_the_epoch_after_the_recorded_one() -> None:
    assert epoch_for_grant(None, name_of(5), recorded=4) == (5, True)
    assert epoch_for_grant(None, name_of(1)) == (1, True)  # a Run's first grant
    assert epoch_for_grant(make_lease(name_of(2), 7), name_of(2), recorded=7) == (7, False)


def test_a_manual_retry_of_a_compacted_run_creates_a_lease_at_the_next_epoch() -> None:
    status = run_status("Failed", current=1, lease_epoch=4, latestCheckpoint="ckpt-5", checkpointIndex=INDEX)
    run = make_run(status, spec=retry_spec())
    world = replace(
        make_world(
            run, attempts=[failed_attempt(1, FailureClass.DETERMINISTIC, lease_epoch=4)], checkpoints=CHAIN
        ),
        has_store=True,
    )

    plan = decide(world)

    [lease] = of_type(plan, WriteLease)
    assert (lease.holder, lease.epoch, lease.expected_resource_version) == (name_of(2), 5, None)
    [run_write] = [a for a in of_type(plan, PatchRunStatus) if "leaseEpoch" in a.patch]
    assert run_write.patch["leaseEpoch"] == 5
    [created] = of_type(plan, CreateAttempt)
    assert created.body["spec"]["resumeFrom"] == "ckpt-5"  # the kept latest Checkpoint


# ---- Pods collected (spec.podGC) --------------------------------------------------------------------


def with_pod(policy: str, phase: str = "Failed", *, log_tail: bool = False) -> World:
    """Attempt 1 failed and its Pod stopped; the Run in `phase` under spec.podGC `policy`."""
    attempt = failed_attempt(1, FailureClass.TRANSIENT)
    if log_tail:
        body = attempt.to_api()
        body["status"]["logTail"] = {"text": "Traceback ...\n", "time": "2026-03-01T12:09:00Z"}
        attempt = type(attempt).model_validate(body)
    world = finished(phase=phase, spec={"podGC": policy}, store=False, lease=False)
    return replace(world, attempts={1: attempt}, pods={name_of(1): ended_pod(1, 75)})


def test_an_ended_attempts_log_tail_is_kept_first() -> None:
    plan = decide(with_pod("OnAttemptEnd"))

    assert of_type(plan, SaveLogTail) == [SaveLogTail(name_of(1), name_of(1))]
    assert not of_type(plan, DeletePod)


def test_its_pod_is_deleted_once_the_tail_is_recorded() -> None:
    plan = decide(with_pod("OnAttemptEnd", log_tail=True))

    assert of_type(plan, DeletePod) == [DeletePod(name_of(1))]
    assert not of_type(plan, SaveLogTail)


def test_on_attempt_end_collects_while_the_run_backs_off() -> None:
    world = with_pod("OnAttemptEnd", phase="Failed")
    status = run_status("RetryBackoff", current=1, lease_epoch=1, nextAttemptTime="2026-03-01T13:00:00Z")
    world = replace(world, run=make_run(status, spec={"podGC": "OnAttemptEnd"}), lease=held_by(1))

    assert of_type(decide(world), SaveLogTail) == [SaveLogTail(name_of(1), name_of(1))]


def test_on_run_end_waits_for_the_run_to_end() -> None:
    status = run_status("RetryBackoff", current=1, lease_epoch=1, nextAttemptTime="2026-03-01T13:00:00Z")
    backing_off = replace(
        with_pod("OnRunEnd"), run=make_run(status, spec={"podGC": "OnRunEnd"}), lease=held_by(1)
    )

    assert not of_type(decide(backing_off), SaveLogTail)
    assert of_type(decide(with_pod("OnRunEnd")), SaveLogTail) == [SaveLogTail(name_of(1), name_of(1))]


def test_never_keeps_the_pod() -> None:
    plan = decide(with_pod("Never", log_tail=True))

    assert not of_type(plan, SaveLogTail)
    assert not of_type(plan, DeletePod)


def test_a_running_attempts_pod_is_not_collected() -> None:
    world = with_pod("OnAttemptEnd")
    world = replace(world, attempts={1: make_attempt(1, phase="Running")})

    assert not of_type(decide(world), SaveLogTail)


def test_the_pod_of_a_run_being_deleted_is_left_to_the_garbage_collector() -> None:
    world = with_pod("OnAttemptEnd")
    run = make_run(
        run_status("Failed", current=1, lease_epoch=1),
        spec={"podGC": "OnAttemptEnd"},
        metadata={"deletionTimestamp": "2026-03-01T12:09:00Z"},
    )

    assert kinds(decide(replace(world, run=run))) == []


def test_a_grant_keeps_a_stopped_superseded_pods_tail_before_deleting_it_at_once() -> None:
    """Its Pod must go at once (credentials): the tail is kept first as far as it can be read now."""
    status = run_status("RetryBackoff", current=1, lease_epoch=1, nextAttemptTime="2026-03-01T12:00:00Z")
    world = replace(
        with_pod("OnAttemptEnd"), run=make_run(status, spec={"podGC": "OnAttemptEnd"}), lease=held_by(1)
    )

    plan = decide(world)

    assert kinds(plan)[:2] == ["SaveLogTail", "DeletePod"]
    assert of_type(plan, SaveLogTail) == [SaveLogTail(name_of(1), name_of(1), best_effort=True)]
    assert of_type(plan, DeletePod) == [DeletePod(name_of(1), grace_seconds=0)]
    assert of_type(plan, WriteLease)[0].holder == name_of(2)


def test_a_run_refused_before_any_attempt_is_not_compacted() -> None:
    """Only an Attempt's Pod saves Checkpoints: those of a Run that never had one are left alone."""
    world = finished(phase="Failed", lease=False, attempts=0)
    world = replace(world, attempts={})

    assert kinds(decide(world)) == []
