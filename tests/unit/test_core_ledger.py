"""core.ledger: what a worker may do about an external action, given what the SideEffect ledger says."""

from __future__ import annotations

import re
from typing import Any

import pytest

from agentrun.api import SideEffect, SideEffectSpec
from agentrun.core.ledger import (
    Step,
    after_lookup,
    foreign_record,
    next_step,
    request_digest,
    side_effect_name,
)
from unit.factories import make_side_effect

DIGEST = request_digest("create_ticket", "project-7")
OTHER_DIGEST = request_digest("create_ticket", "project-8")

# ---- names and digests -------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["run-1/ticket", "a", "x" * 128, "Ticket:ÄÖ/1"])
def test_side_effect_name_is_a_valid_object_name(key: str) -> None:
    name = side_effect_name("triage", key)

    assert re.fullmatch(r"sfx-[0-9a-f]{32}", name)
    assert name == side_effect_name("triage", key), "one record per key, whoever computes it"


def test_side_effect_names_differ_by_key() -> None:
    keys = [f"run-1/ticket-{n}" for n in range(500)] + ["run-1/Ticket-1", "run-1/ticket-1 "]
    assert len({side_effect_name("triage", k) for k in keys}) == len(keys)


def test_side_effect_names_differ_by_run() -> None:
    # The ledger is the Run's: the same key in two Runs names two records, and no split of one text into
    # run and key names the record of another.
    pairs = [("a", "create-ticket"), ("b", "create-ticket"), ("a-b", "c"), ("a", "b-c"), ("ab", "c")]
    assert len({side_effect_name(run, key) for run, key in pairs}) == len(pairs)


def record(run_name: str = "triage", uid: str | None = "uid-1", kind: str = "Run") -> dict[str, object]:
    owners = [] if uid is None else [{"kind": kind, "name": run_name, "uid": uid}]
    return {
        "kind": "SideEffect",
        "metadata": {"name": "sfx-1", "ownerReferences": owners},
        "spec": {"runName": run_name},
    }


FOREIGN = {
    "its own": (record(), None),
    "another Run's": (record("other"), "belongs to Run 'other'"),
    "its name, no owner": (record(uid=None), "not owned by it"),
    "its name, a Run of that name deleted since": (record(uid="uid-0"), "not owned by it"),
    "its name, the uid under another kind": (record(kind="Attempt"), "not owned by it"),
}


@pytest.mark.parametrize(("found", "says"), FOREIGN.values(), ids=FOREIGN.keys())
def test_foreign_record(found: dict[str, object], says: str | None) -> None:
    reason = foreign_record(found, "triage", "uid-1")
    assert reason is None if says is None else says in str(reason)


DIGESTS = {
    "tool": (("create_ticket", "p"), ("close_ticket", "p")),
    "target": (("create_ticket", "p"), ("create_ticket", "q")),
    "no-target": (("create_ticket", None), ("create_ticket", "")),
    "request": (("create_ticket", "p", {"title": "a"}), ("create_ticket", "p", {"title": "b"})),
    "no-request": (("create_ticket", "p"), ("create_ticket", "p", {})),
}


@pytest.mark.parametrize(("one", "other"), DIGESTS.values(), ids=DIGESTS.keys())
def test_request_digest_tells_requests_apart(one: tuple[Any, ...], other: tuple[Any, ...]) -> None:
    assert request_digest(*one) != request_digest(*other)


def test_request_digest_is_canonical() -> None:
    first = request_digest("create_ticket", "p", {"title": "a", "labels": ["x", "y"], "n": 1})
    second = request_digest("create_ticket", "p", {"n": 1, "labels": ["x", "y"], "title": "a"})

    assert first == second
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", first)


def test_request_digest_fits_the_api() -> None:
    spec = SideEffectSpec.model_validate(
        {"runName": "triage", "tool": "t", "idempotencyKey": "k", "requestDigest": DIGEST}
    )
    assert spec.request_digest == DIGEST


# ---- the next step -----------------------------------------------------------------------------------------

STEPS: dict[str, tuple[SideEffect | None, Step]] = {
    "no-record": (None, Step.EXECUTE),
    "record-without-status": (make_side_effect("k", None, digest=DIGEST), Step.LOOK_UP),
    "pending": (make_side_effect("k", "Pending", digest=DIGEST), Step.LOOK_UP),
    "unknown": (make_side_effect("k", "Unknown", digest=DIGEST), Step.LOOK_UP),
    "confirmed": (make_side_effect("k", "Confirmed", digest=DIGEST, reference="T-1"), Step.REUSE),
    "confirmed-reversible": (make_side_effect("k", "Confirmed", digest=DIGEST, reversible=True), Step.REUSE),
    "compensated": (make_side_effect("k", "Compensated", digest=DIGEST, reversible=True), Step.REUSE),
    "failed": (make_side_effect("k", "Failed", digest=DIGEST), Step.REFUSE),
    "confirmed-other-request": (make_side_effect("k", "Confirmed", digest=OTHER_DIGEST), Step.REFUSE),
    "pending-other-request": (make_side_effect("k", "Pending", digest=OTHER_DIGEST), Step.REFUSE),
    "unknown-other-request": (make_side_effect("k", "Unknown", digest=OTHER_DIGEST), Step.REFUSE),
    "no-status-other-request": (make_side_effect("k", None, digest=OTHER_DIGEST), Step.REFUSE),
    "confirmed-without-digest": (make_side_effect("k", "Confirmed"), Step.REUSE),
    "pending-without-digest": (make_side_effect("k", "Pending"), Step.LOOK_UP),
    "failed-without-digest": (make_side_effect("k", "Failed"), Step.REFUSE),
}


@pytest.mark.parametrize(("record", "step"), STEPS.values(), ids=STEPS.keys())
def test_next_step(record: SideEffect | None, step: Step) -> None:
    assert next_step(record, DIGEST) == step


@pytest.mark.parametrize("state", ["Confirmed", "Compensated"])
def test_a_confirmed_action_is_never_executed_again(state: str) -> None:
    """Whatever the digest asked for, a record that says it happened never leads to EXECUTE."""
    record = make_side_effect("k", state, digest=DIGEST, reversible=True)
    for digest in (DIGEST, OTHER_DIGEST, request_digest("x", None)):
        assert next_step(record, digest) != Step.EXECUTE


# ---- after a lookup ----------------------------------------------------------------------------------------

LOOKUPS: dict[str, tuple[bool | None, bool, Step]] = {
    "found": (True, True, Step.REUSE),
    "absent": (False, True, Step.EXECUTE),
    "lookup-raised": (None, True, Step.RECONCILE),
    "no-lookup": (None, False, Step.RECONCILE),
    "no-lookup-even-if-found": (True, False, Step.RECONCILE),
    "no-lookup-even-if-absent": (False, False, Step.RECONCILE),
}


@pytest.mark.parametrize(("found", "can_look_up", "step"), LOOKUPS.values(), ids=LOOKUPS.keys())
def test_after_lookup(found: bool | None, can_look_up: bool, step: Step) -> None:
    assert after_lookup(found, can_look_up) == step


def test_steps_are_plain_strings() -> None:
    assert [str(s) for s in Step] == ["execute", "reuse", "look_up", "reconcile", "refuse"]
