"""Issue 15's decisions, table-driven: keys stay spent (core.controls.key_use), cancel recorded
(judge_cancel), the worker's request bookkeeping and the hold window (core.interrupts, core.runs)."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.api import ControlOp, InterruptReason, json_digest
from agentrun.api.run import MAX_SPENT_KEYS
from agentrun.core import controls, interrupts
from agentrun.core.controls import KeyUse
from agentrun.core.plan import CreateAttempt, DeletePod, PatchAttemptStatus, PatchRunStatus
from agentrun.core.runs import decide
from unit.factories import (
    EARLIER,
    NOW,
    ended_pod,
    held_by,
    make_attempt,
    make_run,
    make_world,
    name_of,
    run_status,
    running_pod,
    ts,
)

D1, D2 = json_digest(1), json_digest(2)


def spent(key: str, op: str = "Resume", digest: str = D1) -> dict[str, Any]:
    return {"key": controls.remembered_key(key), "op": op, "digest": controls.short_digest(digest)}


def record(key: str, digest: str, reason: str = "Accepted", op: str = "Resume") -> dict[str, Any]:
    outcome = "Accepted" if reason == "Accepted" else "Rejected"
    return {
        "idempotencyKey": key,
        "op": op,
        "digest": digest,
        "outcome": outcome,
        "reason": reason,
        "time": ts(EARLIER),
    }


LONG = "k" * 100
KEY_USES: dict[str, tuple[dict[str, Any], str, str, str, KeyUse]] = {
    "a-new-key": ({}, "k1", "Resume", D1, KeyUse.NEW),
    "the-same-request-again": ({"spentKeys": [spent("k1")]}, "k1", "Resume", D1, KeyUse.REPEAT),
    "other-parameters": ({"spentKeys": [spent("k1")]}, "k1", "Resume", D2, KeyUse.REUSED),
    "another-op": ({"spentKeys": [spent("k1")]}, "k1", "Retry", D1, KeyUse.REUSED),
    "spent-long-ago-its-record-dropped": (
        {"spentKeys": [spent("k1")], "controls": []},
        "k1",
        "Resume",
        D2,
        KeyUse.REUSED,
    ),
    "its-reuse-already-recorded": (
        {"spentKeys": [spent("k1")], "controls": [record("k1", D2, "IdempotencyKeyReused")]},
        "k1",
        "Resume",
        D2,
        KeyUse.REPEAT,
    ),
    "the-original-after-a-refused-reuse": (
        {"spentKeys": [spent("k1")], "controls": [record("k1", D2, "IdempotencyKeyReused")]},
        "k1",
        "Resume",
        D1,
        KeyUse.REPEAT,
    ),
    "recorded-before-spent-keys-existed": (
        {"controls": [record("k1", D1)]},
        "k1",
        "Resume",
        D2,
        KeyUse.REUSED,
    ),
    "a-long-key-remembered-by-digest": ({"spentKeys": [spent(LONG)]}, LONG, "Resume", D2, KeyUse.REUSED),
    "memory-full": (
        {"spentKeys": [spent(f"k{n}") for n in range(MAX_SPENT_KEYS)]},
        "new",
        "Resume",
        D1,
        KeyUse.FULL,
    ),
    "memory-full-but-known": (
        {"spentKeys": [spent(f"k{n}") for n in range(MAX_SPENT_KEYS)]},
        "k7",
        "Resume",
        D1,
        KeyUse.REPEAT,
    ),
    "memory-full-refusal-recorded": (
        {
            "spentKeys": [spent(f"k{n}") for n in range(MAX_SPENT_KEYS)],
            "controls": [record("new", D1, "KeyMemoryFull")],
        },
        "new",
        "Resume",
        D1,
        KeyUse.REPEAT,
    ),
}


@pytest.mark.parametrize(("status", "key", "op", "digest", "use"), KEY_USES.values(), ids=KEY_USES.keys())
def test_key_use(status: dict[str, Any], key: str, op: str, digest: str, use: KeyUse) -> None:
    run = make_run(run_status("Succeeded", **status))
    assert controls.key_use(run, key, ControlOp(op), digest) == use


def test_a_spent_key_fits_its_bound_and_a_reuse_replaces_its_record() -> None:
    run = make_run(run_status("Failed", controls=[record("k1", D1, "SchemaMismatch"), record("k2", D2)]))
    assert len(controls.remembered_key(LONG)) <= 40 and controls.remembered_key("short") == "short"
    refusal = controls.key_refusal(KeyUse.REUSED, "k1")
    entries = controls.with_record(run, controls.control_record(ControlOp.RESUME, "k1", D2, refusal, NOW))
    assert [(e["idempotencyKey"], e["reason"]) for e in entries] == [
        ("k2", "Accepted"),
        ("k1", "IdempotencyKeyReused"),
    ]


def cancel_run(phase: str, epoch: int = 1, observed: int = 1, reason: str | None = "wrong customer") -> Any:
    request: dict[str, Any] = {"idempotencyKey": "c1", **({"reason": reason} if reason else {})}
    return make_run(
        run_status(phase, current=1, lease_epoch=1, observedCancelEpoch=observed),
        spec={"cancelEpoch": epoch, "cancelRequest": request},
    )


CANCELS: dict[str, tuple[Any, tuple[bool, str] | None]] = {
    "on-its-way": (cancel_run("Running", observed=0), None),
    "requested": (cancel_run("CancelRequested"), (True, "Accepted")),
    "cancelled": (cancel_run("Cancelled"), (True, "Accepted")),
    "too-late": (cancel_run("Succeeded", observed=0), (False, "CancelTooLate")),
    "no-epoch": (cancel_run("Running", epoch=0, observed=0), (False, "NoCancelEpoch")),
    "failed-first": (cancel_run("Failed"), (False, "NotCancelled")),
}


@pytest.mark.parametrize(("run", "expected"), CANCELS.values(), ids=CANCELS.keys())
def test_judge_cancel(run: Any, expected: tuple[bool, str] | None) -> None:
    verdict = controls.judge_cancel(run)
    assert (verdict.accepted, verdict.reason) == expected if verdict else expected is None


def test_a_cancel_digest_covers_the_target_epoch_and_the_reason() -> None:
    digests = {
        controls.cancel_digest(cancel_run("Running", epoch=e, reason=r)) for e in (1, 2) for r in ("a", None)
    }
    assert len(digests) == 4


# ---- the worker's bookkeeping ------------------------------------------------------------------------

KINDS = {
    "a-question": ("ask-r3", InterruptReason.INPUT_REQUIRED, None, interrupts.RequestKind.QUESTION),
    "an-auth-question": ("ask-r3", InterruptReason.AUTH_REQUIRED, None, interrupts.RequestKind.QUESTION),
    "an-approval": ("approve-sfx-1", InterruptReason.AUTH_REQUIRED, None, interrupts.RequestKind.APPROVAL),
    "a-pause": ("maintenance", InterruptReason.PAUSED, None, interrupts.RequestKind.PAUSE),
    "a-pause-named-like-an-approval": (
        "approve-x",
        InterruptReason.PAUSED,
        None,
        interrupts.RequestKind.PAUSE,
    ),
    "legacy-pause": ("maintenance", None, "maintenance", interrupts.RequestKind.PAUSE),
    "legacy-approval": ("approve-sfx-1", None, "maintenance", interrupts.RequestKind.APPROVAL),
    "legacy-question": ("ask-r3", None, "maintenance", interrupts.RequestKind.QUESTION),
}


@pytest.mark.parametrize(("request_id", "reason", "pause", "kind"), KINDS.values(), ids=KINDS.keys())
def test_request_kind(request_id: str, reason: Any, pause: str | None, kind: interrupts.RequestKind) -> None:
    assert interrupts.request_kind(request_id, reason, pause) == kind


PAUSE = interrupts.Answered("p1", interrupts.RequestKind.PAUSE)
QUESTION = interrupts.Answered("ask-r2", interrupts.RequestKind.QUESTION)
APPROVAL = interrupts.Answered("approve-sfx-1", interrupts.RequestKind.APPROVAL)


@pytest.mark.parametrize(
    ("answer", "question", "approval"),
    [(None, False, False), (PAUSE, False, False), (QUESTION, True, False), (APPROVAL, False, True)],
    ids=["nothing", "a-pause-answers-neither", "a-question", "an-approval"],
)
def test_an_answer_answers_only_its_own_kind(answer: Any, question: bool, approval: bool) -> None:
    assert interrupts.answers_question(answer) == question
    assert interrupts.answers_approval(answer, "approve-sfx-1") == approval
    assert not interrupts.answers_approval(APPROVAL, "approve-sfx-2")


@pytest.mark.parametrize(
    ("pause", "answered", "answering", "due"),
    [
        (None, frozenset(), None, False),
        ("p1", frozenset(), None, True),
        ("p1", frozenset({"p1"}), None, False),
        ("p1", frozenset(), PAUSE, False),
        ("p1", frozenset(), QUESTION, True),
    ],
    ids=["no-pause", "due", "answered-before", "this-attempt-answers-it", "answering-something-else"],
)
def test_pause_due(pause: str | None, answered: frozenset[str], answering: Any, due: bool) -> None:
    assert interrupts.pause_due(pause, answered, answering) == due


@pytest.mark.parametrize(
    ("attempt", "reason"),
    [
        (make_attempt(1), None),
        (make_attempt(2, reason="retry:transient", resume_from="ckpt-2"), "retry:transient"),
        (make_attempt(2, reason="lease_expired", resume_from="ckpt-2"), "lease_expired"),
        (make_attempt(2, reason="manual_retry", resume_from="ckpt-2"), "manual_retry"),
        (make_attempt(2, reason="resume:req-1", resume_from="ckpt-2"), "resume:req-1"),
    ],
    ids=["from-the-beginning", "crash-retry", "lease-takeover", "manual-retry", "answer"],
)
def test_resume_reason(attempt: Any, reason: str | None) -> None:
    assert interrupts.resume_reason(attempt) == reason


def pending(held: str | None = None, request_id: str = "req-1") -> dict[str, Any]:
    value: dict[str, Any] = {"requestId": request_id, "reason": "input_required", "checkpointId": "ckpt-2"}
    return {**value, "heldBy": held, "holdSeconds": 30} if held else value


INPUT = {
    "requestId": "req-1",
    "checkpointId": "ckpt-2",
    "digest": json_digest("a"),
    "idempotencyKey": "k-1",
    "time": ts(EARLIER),
}
RESUME = {"resume": {"requestId": "req-1", "checkpointId": "ckpt-2", "value": "a", "idempotencyKey": "k-1"}}
HOLDS = {
    "held": (
        run_status("InputRequired", current=1, lease_epoch=1, pendingRequest=pending(name_of(1))),
        interrupts.HoldState.WAITING,
    ),
    "held-before-the-flip": (
        run_status("Running", current=1, lease_epoch=1, pendingRequest=pending(name_of(1))),
        interrupts.HoldState.WAITING,
    ),
    "released": (
        run_status("InputRequired", current=1, lease_epoch=1, pendingRequest=pending()),
        interrupts.HoldState.ENDED,
    ),
    "answered": (
        run_status("Running", current=1, lease_epoch=1, inputs=[INPUT]),
        interrupts.HoldState.ANSWERED,
    ),
    "answered-to-a-new-attempt": (
        run_status("Running", current=2, lease_epoch=2, inputs=[INPUT]),
        interrupts.HoldState.ENDED,
    ),
    "expired": (
        run_status("Failed", current=1, lease_epoch=1, pendingRequest=pending()),
        interrupts.HoldState.ENDED,
    ),
}


@pytest.mark.parametrize(("status", "state"), HOLDS.values(), ids=HOLDS.keys())
def test_hold_state(status: dict[str, Any], state: interrupts.HoldState) -> None:
    assert interrupts.hold_state(make_run(status, spec=RESUME), name_of(1), "req-1") == state


def test_a_held_answer_is_read_only_while_spec_resume_is_the_one_recorded() -> None:
    status = run_status("Running", current=1, lease_epoch=1, inputs=[INPUT])
    assert interrupts.held_answer(make_run(status, spec=RESUME), "req-1") == (True, "a")
    other = {"resume": {**RESUME["resume"], "value": "b", "idempotencyKey": "k-2"}}
    assert interrupts.held_answer(make_run(status, spec=other), "req-1") == (False, None)


def test_a_held_answer_outlives_the_spec_resume_that_brought_it() -> None:
    """The operator keeps the accepted value (status.acceptedInput): a second answer replacing spec.resume
    before the holder read it takes nothing away; a kept value that is not the recorded one is never used."""
    other = {"resume": {**RESUME["resume"], "value": "b", "idempotencyKey": "k-2"}}
    kept = {"requestId": "req-1", "idempotencyKey": INPUT["idempotencyKey"], "value": "a"}
    status = run_status("Running", current=1, lease_epoch=1, inputs=[INPUT], acceptedInput=kept)
    assert interrupts.held_answer(make_run(status, spec=other), "req-1") == (True, "a")
    other_value = {**kept, "value": "c"}
    forged = run_status("Running", current=1, lease_epoch=1, inputs=[INPUT], acceptedInput=other_value)
    assert interrupts.held_answer(make_run(forged, spec=other), "req-1") == (False, None)


# ---- the operator and the hold -----------------------------------------------------------------------


def holding_world(phase: str, spec: dict[str, Any] | None = None, **kw: Any) -> Any:
    status = run_status(
        phase, current=1, lease_epoch=1, latestCheckpoint="ckpt-2", pendingRequest=pending(name_of(1))
    )
    defaults: dict[str, Any] = {
        "attempts": [make_attempt(1)],
        "pods": [running_pod(1)],
        "lease": held_by(1),
        "expires_in": 30.0,
    }
    return make_world(make_run(status, spec=spec), **{**defaults, **kw})


def run_patches(plan: Any) -> list[dict[str, Any]]:
    return [a.patch for a in plan.actions if isinstance(a, PatchRunStatus)]


def test_a_held_request_makes_the_run_wait_while_its_attempt_lives_on() -> None:
    plan = decide(holding_world("Running"))
    [patch] = run_patches(plan)
    assert patch["phase"] == "InputRequired"
    assert not [a for a in plan.actions if isinstance(a, (CreateAttempt, DeletePod))]


def test_an_answer_accepted_within_the_hold_continues_the_same_attempt() -> None:
    plan = decide(holding_world("InputRequired", spec=RESUME))
    [patch] = run_patches(plan)
    assert (patch["phase"], patch["pendingRequest"], patch["controls"][-1]["reason"]) == (
        "Running",
        None,
        "AcceptedInHold",
    )
    assert patch["inputs"][-1]["requestId"] == "req-1" and patch["spentKeys"][-1]["key"] == "k-1"
    assert "currentAttempt" not in patch or patch["currentAttempt"] == 1
    assert not [a for a in plan.actions if isinstance(a, CreateAttempt)], "no new Attempt"


def test_an_answer_after_the_release_waits_for_the_attempt_to_end_then_starts_a_new_one() -> None:
    status = run_status(
        "InputRequired", current=1, lease_epoch=1, latestCheckpoint="ckpt-2", pendingRequest=pending()
    )
    leaving = make_world(
        make_run(status, spec=RESUME),
        attempts=[make_attempt(1)],
        pods=[running_pod(1)],
        lease=held_by(1),
        expires_in=30.0,
    )
    assert run_patches(decide(leaving)) == [], "not beside a live Attempt"
    ended = make_world(
        make_run(status, spec=RESUME),
        attempts=[make_attempt(1, phase="Interrupted")],
        pods=[ended_pod(1, 0)],
        lease=held_by(1),
        expires_in=30.0,
    )
    assert [a.body["spec"]["reason"] for a in decide(ended).actions if isinstance(a, CreateAttempt)] == [
        "resume:req-1"
    ]


@pytest.mark.parametrize(
    ("pods", "expires_in", "attempt_phase"),
    [
        ([ended_pod(1, 0)], 30.0, "Interrupted"),
        ([ended_pod(1, 1)], 30.0, "Failed"),
        ([running_pod(1)], -1.0, "LeaseLost"),
    ],
    ids=["exited", "crashed", "lease-expired"],
)
def test_a_hold_ends_with_its_attempt_and_the_run_keeps_waiting(
    pods: Any, expires_in: float, attempt_phase: str
) -> None:
    plan = decide(holding_world("InputRequired", pods=pods, expires_in=expires_in))
    assert run_patches(plan) == [{"pendingRequest": {"heldBy": None}}]
    assert [
        a.patch["phase"] for a in plan.actions if isinstance(a, PatchAttemptStatus) and a.patch.get("phase")
    ] == [attempt_phase]
