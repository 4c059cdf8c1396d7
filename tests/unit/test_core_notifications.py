"""Which notification a Run's state calls for, where it may go, and the CloudEvent that carries it."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.core import notifications
from agentrun.core.notifications import Notice
from unit.factories import NAMESPACE, NOW, RUN, RUN_UID, make_run, pending_request, run_status

ALLOWED = ("https://hooks.example/agentrun", "http://127.0.0.1:9000/events")
APPROVAL = {
    **pending_request("auth_required", "approve-sfx-0123456789abcdef0123456789abcdef-0123456789abcdef"),
    "action": {
        "tool": "pay",
        "target": "acct-1",
        "idempotencyKey": "pay-1",
        "requestDigest": "sha256:" + "a" * 64,
    },
}


def _notice(status: dict[str, Any], spec: dict[str, Any] | None = None) -> Notice | None:
    return notifications.due(make_run(status, spec=spec))


@pytest.mark.parametrize(
    ("status", "id_", "type_", "reason"),
    [
        (
            run_status("InputRequired", current=1, pendingRequest=pending_request()),
            f"{RUN_UID}/req-1",
            notifications.INPUT_REQUIRED,
            "input_required",
        ),
        (
            run_status("AuthRequired", current=1, pendingRequest=pending_request("auth_required", "login-1")),
            f"{RUN_UID}/login-1",
            notifications.AUTH_REQUIRED,
            "auth_required",
        ),
        (
            run_status("AuthRequired", current=2, pendingRequest=APPROVAL),
            f"{RUN_UID}/{APPROVAL['requestId']}",
            notifications.APPROVAL_WAITING,
            "auth_required",
        ),
        (
            run_status(
                "NeedsReconciliation",
                current=3,
                failure={"class": "unknown_side_effect", "reason": "MaxSendsReached", "message": "x"},
            ),
            f"{RUN_UID}/MaxSendsReached-3",
            notifications.NEEDS_RECONCILIATION,
            "MaxSendsReached",
        ),
    ],
    ids=["question", "auth", "approval", "reconciliation"],
)
def test_a_run_waiting_for_a_person_has_one_notification_named_by_what_it_waits_for(
    status: dict[str, Any], id_: str, type_: str, reason: str
) -> None:
    notice = _notice(status)

    assert notice is not None
    assert (notice.id, notice.type, notice.reason) == (id_, type_, reason)
    assert (notice.namespace, notice.run, notice.uid) == (NAMESPACE, RUN, RUN_UID)
    assert _notice(status) == notice, "the same state, the same id: receivers deduplicate by it"


@pytest.mark.parametrize("phase", ["Running", "Paused", "Succeeded", "Failed", "Queued"])
def test_a_run_that_waits_for_nobody_notifies_nobody(phase: str) -> None:
    assert _notice(run_status(phase, current=1)) is None


def test_a_new_reconciliation_after_a_retry_is_a_new_notification() -> None:
    failure = {"class": "unknown_side_effect", "reason": "LookupUnavailable", "message": "x"}
    first = _notice(run_status("NeedsReconciliation", current=2, failure=failure))
    again = _notice(run_status("NeedsReconciliation", current=4, failure=failure))

    assert first is not None and again is not None and first.id != again.id


@pytest.mark.parametrize(
    ("requested", "default", "sink", "refused"),
    [
        (None, None, None, False),
        (None, ALLOWED[0], ALLOWED[0], False),
        (ALLOWED[1], None, ALLOWED[1], False),
        (ALLOWED[1], ALLOWED[0], ALLOWED[1], False),
        ("http://169.254.169.254/latest", ALLOWED[0], ALLOWED[0], True),
        ("http://10.0.0.1/admin", None, None, True),
    ],
    ids=["nowhere", "default", "allowed", "allowed-over-default", "refused-to-default", "refused"],
)
def test_a_run_names_only_a_sink_of_the_allow_list(
    requested: str | None, default: str | None, sink: str | None, refused: bool
) -> None:
    where = notifications.destination(requested, ALLOWED, default)

    assert where.sink == sink
    assert (where.refusal is not None) == refused
    if where.refusal:
        assert f"spec.notify.sink {requested} is not on the operator's allow-list" in where.refusal
        assert "AGENTRUN_NOTIFY_SINKS" in where.refusal


def test_the_event_carries_ids_reason_and_a_link_and_the_prompt_only_where_allowed() -> None:
    notice = _notice(run_status("AuthRequired", current=1, pendingRequest=APPROVAL))
    assert notice is not None

    shared = notifications.data(notice, "https://console.example/", with_prompt=False)
    assert shared == {
        "namespace": NAMESPACE,
        "run": RUN,
        "uid": RUN_UID,
        "phase": "AuthRequired",
        "reason": "auth_required",
        "requestId": APPROVAL["requestId"],
        "checkpointId": "ckpt-2",
        "console": f"https://console.example/runs/{NAMESPACE}/{RUN}",
    }
    told = notifications.data(notice, None, with_prompt=True)
    assert (told["prompt"], told["action"]) == ("Which one?", {"tool": "pay", "target": "acct-1"})
    assert "console" not in told


def test_the_cloudevent_attributes_are_http_headers() -> None:
    notice = _notice(run_status("InputRequired", current=1, pendingRequest=pending_request()))
    assert notice is not None

    assert notifications.headers(notice, NOW) == {
        "ce-specversion": "1.0",
        "ce-id": f"{RUN_UID}/req-1",
        "ce-source": f"/apis/agentrun.dev/v1alpha1/namespaces/{NAMESPACE}/runs/{RUN}",
        "ce-type": "dev.agentrun.run.input_required",
        "ce-subject": RUN,
        "ce-time": NOW.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "content-type": "application/json",
    }


def test_deliveries_back_off_exponentially_up_to_a_cap() -> None:
    delays = [notifications.retry_delay(n) for n in range(1, 10)]
    assert delays[:4] == [1.0, 2.0, 4.0, 8.0]
    assert max(delays) == notifications.MAX_RETRY_SECONDS == delays[-1]
