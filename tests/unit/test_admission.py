"""The admission policies' structure (their behaviour is tested on the real API server, in
tests/integration/test_security.py): every field is someone's, every policy is bound and enforced, and
the operator is the one identity exempt."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.admission import (
    WORKER_ATTEMPT_FIELDS,
    WORKER_RUN_FIELDS,
    admission_policies,
    unchanged,
)
from agentrun.api import AttemptStatus, RunStatus

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
