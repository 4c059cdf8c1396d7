"""core.compensation: when a Run compensates, which effects, and what a compensation Attempt's end means."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from agentrun.api import ControlOp, FailureClass, RunPhase, SideEffect
from agentrun.core import compensation
from agentrun.core.controls import Verdict, control_record
from agentrun.core.ledger import Answer
from agentrun.core.plan import (
    CreateAttempt,
    DeletePod,
    PatchRunStatus,
    PatchSideEffectStatus,
    Plan,
    RecordEvent,
    WriteLease,
)
from agentrun.core.pods import PodView
from agentrun.core.runs import TABLE, decide
from unit.factories import (
    EARLIER,
    NOW,
    committed_by,
    ended_pod,
    events,
    failure_of,
    held_by,
    make_attempt,
    make_run,
    make_side_effect,
    make_world,
    name_of,
    of_type,
    run_status,
    running_pod,
)

ON_CANCEL = {"onCancel": "Compensate"}
ON_FAILURE = {"onFailure": "Compensate"}


def effect(key: str, state: str | None = "Confirmed", seconds: int = 0, **kw: Any) -> SideEffect:
    """A reversible effect (compensation undo_<tool>) confirmed `seconds` after EARLIER."""
    kw.setdefault("reversible", True)
    return make_side_effect(key, state, confirmed=EARLIER + timedelta(seconds=seconds), **kw)


TICKET = effect("ticket")
UNDO = effect("ticket:compensate", tool="undo_create_ticket", step="compensate", reversible=False)


def keys(records: list[SideEffect]) -> list[str]:
    return [r.spec.idempotency_key for r in records]


# ---- which effects ------------------------------------------------------------------------------------

COMPENSATE = {
    "none": ([], None, []),
    "confirmed-reversible": ([TICKET], None, ["ticket"]),
    "newest-confirmation-first": (
        [effect("a", seconds=1), effect("b", seconds=3), effect("c", seconds=2)],
        None,
        ["b", "c", "a"],
    ),
    "irreversible-cannot-be-undone": ([effect("a", reversible=False)], None, []),
    "compensated-already": ([effect("a", "Compensated")], None, []),
    "open-or-failed-not-yet": (
        [effect("a", "Unknown"), effect("b", "Pending"), effect("c", "Failed")],
        None,
        [],
    ),
    "a-compensation-is-never-compensated": ([UNDO], None, []),
    "only-the-requested-keys": ([effect("a", seconds=1), effect("b", seconds=2)], ["a"], ["a"]),
}


@pytest.mark.parametrize(("records", "scope", "expected"), COMPENSATE.values(), ids=COMPENSATE.keys())
def test_which_effects_are_compensated(
    records: list[SideEffect], scope: list[str] | None, expected: list[str]
) -> None:
    assert keys(compensation.to_compensate(records, scope)) == expected


SETTLE = {
    "pending-and-unknown": ([effect("a", "Pending"), effect("b", "Unknown"), TICKET], None, ["a", "b"]),
    "no-status-is-pending": ([effect("a", None)], None, ["a"]),
    "compensation-records-settle-through-their-own-ledger-entry": (
        [effect("x:compensate", "Unknown", step="compensate")],
        None,
        [],
    ),
    "only-the-requested-keys": ([effect("a", "Unknown"), effect("b", "Unknown")], ["b"], ["b"]),
}


@pytest.mark.parametrize(("records", "scope", "expected"), SETTLE.values(), ids=SETTLE.keys())
def test_which_records_are_settled_first(
    records: list[SideEffect], scope: list[str] | None, expected: list[str]
) -> None:
    assert keys(compensation.to_settle(records, scope)) == expected


SETTLED = {
    Answer.FOUND: "Confirmed",
    Answer.ABSENT: "Failed",  # it did not happen
    Answer.CANNOT_TELL: None,
    Answer.CONFLICT: None,
}


@pytest.mark.parametrize(("answer", "state"), SETTLED.items(), ids=[a.value for a in SETTLED])
def test_what_a_settling_lookup_makes_of_an_open_record(answer: Answer, state: str | None) -> None:
    settled = compensation.settled_state(answer)
    assert (settled.value if settled else None) == state


UNSENT = {
    "recorded-by-this-sdk-never-sent": (dict(operation_id="op-1"), "Pending", True),
    "sent-and-in-flight": (
        dict(
            operation_id="op-1",
            sends=[{"sendId": "op-1-s1", "attempt": name_of(1), "time": "2026-03-01T12:00:00Z"}],
        ),
        "Pending",
        False,
    ),
    "unknown-is-looked-up": (dict(operation_id="op-1"), "Unknown", False),
    "an-older-sdk-recorded-no-sends": ({}, "Pending", False),
}


@pytest.mark.parametrize(("made", "state", "unsent"), UNSENT.values(), ids=UNSENT.keys())
def test_a_record_surely_never_sent_is_settled_without_a_lookup(
    made: dict[str, Any], state: str, unsent: bool
) -> None:
    assert compensation.settle_without_lookup(make_side_effect("a", state, **made)) == unsent


# ---- entering Compensating ------------------------------------------------------------------------------


def cancelling(policy: dict[str, Any] | None, records: tuple[SideEffect, ...] = (TICKET,)) -> Plan:
    """A Run whose cancel stopped its Attempt's Pod: the cancel ends now."""
    spec: dict[str, Any] = {"cancelEpoch": 1, **({"compensation": policy} if policy else {})}
    run = make_run(run_status("CancelRequested", current=1, lease_epoch=1, cancel_epoch=1), spec=spec)
    world = make_world(
        run, attempts=[make_attempt(1)], pods=[ended_pod(1, 143)], lease=held_by(1), side_effects=records
    )
    return decide(world)


