"""The admission policies' structure (their behaviour is tested on the real API server, in
tests/integration/test_security.py): every field is someone's, every policy is bound and enforced, and
the operator is the one identity exempt."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.admission import (
    APPROVAL_PREFIX,
    RUN_PERSON_FIELDS,
    WORKER_ATTEMPT_FIELDS,
    WORKER_RUN_FIELDS,
    admission_policies,
    unchanged,
)
from agentrun.api import AttemptStatus, RunSpec, RunStatus
from agentrun.core import interrupts, ledger

OPERATOR = "system:serviceaccount:agentrun-system:agentrun"
DOCS = admission_policies(OPERATOR)
POLICIES = {d["metadata"]["name"]: d for d in DOCS if d["kind"] == "ValidatingAdmissionPolicy"}
BINDINGS = {d["metadata"]["name"]: d for d in DOCS if d["kind"] == "ValidatingAdmissionPolicyBinding"}


def _fields(model: type[Any]) -> set[str]:
    return {field.alias or name for name, field in model.model_fields.items()}


def _expressions(policy: str) -> str:
    return " ".join(v["expression"] for v in POLICIES[policy]["spec"]["validations"])


@pytest.mark.parametrize(
    ("policy", "model", "worker_fields"),
    [
        ("run-status.agentrun.dev", RunStatus, WORKER_RUN_FIELDS),
        ("attempt-status.agentrun.dev", AttemptStatus, WORKER_ATTEMPT_FIELDS),
    ],
)
def test_every_status_field_a_worker_may_not_write_is_kept_as_stored(
    policy: str, model: type[Any], worker_fields: tuple[str, ...]
) -> None:
    assert set(worker_fields) <= _fields(model)
    expressions = _expressions(policy)
    for field in _fields(model) - set(worker_fields):
        assert unchanged("object.status", "oldObject.status", field) in expressions, field


def test_every_policy_is_bound_denying_and_fails_closed() -> None:
    assert set(POLICIES) == set(BINDINGS)
    for name, policy in POLICIES.items():
        assert policy["spec"]["failurePolicy"] == "Fail"
        assert BINDINGS[name]["spec"] == {"policyName": name, "validationActions": ["Deny"]}


def test_the_operator_is_the_one_exempt_identity() -> None:
    for name, policy in POLICIES.items():
        conditions = " ".join(c["expression"] for c in policy["spec"]["matchConditions"])
        assert f"'{OPERATOR}'" in conditions, name
    # ... and the one confined to what agentrun creates, in every mode.
    scope = POLICIES["operator-scope.agentrun.dev"]["spec"]["matchConditions"]
    assert scope == [{"name": "the-operator", "expression": f"request.userInfo.username == '{OPERATOR}'"}]
    # Pods that carry a Run's label hold a token that can write it: nobody else creates them, not even
    # a cluster administrator (the condition does not stop at ServiceAccounts).
    pods = POLICIES["attempt-pods.agentrun.dev"]["spec"]["matchConditions"]
    assert pods == [{"name": "not-the-operator", "expression": f"request.userInfo.username != '{OPERATOR}'"}]


def test_each_refusal_names_its_cause_first() -> None:
    for policy in POLICIES.values():
        for validation in policy["spec"]["validations"]:
            assert validation["messageExpression"].startswith("'Not") or validation[
                "messageExpression"
            ].startswith("'Stale"), validation


def test_every_field_of_a_run_request_that_names_a_person_is_the_senders() -> None:
    """Each control request of the spec that names a person is checked against the requesting user."""
    spec = RunSpec.model_fields
    naming = {
        (request.alias or name, "answeredBy" if "answered_by" in model.model_fields else "requestedBy")
        for name, request in spec.items()
        if (model := _model_of(request.annotation)) is not None
        and ({"answered_by", "requested_by"} & set(model.model_fields))
    }
    expressions = _expressions("run-requests.agentrun.dev")

    assert naming == set(RUN_PERSON_FIELDS)
    for request, field in RUN_PERSON_FIELDS:
        assert f"object.spec.{request}.{field} == request.userInfo.username" in expressions


def test_people_decide_on_side_effects_in_their_own_name_and_pods_never_do() -> None:
    policy = POLICIES["sideeffects-decisions.agentrun.dev"]["spec"]
    expressions = _expressions("sideeffects-decisions.agentrun.dev")
    conditions = " ".join(c["expression"] for c in policy["matchConditions"])

    for field in ("resolvedBy", "approval.approvedBy"):
        assert f"object.status.{field} == request.userInfo.username" in expressions
    assert "authentication.kubernetes.io/pod-name" in conditions  # Pods: sideeffects-status.agentrun.dev


def test_approvals_are_told_apart_by_the_prefix_the_worker_uses() -> None:
    assert APPROVAL_PREFIX == interrupts.APPROVAL_PREFIX
    assert ledger.approval_request_id("sfx-1", "sha256:" + "0" * 64).startswith(APPROVAL_PREFIX)


def test_a_refusal_for_a_name_tells_what_to_set() -> None:
    for policy in ("run-requests.agentrun.dev", "sideeffects-decisions.agentrun.dev"):
        for validation in POLICIES[policy]["spec"]["validations"]:
            message = validation["messageExpression"]
            assert "kubectl auth whoami" in message and "+ request.userInfo.username +" in message, message


def _model_of(annotation: Any) -> type[Any] | None:
    """The pydantic model of an optional field (X | None), if it is one."""
    for candidate in getattr(annotation, "__args__", (annotation,)):
        if isinstance(candidate, type) and hasattr(candidate, "model_fields"):
            return candidate
    return None
