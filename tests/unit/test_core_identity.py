"""No borrowed identity, no adoption: which ServiceAccount attempt Pods may run as, and which objects are
a Run's own (agentrun.core.identity), and what decide does when the account is refused."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.core.identity import (
    Account,
    account_refusal,
    agent_account,
    may_start_pods,
    owned_by,
    role_refusal,
)
from agentrun.core.plan import CreateAttempt, CreatePod, WriteLease
from agentrun.core.runs import decide
from unit.factories import (
    NAMESPACE,
    RUN_UID,
    events,
    make_attempt,
    make_run,
    make_world,
    of_type,
    run_patch,
    run_status,
)

OPERATOR = Account("agentrun-system", "agentrun")
LABELLED = {"agentrun.dev/agent": "true"}

# (account, its labels or None when it does not exist, the operator's account) -> refused, and what the
# message must say.
ACCOUNTS: dict[str, tuple[Account, dict[str, str] | None, Account | None, tuple[str, ...]]] = {
    "labelled": (Account("team-a", "agents"), LABELLED, OPERATOR, ()),
    "labelled, the operator has no account": (Account("team-a", "agents"), LABELLED, None, ()),
    "labelled default": (Account("team-a", "default"), LABELLED, OPERATOR, ()),
    "unlabelled": (
        Account("team-a", "agents"),
        {},
        OPERATOR,
        ("team-a/agents", "kubectl label serviceaccount agents -n team-a agentrun.dev/agent=true"),
    ),
    "unlabelled default": (
        Account("team-a", "default"),
        {"app": "x"},
        OPERATOR,
        ("kubectl label serviceaccount default -n team-a agentrun.dev/agent=true",),
    ),
    "labelled false": (
        Account("team-a", "agents"),
        {"agentrun.dev/agent": "false"},
        OPERATOR,
        ("not labelled",),
    ),
    "missing": (Account("team-a", "agents"), None, OPERATOR, ("does not exist", "kubectl label")),
    "the operator's own, unlabelled": (OPERATOR, {}, OPERATOR, ("operator's own",)),
    "the operator's own, even labelled": (
        OPERATOR,
        LABELLED,
        OPERATOR,
        ("operator's own", "even when labelled"),
    ),
    "same name as the operator's, other namespace": (Account("team-a", "agentrun"), LABELLED, OPERATOR, ()),
}


@pytest.mark.parametrize(("account", "labels", "operator", "says"), ACCOUNTS.values(), ids=ACCOUNTS.keys())
def test_account_refusal(
    account: Account, labels: dict[str, str] | None, operator: Account | None, says: tuple[str, ...]
) -> None:
    refusal = account_refusal(account, labels, operator)
    if not says:
        assert refusal is None
    else:
        assert refusal is not None
        for fragment in says:
            assert fragment in refusal


def test_the_agent_account_defaults_to_the_namespace_default() -> None:
    assert agent_account(make_run()) == Account(NAMESPACE, "default")
    named = make_run(spec={"agent": {"image": "i", "serviceAccountName": "agents"}})
    assert agent_account(named) == Account(NAMESPACE, "agents")


RETRY = {"retryRequest": {"idempotencyKey": "retry-1", "reason": "labelled now"}}
SPENT = {"idempotencyKey": "retry-1", "op": "Retry", "digest": "sha256:" + "0" * 64, "outcome": "Accepted"}
STARTS: dict[str, tuple[dict[str, Any] | None, dict[str, Any], bool]] = {
    "new": (None, {}, True),
    "queued": (run_status("Queued"), {}, True),
    "running": (run_status("Running", current=1, lease_epoch=1), {}, True),
    "waiting for input": (run_status("InputRequired", current=1, lease_epoch=1), {}, True),
    "succeeded": (run_status("Succeeded", current=1), {}, False),
    "failed": (run_status("Failed", current=1), {}, False),
    "needs reconciliation": (run_status("NeedsReconciliation", current=1), {}, False),
    "failed, a retry asked for": (run_status("Failed", current=1), RETRY, True),
    "failed, the retry judged": (
        run_status("Failed", current=1, controls=[{**SPENT, "time": "2026-03-01T12:00:00Z"}]),
        RETRY,
        False,
    ),
}


@pytest.mark.parametrize(("status", "spec", "expected"), STARTS.values(), ids=STARTS.keys())
def test_may_start_pods(status: dict[str, Any] | None, spec: dict[str, Any], expected: bool) -> None:
    assert may_start_pods(make_run(status, spec=spec)) is expected


def ref(uid: str = RUN_UID, kind: str = "Run", controller: bool | None = True) -> dict[str, Any]:
    out: dict[str, Any] = {"apiVersion": "agentrun.dev/v1alpha1", "kind": kind, "name": "triage", "uid": uid}
    if controller is not None:
        out["controller"] = controller
    return out


OWNERS: dict[str, tuple[list[dict[str, Any]] | None, bool, bool]] = {
    # ownerReferences -> (owned as controller, owned at all)
    "controlled by the Run": ([ref()], True, True),
    "owned, not controlled (an SDK record)": ([ref(controller=None)], False, True),
    "owned, controller false": ([ref(controller=False)], False, True),
    "another Run of the same name (recreated)": ([ref(uid="other")], False, False),
    "no owner (squatted)": (None, False, False),
    "the uid under another kind": ([ref(kind="Attempt")], False, False),
    "controlled by the Run among others": (
        [ref(uid="x", kind="Attempt", controller=False), ref()],
        True,
        True,
    ),
}


@pytest.mark.parametrize(("refs", "controlled", "owned"), OWNERS.values(), ids=OWNERS.keys())
def test_owned_by(refs: list[dict[str, Any]] | None, controlled: bool, owned: bool) -> None:
    obj = {"metadata": {"name": "triage-a1", **({"ownerReferences": refs} if refs is not None else {})}}
    assert owned_by(obj, RUN_UID, controller=True) is controlled
    assert owned_by(obj, RUN_UID, controller=False) is owned
    assert owned_by(obj, None, controller=False) is False


REFUSED = "ServiceAccount team-a/default is not labelled agentrun.dev/agent=true: ..."
# Each a state in which decide would otherwise grant a Lease or create an Attempt or Pod.
BEFORE_A_POD: dict[str, tuple[dict[str, Any], dict[str, Any], list[Any]]] = {
    "queued": (run_status("Queued"), {}, []),
    "retry due": (
        run_status("RetryBackoff", current=1, lease_epoch=1, nextAttemptTime="2026-03-01T12:05:00Z"),
        {},
        [make_attempt(1, phase="Failed")],
    ),
    "a grant interrupted before its Attempt": (run_status("Running", current=1, lease_epoch=1), {}, []),
    "an Attempt without its Pod": (
        run_status("Running", current=1, lease_epoch=1),
        {},
        [make_attempt(1, phase=None, started=False)],
    ),
    "a manual retry": (
        run_status("Failed", current=1, lease_epoch=1),
        RETRY,
        [make_attempt(1, phase="Failed")],
    ),
}


@pytest.mark.parametrize(("status", "spec", "attempts"), BEFORE_A_POD.values(), ids=BEFORE_A_POD.keys())
def test_a_refused_account_fails_the_run_before_any_lease_attempt_or_pod(
    status: dict[str, Any], spec: dict[str, Any], attempts: list[Any]
) -> None:
    world = make_world(make_run(status, spec=spec), attempts=attempts, account_refusal=REFUSED)
    plan = decide(world)
    assert of_type(plan, WriteLease) == []
    assert of_type(plan, CreatePod) == []
    patch = run_patch(plan)
    assert (patch["phase"], patch["failure"]["class"], patch["failure"]["reason"]) == (
        "Failed",
        "deterministic",
        "ServiceAccountNotAllowed",
    )
    assert patch["message"] == REFUSED
    assert ("Warning", "ServiceAccountNotAllowed") in events(plan)
    if not attempts and status["phase"] == "Running":
        # the Attempt the grant promised is still created (status.attempts counts it), never its Pod
        assert len(of_type(plan, CreateAttempt)) == 1
    else:
        assert of_type(plan, CreateAttempt) == []


def test_an_allowed_account_grants_as_before() -> None:
    plan = decide(make_world(make_run(run_status("Queued"))))
    assert len(of_type(plan, WriteLease)) == len(of_type(plan, CreatePod)) == 1


# ---- the attempt role -----------------------------------------------------------------------------------

DENIED = ("patch runs/status", "create checkpoints", "patch leases", "create sideeffects")


def test_a_role_refusal_names_what_was_denied_and_the_command_that_binds_the_role() -> None:
    message = role_refusal(Account("team-a", "agents"), ("get runs", *DENIED))
    assert message is not None
    assert "may not patch runs/status, create checkpoints, patch leases and 2 more" in message
    assert (
        "`kubectl create rolebinding agentrun-attempt-agents -n team-a --role=agentrun-attempt "
        "--serviceaccount=team-a:agents`" in message
    )
    assert "`kubectl apply -f examples/agents.yaml`" in message
    assert role_refusal(Account("team-a", "agents"), ()) is None


@pytest.mark.parametrize(("status", "spec", "attempts"), BEFORE_A_POD.values(), ids=BEFORE_A_POD.keys())
def test_an_unbound_attempt_role_fails_the_run_before_any_lease_or_pod(
    status: dict[str, Any], spec: dict[str, Any], attempts: list[Any]
) -> None:
    world = make_world(make_run(status, spec=spec), attempts=attempts, attempt_role_denied=DENIED)
    plan = decide(world)
    assert of_type(plan, WriteLease) == []
    assert of_type(plan, CreatePod) == []
    patch = run_patch(plan)
    assert (patch["phase"], patch["failure"]["class"], patch["failure"]["reason"]) == (
        "Failed",
        "deterministic",
        "AttemptRoleNotBound",
    )
    assert patch["message"] == role_refusal(Account(NAMESPACE, "default"), DENIED)
    assert ("Warning", "AttemptRoleNotBound") in events(plan)


def test_an_account_not_opted_in_is_refused_for_that_first() -> None:
    world = make_world(make_run(run_status("Queued")), account_refusal=REFUSED, attempt_role_denied=DENIED)
    assert run_patch(decide(world))["failure"]["reason"] == "ServiceAccountNotAllowed"