def failing(
    policy: dict[str, Any] | None, records: tuple[SideEffect, ...] = (TICKET,), reason: str = ""
) -> Plan:
    """A Run whose only Attempt (maxAttempts 1) just failed for good."""
    spec: dict[str, Any] = {"retry": {"maxAttempts": 1}, **({"compensation": policy} if policy else {})}
    run = make_run(run_status("Running", current=1, lease_epoch=1), spec=spec)
    world = make_world(
        run,
        attempts=[make_attempt(1)],
        pods=[ended_pod(1, 1, message='{"class": "deterministic", "message": "boom"}')],
        lease=held_by(1),
        side_effects=records,
    )
    return decide(world)


def phase_patch(plan: Plan) -> dict[str, Any]:
    return next(p.patch for p in of_type(plan, PatchRunStatus) if "phase" in p.patch)


def past_deadline(policy: dict[str, Any] | None) -> Plan:
    """A running Run past its deadline (created 600 s before NOW, deadline 300 s)."""
    spec: dict[str, Any] = {"deadlineSeconds": 300, **({"compensation": policy} if policy else {})}
    run = make_run(run_status("Running", current=1, lease_epoch=1), spec=spec)
    world = make_world(
        run, attempts=[make_attempt(1)], pods=[running_pod(1)], lease=held_by(1), side_effects=[TICKET]
    )
    return decide(world)


ENDINGS = {
    "cancel-without-policy": (cancelling(None), "Cancelled", None),
    "cancel-on-cancel": (cancelling(ON_CANCEL), "Compensating", "Cancelled"),
    "cancel-on-failure-only": (cancelling(ON_FAILURE), "Cancelled", None),
    "cancel-nothing-to-undo": (cancelling(ON_CANCEL, (effect("a", reversible=False),)), "Cancelled", None),
    "cancel-an-open-record-is-settled": (
        cancelling(ON_CANCEL, (effect("a", "Unknown"),)),
        "Compensating",
        "Cancelled",
    ),
    "failure-without-policy": (failing(None), "Failed", None),
    "failure-on-failure": (failing(ON_FAILURE), "Compensating", "Failed"),
    "failure-on-cancel-only": (failing(ON_CANCEL), "Failed", None),
    "failure-no-effects": (failing(ON_FAILURE, ()), "Failed", None),
    "deadline-on-failure": (past_deadline(ON_FAILURE), "Compensating", "Failed"),
    "deadline-without-policy": (past_deadline(None), "Failed", None),
}


