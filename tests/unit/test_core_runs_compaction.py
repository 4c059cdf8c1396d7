"""core.runs.compaction: a finished Run's Checkpoint index to the store, its superseded Checkpoints and its
Lease deleted, epochs that never go back after that, and the Pods of ended Attempts collected (spec.podGC)
after their log tail was kept. Restarts between any two of these writes: test_core_runs_simulation."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from agentrun.api import Checkpoint, FailureClass, SideEffect
from agentrun.core.lease import epoch_for_grant
from agentrun.core.plan import (
    ClearManagedFields,
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
    make_side_effect,
    make_world,
    name_of,
    of_type,
    run_status,
)
from unit.run_worlds import CHAIN, UNKNOWN_EFFECT, retry_spec, stopped
from unit.test_core_runs_expiry import at, expires_time
from unit.test_core_runs_expiry import finished as expiring

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


# ---- managedFields cleared (the last write of a compacted Run) -----------------------------------------

MANAGED_ALL = frozenset(
    {
        ("runs", "triage"),
        ("attempts", name_of(1)),
        ("checkpoints", "ckpt-5"),
        ("checkpoints", "ckpt-1"),  # a superseded one: deleted first, never cleared
    }
)


def compacted(**kwargs: Any) -> World:
    """A Run compacted with a store (index recorded, no Lease), only its latest Checkpoint left."""
    world = finished(lease=False, index=INDEX, **kwargs)
    latest = make_checkpoint("ckpt-5", 5).to_api()
    latest["metadata"]["resourceVersion"] = "305"
    return replace(world, checkpoints=(Checkpoint.model_validate(latest),))


def test_a_compacted_run_at_rest_has_its_managed_fields_cleared_run_first() -> None:
    world = replace(compacted(), managed_fields=MANAGED_ALL)

    plan = decide(world)

    assert [(a.kind, a.name) for a in of_type(plan, ClearManagedFields)] == [
        ("runs", "triage"),
        ("attempts", name_of(1)),
        ("checkpoints", "ckpt-5"),
    ]
    assert kinds(plan) == ["ClearManagedFields"] * 3
    # each preconditioned on the version the decision saw; the Run's first, so the cached view will do
    run_clear, attempt_clear, _ = of_type(plan, ClearManagedFields)
    assert run_clear.resource_version == world.run.metadata.resource_version
    assert attempt_clear.resource_version == world.attempts[1].metadata.resource_version
    assert not plan.needs_fresh_run


def test_only_the_objects_that_carry_managed_fields_are_cleared_and_then_nothing() -> None:
    body = make_side_effect("k1", "Confirmed").to_api()
    body["metadata"]["resourceVersion"] = "77"
    effect = SideEffect.model_validate(body)
    world = stopped("Succeeded", side_effects=(effect,), latestCheckpoint="ckpt-5", checkpointIndex=INDEX)
    world = replace(world, lease=None, has_store=True)
    name = str(effect.metadata.name)

    plan = decide(replace(world, managed_fields=frozenset({("sideeffects", name)})))

    assert of_type(plan, ClearManagedFields) == [ClearManagedFields("sideeffects", name, "77")]
    assert kinds(decide(world)) == []  # none left: nothing to write


def test_the_superseded_checkpoints_go_before_anything_is_cleared() -> None:
    world = replace(finished(lease=False, index=INDEX), managed_fields=MANAGED_ALL)

    assert set(kinds(decide(world))) == {"DeleteCheckpoint"}


def test_not_before_the_index_is_written_and_the_lease_deleted() -> None:
    assert "ClearManagedFields" not in kinds(decide(replace(finished(), managed_fields=MANAGED_ALL)))


def test_not_while_a_log_tail_is_to_be_kept_or_a_pod_collected() -> None:
    tail = replace(with_pod("OnAttemptEnd"), managed_fields=MANAGED_ALL)
    collect = replace(with_pod("OnAttemptEnd", log_tail=True), managed_fields=MANAGED_ALL)

    assert kinds(decide(tail)) == ["SaveLogTail"]
    assert kinds(decide(collect)) == ["DeletePod"]
    # the Pod gone: the Attempt (its tail recorded) is cleared with the Run
    gone = replace(collect, pods={})
    assert [(a.kind, a.name) for a in of_type(decide(gone), ClearManagedFields)][:2] == [
        ("runs", "triage"),
        ("attempts", name_of(1)),
    ]


def test_without_a_store_the_run_is_cleared_once_its_lease_is_gone() -> None:
    world = replace(finished(store=False, lease=False), managed_fields=frozenset({("runs", "triage")}))

    assert kinds(decide(world)) == ["ClearManagedFields"]
    # ... never while its Lease stays (a recorded index, no store: the Lease says the index is behind)
    kept = replace(finished(store=False, index=INDEX), managed_fields=frozenset({("runs", "triage")}))
    assert kinds(decide(kept)) == []


def test_a_run_with_a_time_to_live_writes_its_expiry_first_then_is_cleared_and_waits() -> None:
    managed = frozenset({("runs", "triage")})
    world = replace(expiring(ttl=600, now=at(100)), managed_fields=managed)

    assert kinds(decide(world)) == ["PatchRunStatus"]  # expiresTime: a write that adds an entry again
    plan = decide(replace(expires_time(expiring(ttl=600, now=at(100))), managed_fields=managed))
    assert kinds(plan) == ["ClearManagedFields"]
    assert plan.requeue_after == 500  # the wake for its expiry is kept


def test_a_run_due_for_its_archive_is_archived_and_deleted_not_cleared() -> None:
    world = replace(expires_time(expiring(ttl=0, now=at(0))), managed_fields=frozenset({("runs", "triage")}))

    assert kinds(decide(world)) == ["ArchiveRun", "DeleteRun"]


def test_not_on_a_run_that_is_not_at_rest() -> None:
    """NeedsReconciliation, or an effect whose outcome is open: a person still works on the Run."""
    needs = replace(finished(phase="NeedsReconciliation", lease=False), managed_fields=MANAGED_ALL)
    open_effect = replace(
        compacted(phase="Failed"), side_effects=(UNKNOWN_EFFECT,), managed_fields=MANAGED_ALL
    )

    assert "ClearManagedFields" not in kinds(decide(needs))
    assert "ClearManagedFields" not in kinds(decide(open_effect))
