"""The operator's pre-flight of the attempt role (agentrun.operator.attempt_role): what it asks the API
server, derived from the one source of the attempt role's rules, and how long an answer is kept."""

from __future__ import annotations

from agentrun.core.identity import Account
from agentrun.operator.attempt_role import ALLOWED_SECONDS, ATTEMPT_PERMISSIONS, AllowedAccounts, review
from agentrun.rbac import ATTEMPT_POD_RULES, OPERATOR_RULES, Permission, permissions
from support.clock import FakeClock

AGENTS = Account("team-a", "agents")


def test_a_review_asks_for_the_account_as_its_token_presents_it_in_its_own_namespace() -> None:
    body = review(AGENTS, Permission("agentrun.dev", "runs/status", "patch"))
    assert body == {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "LocalSubjectAccessReview",
        "metadata": {"namespace": "team-a"},
        "spec": {
            "user": "system:serviceaccount:team-a:agents",
            "groups": ["system:serviceaccounts", "system:serviceaccounts:team-a", "system:authenticated"],
            "resourceAttributes": {
                "namespace": "team-a",
                "group": "agentrun.dev",
                "resource": "runs",
                "subresource": "status",
                "verb": "patch",
            },
        },
    }


def test_a_review_of_a_core_resource_has_no_subresource() -> None:
    attributes = review(AGENTS, Permission("coordination.k8s.io", "leases", "patch"))["spec"][
        "resourceAttributes"
    ]
    assert attributes == {
        "namespace": "team-a",
        "group": "coordination.k8s.io",
        "resource": "leases",
        "verb": "patch",
    }


def test_the_checks_are_every_permission_of_the_attempt_role() -> None:
    asked = {(p.group, p.resource, p.verb) for p in ATTEMPT_PERMISSIONS}
    granted = {
        (group, resource, verb)
        for rule in ATTEMPT_POD_RULES
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert asked == granted
    assert {"patch runs/status", "create checkpoints", "patch leases"} <= {
        str(p) for p in ATTEMPT_PERMISSIONS
    }


def test_the_operator_may_ask() -> None:
    assert Permission("authorization.k8s.io", "localsubjectaccessreviews", "create") in permissions(
        OPERATOR_RULES
    )


def test_an_allowed_account_is_taken_as_allowed_for_a_while() -> None:
    clock = FakeClock()
    allowed = AllowedAccounts(clock)
    assert not allowed.allowed(AGENTS)
    allowed.answered(AGENTS, ())
    clock.advance(ALLOWED_SECONDS - 1)
    assert allowed.allowed(AGENTS)
    assert not allowed.allowed(Account("team-b", "agents"))
    clock.advance(1)
    assert not allowed.allowed(AGENTS)  # asked again: a binding removed meanwhile is seen


def test_a_refused_account_is_asked_again_at_once() -> None:
    clock = FakeClock()
    allowed = AllowedAccounts(clock)
    allowed.answered(AGENTS, ())
    allowed.answered(AGENTS, ("patch runs/status",))
    assert not allowed.allowed(AGENTS)
