"""core.ledger: what a worker may do about an external action, given what the SideEffect ledger says."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agentrun.api import SideEffect, SideEffectSpec
from agentrun.core.ledger import (
    Answer,
    Step,
    StopReason,
    after_lookup,
    after_send,
    after_unknown,
    approval_request_id,
    backoff,
    canonical_json,
    foreign_record,
    needs_approval,
    next_step,
    request_digest,
    round_sends,
    send_again,
    settle_after_cancel,
    side_effect_name,
    unknown_reason,
)
from unit.factories import make_side_effect, ts

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


# ---- the recovery rule: every record state x every answer ------------------------------------------------

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
SENT = NOW - timedelta(seconds=10)


def rec(
    state: str | None = "Pending",
    *outcomes: str | None,
    digest: str | None = DIGEST,
    reversible: bool = True,
    resend: str = "Never",
    max_sends: int = 3,
    deadline: int = 300,
    resolution: str | None = None,
    resolved_sends: int | None = None,
    conflict: str | None = None,
    references: tuple[str | None, ...] = (),
    external_reference: str | None = None,
    first_sent: datetime = SENT,
    operation: str | None = "op-1",
) -> SideEffect:
    """A record with sends of these outcomes (None: in flight), the first sent at `first_sent`."""
    record = make_side_effect("k", state, digest=digest, reversible=reversible, reference=external_reference)
    body = record.to_api()
    body["spec"].update({"resend": resend, "maxSends": max_sends, "sendDeadlineSeconds": deadline})
    if operation:
        body["spec"]["operationId"] = operation
    if state is None:
        return SideEffect.model_validate(body)
    sends = []
    for n, outcome in enumerate(outcomes):
        send: dict[str, Any] = {"sendId": f"op-s{n + 1}", "attempt": "triage-a1", "time": ts(first_sent)}
        if outcome:
            send["outcome"] = outcome
        if n < len(references) and references[n]:
            send["reference"] = references[n]
        sends.append(send)
    status = body["status"]
    if sends:
        status["sends"] = sends
    if resolution:
        status.update({"resolution": resolution, "resolvedBy": "alice"})
    if resolved_sends is not None:
        status["resolvedSends"] = resolved_sends
    if conflict:
        status["conflict"] = {"message": conflict, "time": ts(NOW)}
    return SideEffect.model_validate(body)


E, U, L, R, X = Step.EXECUTE, Step.REUSE, Step.LOOK_UP, Step.RECONCILE, Step.REFUSE
SR = StopReason

NEXT_STEPS: dict[str, tuple[SideEffect | None, Step, StopReason | None]] = {
    "no record: record Pending, then send": (None, E, None),
    "no status (counts as Pending), nothing sent": (rec(None), E, None),
    "pending, nothing sent yet": (rec("Pending"), E, None),
    "pending, no operationId (an older SDK: no sends recorded)": (rec("Pending", operation=None), L, None),
    "pending, a send in flight (crash)": (rec("Pending", None), L, None),
    "pending, last send unknown": (rec("Pending", "Unknown"), L, None),
    "pending, last send failed definitely (transient)": (rec("Pending", "Failed"), E, None),
    "pending, transient failures up to maxSends": (
        rec("Pending", "Failed", "Failed", "Failed"),
        R,
        SR.MAX_SENDS,
    ),
    "pending, deadline passed": (rec("Pending", "Failed", deadline=5), R, SR.MAX_SENDS),
    "unknown, nothing recorded (marked from outside)": (rec("Unknown"), L, None),
    "unknown, send in flight": (rec("Unknown", None), L, None),
    "unknown, lookup said absent: send again": (rec("Unknown", "Absent"), E, None),
    "unknown, absent, irreversible": (rec("Unknown", "Absent", reversible=False), R, SR.IRREVERSIBLE),
    "unknown, absent, maxSends spent": (rec("Unknown", "Absent", max_sends=1), R, SR.MAX_SENDS),
    "unknown with a conflict": (rec("Unknown", "Unknown", conflict="two tickets"), R, SR.CONFLICT),
    "confirmed": (rec("Confirmed", "Confirmed"), U, None),
    "compensated": (rec("Compensated", "Confirmed"), U, None),
    "failed": (rec("Failed", "Failed"), X, SR.FAILED),
    "failed by a person": (rec("Failed", "Unknown", resolution="Failed", resolved_sends=1), X, SR.FAILED),
    "resolved Absent: a fresh round": (
        rec("Failed", "Unknown", "Unknown", "Unknown", resolution="Absent", resolved_sends=3),
        E,
        None,
    ),
    "resolved Absent, sent again since, failed": (
        rec("Failed", "Unknown", "Failed", resolution="Absent", resolved_sends=1),
        X,
        SR.FAILED,
    ),
    "confirmed, another request": (rec("Confirmed", digest=OTHER_DIGEST), X, SR.KEY_REUSED),
    "pending, another request": (rec("Pending", digest=OTHER_DIGEST), X, SR.KEY_REUSED),
    "unknown, another request": (rec("Unknown", None, digest=OTHER_DIGEST), X, SR.KEY_REUSED),
    "no status, another request": (rec(None, digest=OTHER_DIGEST), X, SR.KEY_REUSED),
    "confirmed, no digest (older record)": (rec("Confirmed", digest=None), U, None),
}


@pytest.mark.parametrize(("record", "step", "reason"), NEXT_STEPS.values(), ids=NEXT_STEPS.keys())
def test_next_step(record: SideEffect | None, step: Step, reason: StopReason | None) -> None:
    decision = next_step(record, DIGEST, NOW)
    assert (decision.step, decision.reason) == (step, reason)


@pytest.mark.parametrize("state", ["Confirmed", "Compensated"])
def test_a_confirmed_action_is_never_executed_again(state: str) -> None:
    """Whatever the digest asked for, a record that says it happened never leads to EXECUTE."""
    record = make_side_effect("k", state, digest=DIGEST, reversible=True)
    for digest in (DIGEST, OTHER_DIGEST, request_digest("x", None)):
        assert next_step(record, digest, NOW).step != Step.EXECUTE


# After a send without answer (the record already holds that send, outcome Unknown).
AFTER_UNKNOWN: dict[str, tuple[SideEffect, bool, Step, StopReason | None]] = {
    "with a lookup: look it up first": (rec("Unknown", "Unknown"), True, L, None),
    "irreversible, with a lookup: look it up": (rec("Unknown", "Unknown", reversible=False), True, L, None),
    "no lookup, resend Never": (rec("Unknown", "Unknown"), False, R, SR.UNKNOWN),
    "no lookup, WithSameKey": (rec("Unknown", "Unknown", resend="WithSameKey"), False, E, None),
    "no lookup, WithSameKey, bound": (
        rec("Unknown", "Unknown", resend="WithSameKey", max_sends=1),
        False,
        R,
        SR.MAX_SENDS,
    ),
    "no lookup, irreversible, WithSameKey": (
        rec("Unknown", "Unknown", reversible=False, resend="WithSameKey"),
        False,
        R,
        SR.IRREVERSIBLE,
    ),
}


@pytest.mark.parametrize(
    ("record", "can", "step", "reason"), AFTER_UNKNOWN.values(), ids=AFTER_UNKNOWN.keys()
)
def test_after_unknown(record: SideEffect, can: bool, step: Step, reason: StopReason | None) -> None:
    decision = after_unknown(record, can, NOW)
    assert (decision.step, decision.reason) == (step, reason)


LOOKUPS: dict[str, tuple[Answer, SideEffect, str | None, Step, StopReason | None]] = {
    "found": (Answer.FOUND, rec("Unknown", "Unknown"), "T-1", U, None),
    "found, the reference seen before": (
        Answer.FOUND,
        rec("Unknown", "Unknown", references=("T-1",)),
        "T-1",
        U,
        None,
    ),
    "found, another reference than a send named": (
        Answer.FOUND,
        rec("Unknown", "Unknown", references=("T-1",)),
        "T-2",
        R,
        SR.CONFLICT,
    ),
    "found, another reference than recorded": (
        Answer.FOUND,
        rec("Unknown", "Unknown", external_reference="T-1"),
        "T-2",
        R,
        SR.CONFLICT,
    ),
    "lookup raised ConflictingResult": (Answer.CONFLICT, rec("Unknown", "Unknown"), None, R, SR.CONFLICT),
    "absent: send again, same key": (Answer.ABSENT, rec("Unknown", "Unknown"), None, E, None),
    "absent, irreversible": (
        Answer.ABSENT,
        rec("Unknown", "Unknown", reversible=False),
        None,
        R,
        SR.IRREVERSIBLE,
    ),
    "absent, maxSends spent": (
        Answer.ABSENT,
        rec("Unknown", "Unknown", "Absent", "Unknown"),
        None,
        R,
        SR.MAX_SENDS,
    ),
    "absent, deadline passed": (Answer.ABSENT, rec("Unknown", "Unknown", deadline=5), None, R, SR.MAX_SENDS),
    "cannot tell, before the deadline: ask again": (
        Answer.CANNOT_TELL,
        rec("Unknown", "Unknown"),
        None,
        L,
        None,
    ),
    "cannot tell, deadline passed": (
        Answer.CANNOT_TELL,
        rec("Unknown", "Unknown", deadline=5),
        None,
        R,
        SR.LOOKUP_UNAVAILABLE,
    ),
    "cannot tell, nothing sent to count from": (
        Answer.CANNOT_TELL,
        rec("Unknown"),
        None,
        R,
        SR.LOOKUP_UNAVAILABLE,
    ),
}


@pytest.mark.parametrize(("answer", "record", "ref", "step", "reason"), LOOKUPS.values(), ids=LOOKUPS.keys())
def test_after_lookup(
    answer: Answer, record: SideEffect, ref: str | None, step: Step, reason: StopReason | None
) -> None:
    decision = after_lookup(answer, record, NOW, ref)
    assert (decision.step, decision.reason) == (step, reason)


SENDS: dict[str, tuple[Answer, SideEffect, float, Step, StopReason | None]] = {
    "confirmed": (Answer.CONFIRMED, rec("Pending", "Confirmed"), 0, U, None),
    "definite failure: Failed for good": (Answer.FAILED, rec("Pending", "Failed"), 0, X, SR.FAILED),
    "429 / transient: send again": (Answer.RETRYABLE, rec("Pending", "Failed"), 1, E, None),
    "429, maxSends reached": (
        Answer.RETRYABLE,
        rec("Pending", "Failed", "Failed", "Failed"),
        0,
        R,
        SR.MAX_SENDS,
    ),
    "429, retry_after past the deadline": (
        Answer.RETRYABLE,
        rec("Pending", "Failed", deadline=60),
        120,
        R,
        SR.MAX_SENDS,
    ),
    "no answer: look it up": (Answer.NO_ANSWER, rec("Unknown", "Unknown"), 0, L, None),
}


@pytest.mark.parametrize(("answer", "record", "wait", "step", "reason"), SENDS.values(), ids=SENDS.keys())
def test_after_send(
    answer: Answer, record: SideEffect, wait: float, step: Step, reason: StopReason | None
) -> None:
    decision = after_send(answer, record, NOW, wait)
    assert (decision.step, decision.reason) == (step, reason)


def test_a_fresh_round_counts_only_the_sends_after_the_resolution() -> None:
    record = rec("Pending", "Unknown", "Unknown", "Unknown", "Failed", resolution="Absent", resolved_sends=3)
    assert len(round_sends(record)) == 1
    assert send_again(record, NOW).step == Step.EXECUTE
    spent = rec("Pending", *(["Unknown"] * 3), *(["Failed"] * 3), resolution="Absent", resolved_sends=3)
    assert send_again(spent, NOW).reason == StopReason.MAX_SENDS


def test_backoff_is_capped_and_honours_retry_after() -> None:
    assert [backoff(n) for n in (1, 2, 3)] == [0.5, 1.0, 2.0]
    assert backoff(20) == 30.0
    assert backoff(1, retry_after=7) == 7


CANCELLED = {
    "a send in flight: maybe": (rec("Pending", None), "Unknown"),
    "the last send unknown": (rec("Pending", "Unknown"), "Unknown"),
    "an older SDK's record, no sends recorded": (rec("Pending", operation=None), "Unknown"),
    "never sent": (rec("Pending"), "Failed"),
    "every send failed definitely (MaxSendsReached)": (rec("Pending", "Failed", "Failed"), "Failed"),
}


@pytest.mark.parametrize(("record", "state"), CANCELLED.values(), ids=CANCELLED.keys())
def test_a_cancelled_runs_pending_records_never_stay_pending(record: SideEffect, state: str) -> None:
    others = [rec("Confirmed", "Confirmed"), rec("Unknown", "Unknown")]
    [(name, patch, _version)] = settle_after_cancel([record, *others], ts(NOW), 20)
    assert (name, patch["state"]) == (record.metadata.name, state)
    assert "cancelled" in patch["history"][-1]["message"]


UNKNOWN_REASONS = {
    "conflict": ([rec("Unknown", "Unknown", conflict="x"), rec("Unknown", reversible=False)], SR.CONFLICT),
    "irreversible": ([rec("Unknown", "Unknown", reversible=False)], SR.IRREVERSIBLE),
    "plain": ([rec("Unknown", "Unknown")], SR.UNKNOWN),
}


@pytest.mark.parametrize(("records", "reason"), UNKNOWN_REASONS.values(), ids=UNKNOWN_REASONS.keys())
def test_unknown_reason_from_the_records(records: list[SideEffect], reason: StopReason) -> None:
    assert unknown_reason(records) == reason


# ---- approvals are bound to the request ----------------------------------------------------------------


def test_an_approval_names_the_request_digest() -> None:
    one = approval_request_id("sfx-1", DIGEST)
    assert one != approval_request_id("sfx-1", OTHER_DIGEST)
    assert one.startswith("approve-sfx-1-")


def test_needs_approval() -> None:
    assert needs_approval(True, True, False)
    assert needs_approval(False, False, True), "irreversible under spec.approvals.irreversible"
    assert not needs_approval(False, True, True)
    assert not needs_approval(False, False, False)


# ---- canonical JSON (RFC 8785) -----------------------------------------------------------------------------

JCS = {
    "sorted keys, no whitespace": ({"b": 1, "a": [1, 2]}, '{"a":[1,2],"b":1}'),
    "integral float": (1.0, "1"),
    "small float": (0.00001, "0.00001"),
    "tiny float": (1e-7, "1e-7"),
    "large float": (1e21, "1e+21"),
    "unicode unescaped": ("ä€", '"ä€"'),
    "keys by UTF-16 code units, not code points": (
        {"\ufb33": 1, "\U0001f600": 2},
        '{"\U0001f600":2,"\ufb33":1}',
    ),
    "literals": ([None, True, False], "[null,true,false]"),
}


@pytest.mark.parametrize(("value", "text"), JCS.values(), ids=JCS.keys())
def test_canonical_json(value: Any, text: str) -> None:
    assert canonical_json(value) == text


def test_steps_are_plain_strings() -> None:
    assert [str(s) for s in Step] == ["execute", "reuse", "look_up", "reconcile", "refuse"]
