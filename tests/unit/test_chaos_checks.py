"""The invariant checks of the chaos run (bench/chaos.py) find what they are meant to find: each is shown a
small world that breaks its promise, and one that keeps it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "chaos.py"


@pytest.fixture(scope="module")
def chaos() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chaos_under_test", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def run(name: str, phase: str, cancel_epoch: int = 0, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"cancelEpoch": cancel_epoch},
        "status": {"phase": phase, **status},
    }


def attempt(run_name: str, number: int, epoch: int, phase: str = "Succeeded", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{run_name}-a{number}"},
        "spec": {"runName": run_name, "number": number, "leaseEpoch": epoch, "reason": "initial", **spec},
        "status": {"phase": phase},
    }


def committed(run_name: str, number: int, lease: int, cancel: int = 0) -> dict[str, Any]:
    return {"attempt": f"{run_name}-a{number}", "leaseEpoch": lease, "cancelEpoch": cancel}


def succeeded(chaos: ModuleType, lease: int = 2) -> Any:
    """Run r Succeeded: Attempt 1 failed, Attempt 2 (lease epoch 2) committed with lease epoch `lease`."""
    cb = committed("r", 2, lease)
    runs = {"r": run("r", "Succeeded", currentAttempt=2, attempts=2, leaseEpoch=2, result={}, committedBy=cb)}
    return chaos.World(
        runs=runs, attempts=[attempt("r", 1, 1, "Failed"), attempt("r", 2, 2)], checkpoints=[], effects=[]
    )


def test_a_second_creation_under_one_key_is_counted(chaos: ModuleType) -> None:
    audit = [
        {"event": "created", "idempotencyKey": "k1"},
        {"event": "replayed", "idempotencyKey": "k1"},
        {"event": "created", "idempotencyKey": "k2"},
    ]
    assert chaos.tickets_created_twice(audit) == []
    assert len(chaos.tickets_created_twice([*audit, {"event": "created", "idempotencyKey": "k1"}])) == 1


def test_a_second_close_of_one_ticket_is_counted(chaos: ModuleType) -> None:
    audit = [
        {"event": "created", "ticketId": "T-1"},
        {"event": "closed", "ticketId": "T-1"},
        {"event": "closed", "ticketId": "T-2"},
    ]
    assert chaos.tickets_closed_twice(audit) == []
    assert len(chaos.tickets_closed_twice([*audit, {"event": "close-repeated", "ticketId": "T-1"}])) == 1


@pytest.mark.parametrize(("phase", "violations"), [("Succeeded", 1), ("Cancelled", 1), ("Running", 0)])
def test_a_record_left_pending_on_an_ended_run_is_counted(
    chaos: ModuleType, phase: str, violations: int
) -> None:
    effect = {"metadata": {"name": "sfx-1"}, "spec": {"runName": "r"}, "status": {"state": "Pending"}}
    world = chaos.World({"r": run("r", phase)}, [], [], [effect])
    assert len(chaos.effects_pending_on_terminal(world)) == violations
    effect["status"]["state"] = "Unknown"
    assert chaos.effects_pending_on_terminal(world) == []


def test_a_result_written_after_the_cancel_is_a_violation(chaos: ModuleType) -> None:
    world = succeeded(chaos)
    world.runs["r"]["spec"]["cancelEpoch"] = 1
    # The cancel's answer showed no result yet: the result came after it.
    after = [chaos.CancelRecord("r", 1, None)]
    assert len(chaos.results_after_cancel(world, after)[0]) == 1
    # The cancel's answer already held this very commit: too late a cancel, the Run rightly Succeeded.
    before = [chaos.CancelRecord("r", 1, committed("r", 2, 2))]
    assert chaos.results_after_cancel(world, before) == ([], [])
    world.runs["r"]["status"]["phase"] = "Cancelled"
    assert len(chaos.results_after_cancel(world, before)[0]) == 2  # Cancelled with a result, not Succeeded


def test_a_commit_with_another_lease_epoch_is_a_violation(chaos: ModuleType) -> None:
    assert chaos.stale_lease_commits(succeeded(chaos)) == []
    assert len(chaos.stale_lease_commits(succeeded(chaos, lease=1))) == 2  # the Attempt's and the Run's
    world = succeeded(chaos)
    world.attempts[0]["spec"]["leaseEpoch"] = 2  # two Attempts with one epoch
    assert len(chaos.stale_lease_commits(world)) == 1


def test_an_unknown_effect_must_stop_the_run_and_be_counted(chaos: ModuleType) -> None:
    effect = {"metadata": {"name": "sfx-1"}, "spec": {"runName": "r"}, "status": {"state": "Unknown"}}
    unsure = run("r", "NeedsReconciliation", sideEffects={"unknown": 1})
    assert chaos.unknown_not_surfaced(chaos.World({"r": unsure}, [], [], [effect])) == []
    unsure["status"]["sideEffects"]["unknown"] = 0
    assert len(chaos.unknown_not_surfaced(chaos.World({"r": unsure}, [], [], [effect]))) == 1
    done = run("r", "Succeeded", sideEffects={"unknown": 1})
    assert len(chaos.unknown_not_surfaced(chaos.World({"r": done}, [], [], [effect]))) == 1


def test_a_missing_attempt_or_input_record_is_history_lost(chaos: ModuleType) -> None:
    records = chaos.Records()
    assert chaos.history_lost(succeeded(chaos), records) == []
    gap = succeeded(chaos)
    gap.attempts.pop(0)
    assert len(chaos.history_lost(gap, records)) == 1
    orphan = succeeded(chaos)
    orphan.runs["r"]["status"]["inputs"] = [{"requestId": "r-r1", "idempotencyKey": "k"}]
    found = chaos.history_lost(orphan, records)
    assert any("no Accepted Resume" in v for v in found), found
    records.accepted_seen["r"].add("k")
    assert any("is gone" in v for v in chaos.history_lost(succeeded(chaos), records))


MISRECORDED = {
    "asked-again": (
        lambda w: w.runs["r"]["status"].update(
            controls=[
                {"idempotencyKey": k, "op": "Resume", "outcome": "Accepted"} for k in ("answer-1", "answer-2")
            ]
        ),
        "asked again",
    ),
    "going-on-an-ended-run": (lambda w: w.attempts[0]["status"].update(phase="Pending"), "Pending on a"),
    "a-retry-called-initial": (lambda w: w.attempts[1]["spec"].update(reason="initial"), "'initial'"),
    "pod-judged-lost": (
        lambda w: w.attempts[0]["status"].update(failure={"message": "the attempt Pod disappeared"}),
        "disappeared",
    ),
}


@pytest.mark.parametrize(("spoil", "found"), MISRECORDED.values(), ids=MISRECORDED.keys())
def test_history_that_reads_otherwise_than_it_happened_is_misrecorded(
    chaos: ModuleType, spoil: Any, found: str
) -> None:
    world = succeeded(chaos)
    world.attempts[1]["spec"]["reason"] = "retry:transient"
    assert chaos.attempts_misrecorded(world) == []
    spoil(world)
    violations = chaos.attempts_misrecorded(world)
    assert len(violations) == 1 and found in violations[0], violations


def test_a_forged_write_the_api_server_accepted_is_a_violation(chaos: ModuleType) -> None:
    outcomes = {"victim result": "refused 403: NotOwnRun: ...", "victim phase": "refused 403: NotOwnRun: ..."}
    hostile = {"hostile-001": run("hostile-001", "Succeeded", result={"outcomes": outcomes})}
    world = chaos.World(runs={}, attempts=[], checkpoints=[], effects=[], hostile=hostile)
    assert chaos.forged_writes(world) == (2, [])
    outcomes["victim lease"] = "accepted"
    assert chaos.forged_writes(world) == (3, ["hostile-001: victim lease accepted"])


def test_a_reference_whose_blob_is_not_in_the_store_is_a_referenced_blob_deleted(chaos: ModuleType) -> None:
    key = f"team/uid/sha256/{'a' * 64}"
    ref = {"key": key, "sha256": "a" * 64, "size": 3}
    checkpoint = {"metadata": {"name": "r-a1-s1"}, "spec": {"runName": "r", "stateRef": ref}}
    done = run("r", "Succeeded", resultRef=ref)
    assert chaos.referenced_blobs_deleted(chaos.World({"r": done}, [], [checkpoint], [])) == []  # not listed
    kept = chaos.World({"r": done}, [], [checkpoint], [], stored=frozenset({key}))
    assert chaos.referenced_blobs_deleted(kept) == []
    collected = chaos.World({"r": done}, [], [checkpoint], [], stored=frozenset())
    assert chaos.referenced_blobs_deleted(collected) == [
        f"Run r: {key} is gone",
        f"Checkpoint r-a1-s1: {key} is gone",
    ]


def failed_attempt(run_name: str, number: int, failure: dict[str, Any]) -> dict[str, Any]:
    found = attempt(run_name, number, number, "Failed")
    found["status"]["failure"] = failure
    return found


def test_a_store_fault_taken_as_permanent_is_a_violation_but_a_tampered_blob_is_not(
    chaos: ModuleType,
) -> None:
    key = f"chaos/uid/sha256/{'b' * 64}"
    tampered = chaos.Tampering("s", "hostile-001", "replace", "s-a1-s2", {"key": key}, "s-a1-s1", True)
    unverifiable = {"class": "deterministic", "reason": "StateUnverifiable"}
    caught = {**unverifiable, "message": f"state blob {key} cannot be verified"}
    transient = {"class": "infrastructure", "reason": "StoreUnavailable", "message": "state store down"}
    world = chaos.World({}, [failed_attempt("s", 2, caught), failed_attempt("t", 1, transient)], [], [])
    assert chaos.store_faults_permanent(world, {}, {"s": tampered}, []) == []
    # the same failure on a Run nobody tampered with, or a store fault classified as permanent
    assert len(chaos.store_faults_permanent(world, {}, {}, [])) == 1
    refused = {"class": "deterministic", "reason": "Error", "message": "state store refused put of k: 503"}
    archived = {"t2": {"document": {"attempts": [failed_attempt("t2", 1, refused)]}}}
    [found] = chaos.store_faults_permanent(chaos.World({}, [], [], []), archived, {}, [])
    assert "t2-a1" in found
    assert chaos.store_faults_permanent(chaos.World({}, [], [], []), {}, {}, ["s: StateUnverifiable"]) == [
        "s: StateUnverifiable"
    ]


def test_a_changed_blob_whose_run_never_stopped_as_unverifiable_is_not_caught(chaos: ModuleType) -> None:
    key = f"chaos/uid/sha256/{'c' * 64}"
    tampered = chaos.Tampering("s", "hostile-001", "truncate", "s-a1-s2", {"key": key}, "s-a1-s1", True)
    unverifiable = {"class": "deterministic", "reason": "StateUnverifiable"}
    caught = {**unverifiable, "message": f"state blob {key}: 9 bytes"}
    stopped = chaos.World({}, [failed_attempt("s", 2, caught)], [], [])
    assert chaos.replaced_blobs_not_caught(stopped, {}, {"s": tampered}) == []
    went_on = chaos.World({}, [attempt("s", 2, 2)], [], [])
    assert len(chaos.replaced_blobs_not_caught(went_on, {}, {"s": tampered})) == 1
    tampered.confirmed = False  # the attack did not change the blob: nothing to catch
    assert chaos.replaced_blobs_not_caught(went_on, {}, {"s": tampered}) == []


def test_a_big_state_run_that_succeeded_without_its_whole_state_lost_state(chaos: ModuleType) -> None:
    size, steps = chaos.BIG_STATE["outputBytes"], chaos.BIG_STATE["steps"]
    outputs = [chaos.state_output(i, size) for i in range(steps)]
    whole = {"outputs": outputs, "fetched": None, "by": "s-a2"}
    result = {"complete": True, "stateDigest": chaos.state_digest(whole)}
    world = chaos.World({"s": run("s", "Succeeded", attempts=3, result=result)}, [], [], [])
    assert chaos.state_lost(world, {}, {"s": "state"}) == []
    shorter = {**whole, "outputs": outputs[:2]}
    result["stateDigest"] = chaos.state_digest(shorter)
    assert len(chaos.state_lost(world, {}, {"s": "state"})) == 1
    shown = run("s2", "Succeeded", attempts=1, result={"complete": False})
    archived = {"s2": {"document": {"object": shown}}}
    assert chaos.state_lost(chaos.World({}, [], [], []), archived, {"s2": "state"}) == [
        "s2: Succeeded with {'complete': False} (not its whole state)"
    ]


def test_a_deleted_run_needs_a_verified_archive_of_a_finished_run_with_a_ttl(chaos: ModuleType) -> None:
    good = {"document": {"object": run("t1", "Succeeded")}, "entries": 1}
    assert chaos.deleted_without_archive({"t1": good}, {"t1": 0}) == []
    assert chaos.deleted_without_archive({"t1": {"error": "no archive"}}, {"t1": 0}) == ["t1: no archive"]
    waiting = {"document": {"object": run("t1", "NeedsReconciliation")}}
    assert chaos.deleted_without_archive({"t1": waiting}, {"t1": 3}) == [
        "t1: archived and deleted in phase NeedsReconciliation"
    ]
    assert chaos.deleted_without_archive({"t1": good}, {}) == [
        "t1: deleted, though it had no ttlSecondsAfterFinished"
    ]


def test_a_fork_that_created_a_ticket_of_its_own_sent_again_what_its_source_confirmed(
    chaos: ModuleType,
) -> None:
    source_key = f"{chaos.NS}.t001.create-ticket"
    tickets = [{"idempotencyKey": source_key, "id": "T-1"}]
    audit = [{"event": "created", "idempotencyKey": source_key}]
    fork = run("f001", "Succeeded", result={"ticket": "T-1"})
    world = chaos.World({"f001": fork}, [], [], [])
    assert chaos.forks_sent_again(world, {}, audit, tickets, {"f001": "t001"}) == []
    audit.append({"event": "created", "idempotencyKey": f"{chaos.NS}.f001.create-ticket"})
    fork["status"]["result"] = {"ticket": "T-2"}
    assert len(chaos.forks_sent_again(world, {}, audit, tickets, {"f001": "t001"})) == 2


def test_an_inherited_records_service_key_is_its_sources(chaos: ModuleType) -> None:
    scoped = {"spec": {"idempotencyKey": f"{chaos.NS}.t001.create-ticket", "runName": "t001"}}
    assert chaos.service_key(scoped) == f"{chaos.NS}.t001.create-ticket"
    own = {"spec": {"idempotencyKey": "create-ticket", "runName": "t002"}}
    assert chaos.service_key(own) == f"{chaos.NS}.t002.create-ticket"
    inherited = {**own, "status": {"inheritedFrom": {"run": "t002"}}}
    inherited["spec"] = {"idempotencyKey": "create-ticket", "runName": "f001"}
    assert chaos.service_key(inherited) == f"{chaos.NS}.t002.create-ticket"