@pytest.mark.parametrize(("plan", "phase", "back"), ENDINGS.values(), ids=ENDINGS.keys())
def test_a_cancel_or_a_final_failure_compensates_first_when_the_policy_asks(
    plan: Plan, phase: str, back: str | None
) -> None:
    patch = phase_patch(plan)
    assert patch["phase"] == phase
    if back is None:
        assert "compensating" not in patch
    else:
        assert patch["compensating"] == {"returnPhase": back, "firstAttempt": 2}
        assert "report" not in patch, "the report is written when the Run ends"
        assert of_type(plan, CreateAttempt) == [], "the compensation Attempt starts on the next pass"


def test_a_run_whose_pods_may_not_run_does_not_compensate() -> None:
    assert compensation.redirect(
        make_world(
            make_run(run_status("Running", current=1), spec={"compensation": ON_FAILURE}),
            side_effects=[TICKET],
        ),
        RunPhase.FAILED,
        "ServiceAccountNotAllowed",
        {},
    ) == (RunPhase.FAILED, {})


# ---- compensation Attempts ------------------------------------------------------------------------------


@dataclass
class Compensating:
    attempts: list[Any] = field(default_factory=list)
    pods: list[PodView] = field(default_factory=list)
    current: int = 1
    back: str = "Cancelled"
    status: dict[str, Any] = field(default_factory=dict)
    policy: dict[str, Any] = field(default_factory=lambda: dict(ON_CANCEL))
    lease: Any = None
    expires_in: float | None = None
    spec: dict[str, Any] = field(default_factory=dict)
    side_effects: list[Any] = field(default_factory=lambda: [TICKET])

    def decide(self) -> Plan:
        status = run_status(
            "Compensating",
            current=self.current,
            lease_epoch=self.current,
            cancel_epoch=1,
            **{"compensating": {"returnPhase": self.back, "firstAttempt": 2}, **self.status},
        )
        run = make_run(
            status,
            spec={
                "cancelEpoch": 1,
                "compensation": self.policy,
                "retry": {"backoff": {"initialSeconds": 4, "factor": 1.0, "maxSeconds": 4}},
                **self.spec,
            },
        )
        world = make_world(
            run,
            attempts=self.attempts,
            pods=self.pods,
            lease=self.lease,
            expires_in=self.expires_in,
            side_effects=self.side_effects,
        )
        return decide(world)


FIRST = make_attempt(1, phase="Aborted", failure=failure_of(FailureClass.CANCELLED))


def comp(number: int, phase: str = "Running", **kw: Any) -> Any:
    return make_attempt(number, phase=phase, reason="compensate", cancel_epoch=1, **kw)


def test_the_first_compensation_attempt_is_granted_with_reason_compensate() -> None:
    plan = Compensating(attempts=[FIRST], pods=[ended_pod(1, 143)]).decide()
    [created] = of_type(plan, CreateAttempt)
    assert (created.body["spec"]["reason"], created.body["spec"]["number"]) == ("compensate", 2)
    assert "input" not in created.body["spec"], "all effects"
    patch = phase_patch(plan)
    assert (patch["phase"], patch["currentAttempt"]) == ("Compensating", 2)
    assert of_type(plan, WriteLease)[0].holder == name_of(2)


def test_a_compensation_of_some_effects_tells_its_attempt_which() -> None:
    plan = Compensating(
        attempts=[FIRST],
        status={"compensating": {"returnPhase": "Succeeded", "firstAttempt": 2, "effects": ["ticket"]}},
    ).decide()
    [created] = of_type(plan, CreateAttempt)
    assert created.body["spec"]["input"] == {"effects": ["ticket"]}


