"""Who decided: the operator copies the name a control request carries (checked by the API server against
the user who sent it) into status.inputs, status.controls, the SideEffect's approval and the report."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.api import ControlOp, ControlRecord, RecordedInput, RequestedAction, SideEffect, json_digest
from agentrun.api.budgets import ACTION_REQUEST_BUDGET, stored_size
from agentrun.core import controls, ledger, report
from unit.factories import NOW, make_attempt, make_run, make_side_effect, run_status, ts

ANSWER = {
    "requestId": "req-1",
    "checkpointId": "ckpt-2",
    "value": {"approved": True},
    "idempotencyKey": "k-1",
}
SPEC: dict[str, Any] = {
    "resume": {**ANSWER, "answeredBy": "alice"},
    "cancelEpoch": 1,
    "cancelRequest": {"idempotencyKey": "k-cancel", "requestedBy": "bob"},
    "retryRequest": {"idempotencyKey": "k-retry", "requestedBy": "carol"},
    "compensateRequest": {"idempotencyKey": "k-undo", "requestedBy": "dave"},
    "pause": {"requestId": "k-pause"},
}


def _recorded(op: ControlOp, key: str, spec: dict[str, Any]) -> dict[str, Any]:
    run = make_run(run_status("Failed"), spec=spec)
    entry = controls.control_record(op, key, json_digest(key), controls.Verdict(True, "Accepted", "ok"), NOW)
    [written] = controls.with_record(run, entry)
    ControlRecord.model_validate(written)
    return written


@pytest.mark.parametrize(
    ("op", "key", "by"),
    [
        (ControlOp.RESUME, "k-1", "alice"),
        (ControlOp.CANCEL, "k-cancel", "bob"),
        (ControlOp.RETRY, "k-retry", "carol"),
        (ControlOp.COMPENSATE, "k-undo", "dave"),
        (ControlOp.PAUSE, "k-pause", None),
        (ControlOp.RETRY, "k-other", None),  # not the request in the spec now: its sender is unknown
        (ControlOp.CANCEL, "k-1", None),  # the resume's key, but not a cancel
    ],
)
def test_a_control_record_names_who_sent_the_request(op: ControlOp, key: str, by: str | None) -> None:
    assert _recorded(op, key, SPEC).get("requestedBy") == by


def test_a_request_that_names_nobody_is_recorded_without_a_name() -> None:
    assert "requestedBy" not in _recorded(ControlOp.RESUME, "k-1", {"resume": ANSWER})


def test_an_accepted_input_names_who_answered() -> None:
    run = make_run(run_status("InputRequired"), spec=SPEC)
    [entry] = controls.with_input(run, run.spec.resume, NOW)  # type: ignore[arg-type]

    assert entry["answeredBy"] == "alice"
    assert RecordedInput.model_validate(entry).answered_by == "alice"
    unnamed = make_run(run_status("InputRequired"), spec={"resume": ANSWER})
    assert "answeredBy" not in controls.with_input(unnamed, unnamed.spec.resume, NOW)[0]  # type: ignore[arg-type]


def _gated(key: str) -> tuple[SideEffect, str]:
    digest = ledger.request_digest("pay", "acct-1", {"amount": 5})
    effect = make_side_effect(key, "Pending", tool="pay", digest=digest)
    return effect, ledger.approval_request_id(str(effect.metadata.name), digest)


def test_an_approval_names_who_approved_from_the_recorded_input() -> None:
    effect, request_id = _gated("pay-1")
    attempt = make_attempt(2, reason=f"resume:{request_id}", input_value={"approved": True})
    answered = RecordedInput.model_validate(
        {
            "requestId": request_id,
            "checkpointId": "ckpt-2",
            "digest": json_digest({"approved": True}),
            "idempotencyKey": "k-approve",
            "answeredBy": "alice",
            "time": ts(NOW),
        }
    )

    [(name, approval)] = ledger.approvals_to_record([effect], [attempt], ts(NOW), [answered])
    assert (name, approval["approvedBy"], approval["requestId"]) == (
        effect.metadata.name,
        "alice",
        request_id,
    )
    [(_, unnamed)] = ledger.approvals_to_record([effect], [attempt], ts(NOW), [])
    assert "approvedBy" not in unnamed, "an answer sent before names existed names nobody"


def test_the_report_names_who_approved_and_who_resolved() -> None:
    approved, request_id = _gated("pay-1")
    body = approved.to_api()
    body["status"] = {
        "state": "Confirmed",
        "approval": {"requestId": request_id, "approvedBy": "alice", "time": ts(NOW)},
    }
    resolved = make_side_effect("mail-1", "Unknown").to_api()
    resolved["status"] = {"state": "Confirmed", "resolution": "Confirmed", "resolvedBy": "bob"}
    plain = make_side_effect("note-1", "Confirmed")

    effects = [SideEffect.model_validate(body), SideEffect.model_validate(resolved), plain]
    listed = {e["name"]: e for e in report.run_report(effects)["effects"]}

    assert listed[str(approved.metadata.name)]["approvedBy"] == "alice"
    assert listed[resolved["metadata"]["name"]]["resolvedBy"] == "bob"
    assert {"approvedBy", "resolvedBy"}.isdisjoint(listed[str(plain.metadata.name)])


def test_an_approval_shows_the_action_it_approves_and_its_digest_binds_it() -> None:
    request = {"amount": 5, "to": "acct-1"}
    digest = ledger.request_digest("pay", "acct-1", request)
    action = ledger.approval_action("pay", "acct-1", "pay-1", request, digest, False)

    assert action == {
        "tool": "pay",
        "target": "acct-1",
        "idempotencyKey": "pay-1",
        "request": request,
        "requestDigest": digest,
        "reversible": False,
    }
    assert ledger.request_digest(action["tool"], action["target"], action["request"]) == digest
    RequestedAction.model_validate(action)


def test_a_request_too_large_to_show_is_left_out_with_its_size() -> None:
    request: dict[str, Any] = {"body": "x" * ACTION_REQUEST_BUDGET}
    digest = ledger.request_digest("mail", None, request)
    action = ledger.approval_action("mail", None, "mail-1", request, digest, True)

    assert "request" not in action and "target" not in action
    assert action["requestBytes"] == stored_size(request) > ACTION_REQUEST_BUDGET
    assert action["requestDigest"] == digest
    RequestedAction.model_validate(action)
