"""The StateRestore rule (core.runs.restoring): a Run waiting over a blob that cannot be verified has it
restored (the action RestoreBlobs: the I/O is the operator's), and what became of it (World.restorations,
observed when that was carried out) is recorded through the table like any write of the Run. The
decisions on blobs and versions: test_core_blobrestore.py; on a real store:
tests/integration/test_hostile_store.py."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest

from agentrun.api import RunPhase
from agentrun.core.blobrestore import STATE_RESTORED, Outcome, Restoration, Target
from agentrun.core.plan import PatchRunStatus, RecordEvent, RestoreBlobs
from agentrun.core.runs import TABLE, World, decide
from unit.factories import NOW, events, make_attempt, of_type, run_patch
from unit.run_worlds import stopped

SHA = "a" * 64
KEY = f"team/3f1c2a9e-8d5b-4c47-9f0e-2b6d7a1c5e34/sha256/{SHA}"
OTHER = f"team/3f1c2a9e-8d5b-4c47-9f0e-2b6d7a1c5e34/sha256/{'b' * 64}"
TARGET = Target(KEY, SHA, 48, ("ckpt-2",), ("Checkpoint triage-a1-s2",))
RESTORED = Restoration(TARGET, Outcome.RESTORED, "v1", listed=2, read=1)
LOST = Restoration(TARGET, Outcome.NO_VERSION, listed=2, read=2)


def unverifiable(*keys: str) -> dict[str, Any]:
    names = ", ".join(f"state blob {k} cannot be verified: received 48 bytes with sha256 x" for k in keys)
    return {"class": "deterministic", "reason": "StateUnverifiable", "message": f"{names}; restore it"}


def waiting_over(
    *keys: str,
    phase: str = "NeedsReconciliation",
    has_store: bool = True,
    conditions: tuple[dict[str, Any], ...] = (),
    restorations: tuple[Restoration, ...] | None = None,
    failure: dict[str, Any] | None = None,
) -> World:
    """A Run stopped in `phase` after its Attempt 1 failed reading `keys`, nothing else to keep in order."""
    status: dict[str, Any] = {"failure": failure or unverifiable(*keys)}
    if conditions:
        status["conditions"] = list(conditions)
    world = stopped(phase, **status)
    return replace(world, has_store=has_store, restorations=restorations)


def answered(status: str = "True") -> dict[str, Any]:
    return {
        "type": STATE_RESTORED,
        "status": status,
        "reason": "BlobsRestored",
        "message": "said",
        "lastTransitionTime": "2026-03-01T11:00:00Z",
    }


@dataclass(frozen=True)
class Case:
    world: World
    restores: tuple[str, ...] | None  # RestoreBlobs asked, of these keys; None: not asked
    condition: tuple[str, str] | None = None  # (status, reason) of the StateRestored condition written
    event: tuple[str, str] | None = None


CASES: dict[str, Case] = {
    "waiting-not-restored-yet": Case(waiting_over(KEY), restores=(KEY,)),
    "two-named-by-key": Case(waiting_over(OTHER, KEY), restores=(KEY, OTHER)),
    "restored": Case(
        waiting_over(KEY, restorations=(RESTORED,)),
        restores=None,
        condition=("True", "BlobsRestored"),
        event=("Normal", STATE_RESTORED),
    ),
    "no-version-matches": Case(
        waiting_over(KEY, restorations=(LOST,)),
        restores=None,
        condition=("False", "NoVerifiedVersion"),
        event=("Warning", "StateNotRestored"),
    ),
    # the failure names no content address the operator could look at: nothing said, nothing asked again
    "nothing-to-look-at": Case(waiting_over(KEY, restorations=()), restores=None),
    "answered-already": Case(waiting_over(KEY, conditions=(answered(),)), restores=None),
    "no-store": Case(waiting_over(KEY, has_store=False), restores=None),
    "another-failure": Case(
        waiting_over(failure={**unverifiable(KEY), "reason": "UnknownSideEffect"}), restores=None
    ),
    # the rule applies in NeedsReconciliation only (declared): a Failed Run is not restored for
    "failed-not-waiting": Case(waiting_over(KEY, phase="Failed"), restores=None),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_blob_a_waiting_run_cannot_verify_is_restored_and_what_became_of_it_recorded(case: Case) -> None:
    plan = decide(case.world)

    asked = of_type(plan, RestoreBlobs)
    assert asked == ([] if case.restores is None else [RestoreBlobs(case.restores)])
    if case.restores is not None:
        assert list(plan.actions) == asked, "nothing of the Run is written with it"
        assert not plan.needs_fresh_run
    said = [p.patch["conditions"][-1] for p in of_type(plan, PatchRunStatus) if "conditions" in p.patch]
    if case.condition is None:
        assert not [c for c in said if c["type"] == STATE_RESTORED]
        assert not [e for e in events(plan) if e[1] in (STATE_RESTORED, "StateNotRestored")]
        return
    [condition] = said
    assert (condition["type"], condition["status"], condition["reason"]) == (STATE_RESTORED, *case.condition)
    assert KEY in condition["message"]
    assert condition["lastTransitionTime"] == NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert events(plan) == [case.event]
    [told] = of_type(plan, RecordEvent)
    assert told.message == condition["message"]
    assert "phase" not in run_patch(plan), "never a retry nor any move: a person decides"


def test_the_conditions_the_run_had_are_kept_with_the_one_added() -> None:
    before = {**answered(), "type": "Waiting", "reason": "StateUnverifiable"}

    plan = decide(waiting_over(KEY, conditions=(before,), restorations=(RESTORED,)))

    conditions = run_patch(plan)["conditions"]
    assert [c["type"] for c in conditions] == ["Waiting", STATE_RESTORED]


def test_what_a_stopped_run_keeps_in_order_comes_first() -> None:
    """A leftover Attempt still running is aborted first (Stopped); the restore waits for the Run at rest."""
    world = waiting_over(KEY)
    leftover = replace(world, attempts={**world.attempts, 2: make_attempt(2)})

    plan = decide(leftover)

    assert of_type(plan, RestoreBlobs) == []
    assert plan.actions, "Stopped's writes"


def test_the_rule_is_declared_in_needs_reconciliation_only_and_moves_nothing() -> None:
    rule = next(r for r in TABLE.rules if r.name == "StateRestore")

    assert rule.applies_in == frozenset({RunPhase.NEEDS_RECONCILIATION})
    assert rule.moves == []
    assert TABLE.names.index("StateRestore") + 1 == TABLE.names.index("Stopped")