def test_an_earlier_attempt_still_running_is_stopped_before_compensating() -> None:
    plan = Compensating(attempts=[make_attempt(1)], pods=[running_pod(1)]).decide()
    assert of_type(plan, CreateAttempt) == []
    assert [d.name for d in of_type(plan, DeletePod)] == [name_of(1)]
    assert plan.requeue_after is not None


SDK_INCOMPLETE = (
    '{"class": "unknown_side_effect", "message": "cannot settle sfx-1", "reason": "CompensationIncomplete"}'
)
ENDS = {
    "done": (ended_pod(2, 0), "Cancelled", None),
    "transient-retried-after-backoff": (
        ended_pod(2, 75, message='{"class": "transient", "message": "lookup 503"}'),
        "Compensating",
        "CompensationRetry",
    ),
    "killed-retried": (ended_pod(2, 137), "Compensating", "CompensationRetry"),
    "open-record-needs-a-person": (
        ended_pod(2, 1, message=SDK_INCOMPLETE),
        "NeedsReconciliation",
        "CompensationIncomplete",
    ),
    "deterministic-is-not-retried": (
        ended_pod(2, 1, message='{"class": "deterministic", "message": "bug"}'),
        "NeedsReconciliation",
        "CompensationIncomplete",
    ),
}


@pytest.mark.parametrize(("pod", "phase", "event"), ENDS.values(), ids=ENDS.keys())
def test_what_the_end_of_a_compensation_attempt_means(pod: PodView, phase: str, event: str | None) -> None:
    plan = Compensating(attempts=[FIRST, comp(2)], pods=[pod], current=2, lease=held_by(2)).decide()
    patch = phase_patch(plan)
    assert patch["phase"] == phase
    if phase == "Cancelled":
        assert patch["compensating"] is None and "report" in patch
        assert ("Normal", "Compensated") in events(plan)
    elif phase == "Compensating":
        assert patch["nextAttemptTime"] > NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
        assert of_type(plan, CreateAttempt) == [], "after the backoff"
    else:
        assert patch["failure"]["reason"] == "CompensationIncomplete"
        assert "compensating" not in patch, "kept: it says where to return after a new request"
    assert event is None or any(reason == event for _, reason in events(plan))


@pytest.mark.parametrize("budget", [1, 3], ids=["budget-spent", "budget-left"])
def test_a_compensation_attempt_killed_after_its_work_ends_the_compensation(budget: int) -> None:
    """Killed once it had marked the last effect Compensated: nothing is left, so the Run is Cancelled
    again, with no other Attempt and no person asked (whatever the budget)."""
    plan = Compensating(
        attempts=[FIRST, comp(2)],
        pods=[ended_pod(2, 137)],
        current=2,
        lease=held_by(2),
        policy={**ON_CANCEL, "maxAttempts": budget},
        side_effects=[effect("ticket", "Compensated")],
    ).decide()
    patch = phase_patch(plan)
    assert (patch["phase"], patch["compensating"]) == ("Cancelled", None)
    assert of_type(plan, CreateAttempt) == []
    assert ("Normal", "Compensated") in events(plan)


