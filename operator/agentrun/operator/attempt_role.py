"""Whether an agents' ServiceAccount may do what an attempt Pod does, asked of the API server.

Before a Pod runs as a ServiceAccount, the operator asks (a LocalSubjectAccessReview in the Run's
namespace: it needs no cluster-wide grant) for every permission the attempt role grants (agentrun.rbac),
so a missing RoleBinding fails the Run with its fix (core.identity.role_refusal) instead of the agent
with a 403. An account found allowed is not asked again for a while; one found refused is asked again
at the next look, so a binding made since is seen at once. The looks at an account made while it is
being asked share that answer (the workers reconciling a burst of new Runs would each ask otherwise:
19 reviews each).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

from agentrun.admission import service_account_user
from agentrun.clock import Clock
from agentrun.core.identity import Account
from agentrun.kubeapi import ApiError, KubeApi
from agentrun.rbac import ATTEMPT_POD_RULES, Permission, permissions

log = logging.getLogger("agentrun.operator")
JsonDict = dict[str, Any]

# How long an account found allowed is taken as allowed (a binding removed meanwhile is seen this late).
ALLOWED_SECONDS = 60.0
ATTEMPT_PERMISSIONS = tuple(permissions(ATTEMPT_POD_RULES))
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def review(account: Account, permission: Permission) -> JsonDict:
    """The LocalSubjectAccessReview that asks whether the account may do `permission` in its namespace,
    as its token would present it (the user and the groups every ServiceAccount is in)."""
    resource, _, subresource = permission.resource.partition("/")
    attributes = {
        "namespace": account.namespace,
        "group": permission.group,
        "resource": resource,
        "verb": permission.verb,
    }
    if subresource:
        attributes["subresource"] = subresource
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "LocalSubjectAccessReview",
        "metadata": {"namespace": account.namespace},
        "spec": {
            "user": service_account_user(account.namespace, account.name),
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{account.namespace}",
                "system:authenticated",
            ],
            "resourceAttributes": attributes,
        },
    }


def review_path(namespace: str) -> str:
    return f"/apis/authorization.k8s.io/v1/namespaces/{namespace}/localsubjectaccessreviews"


class AllowedAccounts:
    """The accounts found allowed, each until its answer is ALLOWED_SECONDS old on the clock."""

    def __init__(self, clock: Clock, seconds: float = ALLOWED_SECONDS) -> None:
        self.clock, self.seconds = clock, seconds
        self._until: dict[Account, float] = {}

    def allowed(self, account: Account) -> bool:
        until = self._until.get(account)
        if until is None:
            return False
        if self.clock.monotonic() >= until:
            del self._until[account]
            return False
        return True

    def answered(self, account: Account, denied: tuple[str, ...]) -> None:
        """An answer: an allowed account is remembered, a refused one forgotten (asked again next time)."""
        if denied:
            self._until.pop(account, None)
        else:
            self._until[account] = self.clock.monotonic() + self.seconds


class InFlight(Generic[K, V]):
    """One question per key at a time: a look made while the key is being asked waits for that answer
    (or its error) instead of asking again; a look after it has been answered asks anew. A waiter
    cancelled does not cancel the question the others wait for."""

    def __init__(self) -> None:
        self._asking: dict[K, asyncio.Future[V]] = {}

    async def once(self, key: K, ask: Callable[[], Awaitable[V]]) -> V:
        asking = self._asking.get(key)
        if asking is None:
            asking = asyncio.ensure_future(ask())
            self._asking[key] = asking
            asking.add_done_callback(lambda done: self._answered(key, done))
        return await asyncio.shield(asking)

    def _answered(self, key: K, done: asyncio.Future[V]) -> None:
        if self._asking.get(key) is done:
            del self._asking[key]
        if not done.cancelled():
            done.exception()  # retrieved: every waiter may have gone (it is raised to those still there)


class AttemptRoleChecks:
    """What of the attempt role an account may not do, as the API server answers now (or recently)."""

    def __init__(self, api: KubeApi, clock: Clock) -> None:
        self.api = api
        self.allowed = AllowedAccounts(clock)
        self._in_flight: InFlight[Account, tuple[str, ...]] = InFlight()
        self._unchecked_said = False

    async def denied(self, account: Account) -> tuple[str, ...]:
        """The attempt role's permissions the account lacks, as "verb resource"; empty when none (or when
        this operator may not ask: it says so once, and Pods start as they did before the check)."""
        if self.allowed.allowed(account):
            return ()
        return await self._in_flight.once(account, lambda: self._ask(account))

    async def _ask(self, account: Account) -> tuple[str, ...]:
        try:
            answers = await asyncio.gather(*(self._may(account, p) for p in ATTEMPT_PERMISSIONS))
        except ApiError as exc:
            if exc.status not in (403, 404):
                raise
            if not self._unchecked_said:
                self._unchecked_said = True
                log.warning(
                    "cannot check the attempt role of agents' ServiceAccounts (%s): grant the operator "
                    "`create localsubjectaccessreviews` (authorization.k8s.io), as its chart does",
                    exc,
                )
            answers = [True] * len(ATTEMPT_PERMISSIONS)
        denied = tuple(str(p) for p, may in zip(ATTEMPT_PERMISSIONS, answers, strict=True) if not may)
        self.allowed.answered(account, denied)
        return denied

    async def _may(self, account: Account, permission: Permission) -> bool:
        answer = await self.api.create(review_path(account.namespace), review(account, permission))
        return bool((answer.get("status") or {}).get("allowed"))
