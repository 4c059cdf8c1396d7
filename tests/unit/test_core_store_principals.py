"""Which namespaces get their principals on the bundled server, and which lose them (core.store_principals):
sets in, actions out."""

from __future__ import annotations

import pytest

from agentrun.core.store_principals import (
    PrincipalPlan,
    ServerPrincipals,
    plan_principals,
    principal_name,
    principal_namespace,
    principals_of,
)
from agentrun.statestore.principals import Access, access_key


def held(*namespaces: str, users: bool = True, granted: bool = True) -> ServerPrincipals:
    names = frozenset().union(*(principals_of(n) for n in namespaces))
    return ServerPrincipals(users=names if users else frozenset(), granted=names if granted else frozenset())


@pytest.mark.parametrize(
    ("name", "namespace"),
    [
        ("agentrun.team-a", "team-a"),
        ("agentrun.team-a.read", "team-a"),
        ("agentrun.read", "read"),  # a namespace called "read"
        ("agentrun.read.read", "read"),
        ("root", None),  # the server's root, an administrator's users: never ours
        ("alice", None),
        ("agentrun.", None),
        ("agentrun..read", None),
        ("agentrun.a.b", None),  # no namespace has a dot
    ],
)
def test_a_principal_names_its_namespace_or_none(name: str, namespace: str | None) -> None:
    assert principal_namespace(name) == namespace


def test_the_store_names_its_principals_as_core_reads_them() -> None:
    assert access_key("team-a", Access.WRITE) == principal_name("team-a") == "agentrun.team-a"
    assert access_key("team-a", Access.READ) == principal_name("team-a", read=True) == "agentrun.team-a.read"


def test_an_opted_in_namespace_is_made_once_and_not_again_while_complete() -> None:
    first = plan_principals(held(), namespaces={"a", "b"}, opted_in={"a"}, provisioned=set())
    assert first == PrincipalPlan(provision=frozenset({"a"}), revoke=frozenset())
    again = plan_principals(held("a"), namespaces={"a", "b"}, opted_in={"a"}, provisioned={"a"})
    assert again == PrincipalPlan(provision=frozenset(), revoke=frozenset())


def test_a_restarted_replica_makes_every_opted_in_namespace_once_even_complete_ones() -> None:
    """Nothing remembered: a Secret deleted meanwhile is made again (the make is idempotent)."""
    plan = plan_principals(held("a"), namespaces={"a"}, opted_in={"a"}, provisioned=set())
    assert plan.provision == {"a"}


@pytest.mark.parametrize("missing", ["users", "granted"])
def test_a_made_namespace_whose_principals_went_from_the_server_is_made_again(missing: str) -> None:
    server = held("a", users=missing != "users", granted=missing != "granted")
    plan = plan_principals(server, namespaces={"a"}, opted_in={"a"}, provisioned={"a"})
    assert plan == PrincipalPlan(provision=frozenset({"a"}), revoke=frozenset())


def test_a_namespace_gone_loses_its_principals_whether_users_or_statements_are_left() -> None:
    server = ServerPrincipals(
        users=frozenset({"agentrun.gone", "agentrun.kept", "agentrun.kept.read", "alice"}),
        granted=frozenset({"agentrun.half.read", "agentrun.kept", "agentrun.kept.read"}),
    )
    plan = plan_principals(server, namespaces={"kept"}, opted_in={"kept"}, provisioned={"kept"})
    assert plan == PrincipalPlan(provision=frozenset(), revoke=frozenset({"gone", "half"}))


def test_a_namespace_being_deleted_is_not_made_and_is_taken_back() -> None:
    """The caller leaves a Terminating namespace out of `namespaces`; its accounts may still be cached."""
    plan = plan_principals(held("going"), namespaces=set(), opted_in={"going"}, provisioned={"going"})
    assert plan == PrincipalPlan(provision=frozenset(), revoke=frozenset({"going"}))


def test_a_namespace_without_a_labelled_account_keeps_its_principals() -> None:
    plan = plan_principals(held("a"), namespaces={"a"}, opted_in=set(), provisioned={"a"})
    assert plan == PrincipalPlan(provision=frozenset(), revoke=frozenset())


def test_an_operator_of_some_namespaces_judges_those_only() -> None:
    """Another namespace's principals may be another operator's (or the server's other users)."""
    server = held("mine", "theirs")
    plan = plan_principals(
        server, namespaces={"other"}, opted_in={"other"}, provisioned=set(), watched={"mine", "other"}
    )
    assert plan == PrincipalPlan(provision=frozenset({"other"}), revoke=frozenset({"mine"}))