def test_the_next_compensation_attempt_starts_once_the_backoff_is_over() -> None:
    failed = comp(2, phase="Failed", failure=failure_of(FailureClass.TRANSIENT))
    due = {"nextAttemptTime": (NOW - timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ")}
    plan = Compensating(attempts=[FIRST, failed], current=2, status=due).decide()
    [created] = of_type(plan, CreateAttempt)
    assert (created.body["spec"]["reason"], created.body["spec"]["number"]) == ("compensate", 3)
    later = {"nextAttemptTime": (NOW + timedelta(seconds=3)).strftime("%Y-%m-%dT%H:%M:%SZ")}
    waiting = Compensating(attempts=[FIRST, failed], current=2, status=later).decide()
    assert of_type(waiting, CreateAttempt) == [] and waiting.requeue_after == pytest.approx(3)


def test_compensation_attempts_have_a_budget_of_their_own() -> None:
    policy = {**ON_CANCEL, "maxAttempts": 2}
    failed = comp(2, phase="Failed", failure=failure_of(FailureClass.TRANSIENT, "lookup 503"))
    pod = ended_pod(3, 75, message='{"class": "transient", "message": "lookup 503 again"}')
    plan = Compensating(
        attempts=[FIRST, failed, comp(3)], pods=[pod], current=3, policy=policy, lease=held_by(3)
    ).decide()
    patch = phase_patch(plan)
    assert (patch["phase"], patch["failure"]["reason"]) == ("NeedsReconciliation", "CompensationIncomplete")


def test_a_compensation_attempt_that_lost_its_lease_is_taken_over() -> None:
    plan = Compensating(
        attempts=[FIRST, comp(2)], pods=[running_pod(2)], current=2, lease=held_by(2), expires_in=-1
    ).decide()
    [lease] = of_type(plan, WriteLease)
    assert (lease.holder, lease.epoch) == (None, 3)
    patch = phase_patch(plan)
    assert (patch["phase"], patch["leaseEpoch"]) == ("Compensating", 3)
    assert [d.name for d in of_type(plan, DeletePod)] == [name_of(2)]


def test_a_compensation_is_never_stopped_by_a_cancel_or_the_deadline() -> None:
    plan = Compensating(
        attempts=[FIRST, comp(2)],
        pods=[running_pod(2)],
        current=2,
        lease=held_by(2),
        expires_in=30,
        spec={"cancelEpoch": 2, "deadlineSeconds": 60},  # a cancel raised since, a deadline long past
    ).decide()
    assert of_type(plan, PatchRunStatus) == [] and of_type(plan, DeletePod) == []
    assert TABLE.names.index("Compensating") < TABLE.names.index("CancelAsked")
    assert TABLE.names.index("Compensating") < TABLE.names.index("DeadlinePassed")


# ---- a request from a person ---------------------------------------------------------------------------


def requested(phase: str, effects: list[str] | None = None, *, key: str = "undo-1", **status: Any) -> Plan:
    request: dict[str, Any] = {"idempotencyKey": key, **({"effects": effects} if effects else {})}
    extra: dict[str, Any] = (
        {"committedBy": committed_by(1, 1), "result": {"ticket": "T-1"}} if phase == "Succeeded" else {}
    )
    run = make_run(
        run_status(phase, current=1, lease_epoch=1, **extra, **status), spec={"compensateRequest": request}
    )
    return decide(
        make_world(
            run,
            attempts=[make_attempt(1, phase="Succeeded")],
            side_effects=[TICKET, effect("mail", "Compensated")],
        )
    )


REQUESTS = {
    "succeeded": (requested("Succeeded"), "Accepted", "Compensating", "Succeeded"),
    "failed": (requested("Failed"), "Accepted", "Compensating", "Failed"),
    "some-effects": (requested("Cancelled", ["ticket"]), "Accepted", "Compensating", "Cancelled"),
    "unknown-key": (requested("Succeeded", ["nope"]), "UnknownEffect", None, None),
    "nothing-left": (requested("Succeeded", ["mail"]), "NothingToCompensate", None, None),
    "not-terminal": (requested("InputRequired"), "NotTerminal", None, None),
    "incomplete-returns-where-it-was": (
        requested("NeedsReconciliation", compensating={"returnPhase": "Cancelled", "firstAttempt": 2}),
        "Accepted",
        "Compensating",
        "Cancelled",
    ),
    "needs-reconciliation-otherwise": (requested("NeedsReconciliation"), "NotTerminal", None, None),
    "incomplete-with-nothing-left-is-complete": (
        requested(
            "NeedsReconciliation", ["mail"], compensating={"returnPhase": "Cancelled", "firstAttempt": 2}
        ),
        "NothingToCompensate",
        "Cancelled",
        None,
    ),
}


@pytest.mark.parametrize(("plan", "reason", "phase", "back"), REQUESTS.values(), ids=REQUESTS.keys())
def test_a_compensate_request_is_judged_once(
    plan: Plan, reason: str, phase: str | None, back: str | None
) -> None:
    [patch] = [p.patch for p in of_type(plan, PatchRunStatus)]
    [record] = patch["controls"]
    assert (record["op"], record["reason"]) == ("Compensate", reason)
    assert [k["op"] for k in patch["spentKeys"]] == ["Compensate"]
    assert patch.get("phase") == phase
    if back is not None:
        assert patch["compensating"]["returnPhase"] == back
        assert patch["compensating"]["firstAttempt"] == 2


def test_an_incomplete_compensation_found_complete_goes_back_to_where_it_was() -> None:
    """Its last Attempt compensated everything but was killed before it could exit well: asked again,
    nothing is left to do, and the Run is Cancelled again, not left NeedsReconciliation for good."""
    failure = {"class": "unknown_side_effect", "reason": "CompensationIncomplete", "message": "killed"}
    plan = requested(
        "NeedsReconciliation",
        ["mail"],
        compensating={"returnPhase": "Cancelled", "firstAttempt": 2},
        failure=failure,
    )
    [patch] = [p.patch for p in of_type(plan, PatchRunStatus)]
    assert (patch["phase"], patch["compensating"], patch["failure"]) == ("Cancelled", None, None)
    assert [e.reason for e in of_type(plan, RecordEvent)] == ["Compensated"]


def test_a_repeated_compensate_request_changes_nothing_and_a_reused_key_is_refused() -> None:
    digest = compensation.request_digest(None)
    verdict = Verdict(True, "Accepted", "done")
    recorded = control_record(ControlOp.COMPENSATE, "undo-1", digest, verdict, NOW)
    spent = [{"key": "undo-1", "op": "Compensate", "digest": digest[:39]}]
    status = run_status("Succeeded", current=2, lease_epoch=2, controls=[recorded], spentKeys=spent)
    for effects, outcome in ((None, None), (["ticket"], "IdempotencyKeyReused")):
        request: dict[str, Any] = {"idempotencyKey": "undo-1", **({"effects": effects} if effects else {})}
        run = make_run(status, spec={"compensateRequest": request})
        plan = decide(make_world(run, side_effects=[TICKET]))
        patches = [p.patch for p in of_type(plan, PatchRunStatus) if "controls" in p.patch]
        assert [p["controls"][-1]["reason"] for p in patches] == ([outcome] if outcome else [])


def test_a_manual_retry_is_refused_while_a_compensation_is_incomplete() -> None:
    status = run_status(
        "NeedsReconciliation",
        current=2,
        lease_epoch=2,
        compensating={"returnPhase": "Cancelled", "firstAttempt": 2},
    )
    run = make_run(status, spec={"retryRequest": {"idempotencyKey": "retry-1"}})
    plan = decide(make_world(run, attempts=[make_attempt(1, phase="Aborted"), comp(2, phase="Failed")]))
    [patch] = [p.patch for p in of_type(plan, PatchRunStatus)]
    assert (patch["controls"][0]["outcome"], patch["controls"][0]["reason"]) == (
        "Rejected",
        "CompensationIncomplete",
    )
    assert of_type(plan, CreateAttempt) == []


@pytest.mark.parametrize("phase", ["Cancelled", "Failed"])
def test_an_ended_run_never_leaves_a_record_pending(phase: str) -> None:
    sent = [{"sendId": "op-1-s1", "attempt": name_of(1), "time": "2026-03-01T12:00:00Z"}]
    record = make_side_effect("ticket", "Pending", operation_id="op-1", sends=sent)
    run = make_run(run_status(phase, current=1, lease_epoch=1))
    plan = decide(make_world(run, attempts=[make_attempt(1, phase="Failed")], side_effects=[record]))
    [settled] = of_type(plan, PatchSideEffectStatus)
    assert settled.patch["state"] == "Unknown"
    assert (
        f"when the Run {'was cancelled' if phase == 'Cancelled' else 'failed'}"
        in settled.patch["history"][-1]["message"]
    )
