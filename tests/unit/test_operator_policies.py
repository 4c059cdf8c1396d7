"""The operator's start-up check of the admission policies, and the one list of them the docs show."""

from __future__ import annotations

import re
from typing import Any

import pytest

from agentrun.admission import admission_policies, policy_names, policy_reader_rules, service_account_user
from agentrun.core.identity import Account
from agentrun.operator import policies
from agentrun.operator.policies import Found
from support.corpus import REPO

OPERATOR = Account("agentrun-system", "agentrun")
USER = service_account_user(OPERATOR.namespace, OPERATOR.name)


def installed(user: str = USER) -> dict[str, Found]:
    """Every policy and binding as agentrun.admission generates them for `user`."""
    docs = admission_policies(user)
    by_kind: dict[str, dict[str, Any]] = {}
    for doc in docs:
        by_kind.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    return {
        name: Found(
            by_kind["ValidatingAdmissionPolicy"][name], by_kind["ValidatingAdmissionPolicyBinding"][name]
        )
        for name in policy_names()
    }


def test_the_generated_policies_pass_the_check() -> None:
    assert policies.problems(installed(), USER) == []
    assert policies.problems(installed(), None) == [], "another identity (a developer) is not compared"


def test_each_missing_or_wrong_part_is_named() -> None:
    found = installed()
    first, second, third = policy_names()[:3]
    found[first] = Found(None, None)
    found[second] = Found(found[second].policy, None)
    audit_only = {"spec": {"policyName": third, "validationActions": ["Audit"]}}
    found[third] = Found(found[third].policy, audit_only)
    assert policies.problems(found, USER) == [
        f"ValidatingAdmissionPolicy {first} is missing",
        f"ValidatingAdmissionPolicyBinding {second} is missing (the policy is not enforced)",
        f"ValidatingAdmissionPolicyBinding {third} does not deny (validationActions)",
    ]


def test_policies_installed_for_another_operator_are_refused() -> None:
    other = installed(service_account_user("ops", "someone-else"))
    wrong = policies.problems(other, USER)
    assert len(wrong) == len(policy_names())
    assert all(f"does not name this operator ({USER})" in w for w in wrong)


def test_the_refusal_says_how_to_install_them_for_this_operator() -> None:
    text = policies.how_to_install(OPERATOR)
    assert "-n agentrun-system --set admission.install=true --set serviceAccount.name=agentrun" in text
    assert "--show-only templates/admission.yaml | kubectl apply -f -" in text
    assert "kubectl apply -f manifests/admission.yaml" in text
    assert "NAMESPACE" in policies.how_to_install(None)


@pytest.mark.parametrize(
    ("env", "required"),
    [
        ({}, True),
        ({"AGENTRUN_REQUIRE_ADMISSION_POLICIES": "false"}, False),
        ({policies.REQUIRE_ENV: "1"}, True),
    ],
)
def test_the_check_is_on_unless_turned_off(env: dict[str, str], required: bool) -> None:
    assert policies.required(env) is required


def test_the_wait_for_the_policies_is_configurable() -> None:
    assert policies.wait_seconds({}) == 30.0
    assert policies.wait_seconds({policies.WAIT_ENV: "0"}) == 0.0


def test_the_operator_may_read_exactly_these_policies() -> None:
    (rule,) = policy_reader_rules()
    assert rule["verbs"] == ["get"]
    assert rule["resourceNames"] == policy_names()
    assert set(rule["resources"]) == {"validatingadmissionpolicies", "validatingadmissionpolicybindings"}


def test_docs_list_the_generated_policies() -> None:
    """docs/security.md's table of policies is the generated list, no more, no fewer."""
    text = (REPO / "docs" / "security.md").read_text()
    table = text.split("| policy | what it enforces |")[1].split("\n\n")[0]
    listed = re.findall(r"^\| `([a-z.-]+)` \|", table, flags=re.MULTILINE)
    assert sorted(listed) == sorted(policy_names()), "docs/security.md: add or remove rows"
    assert not re.search(r"\b(seven|eight|nine) ValidatingAdmissionPolicies", text), "no hand-written count"
