"""The operator's pre-flight of the attempt role (agentrun.operator.attempt_role): what it asks the API
server, derived from the one source of the attempt role's rules, and how long an answer is kept."""

from __future__ import annotations

import asyncio

import pytest

from agentrun.core.identity import Account
from agentrun.operator.attempt_role import (
    ALLOWED_SECONDS,
    ATTEMPT_PERMISSIONS,
    AllowedAccounts,
    InFlight,
    review,
)
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


def test_the_looks_at_an_account_while_it_is_asked_share_one_question() -> None:
    """A burst of new Runs (one reconcile per worker at once) asks about their account once, not once
    per worker; a look after the answer asks anew (a refused account is asked again at once)."""
    asked: list[Account] = []

    async def main() -> tuple[list[tuple[str, ...]], tuple[str, ...]]:
        flight: InFlight[Account, tuple[str, ...]] = InFlight()
        release, both_asked = asyncio.Event(), asyncio.Event()

        async def ask(account: Account) -> tuple[str, ...]:
            asked.append(account)
            if len(asked) == 2:
                both_asked.set()
            await release.wait()
            return ("patch runs/status",)

        looks = [asyncio.ensure_future(flight.once(AGENTS, lambda: ask(AGENTS))) for _ in range(8)]
        other = asyncio.ensure_future(
            flight.once(Account("team-b", "agents"), lambda: ask(Account("team-b", "agents")))
        )
        await both_asked.wait()
        release.set()
        answers = list(await asyncio.gather(*looks))
        await other
        again = await flight.once(AGENTS, lambda: ask(AGENTS))
        return answers, again

    answers, again = asyncio.run(main())
    assert answers == [("patch runs/status",)] * 8
    assert again == ("patch runs/status",)
    assert asked == [AGENTS, Account("team-b", "agents"), AGENTS]


def test_an_error_reaches_every_look_and_a_cancelled_look_leaves_the_question_to_the_others() -> None:
    async def main() -> tuple[int | BaseException, bool, int]:
        flight: InFlight[str, int] = InFlight()
        release, started = asyncio.Event(), asyncio.Event()
        calls = 0

        async def ask() -> int:
            nonlocal calls
            calls += 1
            started.set()
            await release.wait()
            raise RuntimeError("the API server did not answer")

        first = asyncio.ensure_future(flight.once("k", ask))
        second = asyncio.ensure_future(flight.once("k", ask))
        await started.wait()
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        release.set()
        error = (await asyncio.gather(second, return_exceptions=True))[0]
        return error, first.cancelled(), calls

    error, cancelled, calls = asyncio.run(main())
    assert isinstance(error, RuntimeError) and cancelled and calls == 1


@pytest.mark.parametrize("looks", [1, 3])
def test_a_question_answered_is_not_kept_in_flight(looks: int) -> None:
    async def main() -> list[int]:
        flight: InFlight[str, int] = InFlight()
        calls = 0

        async def count() -> int:
            nonlocal calls
            calls += 1
            return calls

        return [await flight.once("k", count) for _ in range(looks)]

    assert asyncio.run(main()) == list(range(1, looks + 1))  # each look after an answer asks anew
