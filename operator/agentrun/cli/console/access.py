"""What the user may see and do, as the API server's RBAC says (SelfSubjectAccessReview).

Only to decide which controls to show: the API server still judges every write itself, so a control
shown by mistake would be refused, and a hidden one changes nothing about what the user may do.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentrun.api import GROUP
from agentrun.clock import Clock
from agentrun.kubeapi import ApiError, KubeApi
from agentrun.kubewatch import list_all

REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
CACHE_SECONDS = 60.0


async def allowed(
    api: KubeApi, verb: str, resource: str, namespace: str | None, subresource: str | None = None
) -> bool:
    attributes: dict[str, Any] = {"verb": verb, "group": GROUP, "resource": resource}
    if namespace:
        attributes["namespace"] = namespace
    if subresource:
        attributes["subresource"] = subresource
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes},
    }
    try:
        answer = await api.create(REVIEWS, review)
    except ApiError:
        return False
    return bool((answer.get("status") or {}).get("allowed"))


async def may_act(api: KubeApi, namespace: str) -> dict[str, bool]:
    """Which kinds of control the user may send in a namespace."""
    runs, effects = await asyncio.gather(
        allowed(api, "patch", "runs", namespace),
        allowed(api, "patch", "sideeffects", namespace, "status"),
    )
    return {"runs": runs, "effects": effects}


class Permissions:
    """may_act per namespace, asked again after CACHE_SECONDS (RBAC may change while the console runs)."""

    def __init__(self, api: KubeApi, clock: Clock) -> None:
        self.api, self.clock = api, clock
        self._known: dict[str, tuple[float, dict[str, bool]]] = {}

    async def of(self, namespaces: list[str]) -> dict[str, dict[str, bool]]:
        now = self.clock.monotonic()
        stale = [ns for ns in namespaces if ns not in self._known or now - self._known[ns][0] > CACHE_SECONDS]
        answers = await asyncio.gather(*(may_act(self.api, ns) for ns in stale))
        for ns, answer in zip(stale, answers, strict=True):
            self._known[ns] = (now, answer)
        return {ns: self._known[ns][1] for ns in namespaces}


async def scopes(api: KubeApi, asked: list[str] | None, context_namespace: str) -> list[str | None]:
    """The namespaces to watch: those asked for; else all (one watch) when the user may list Runs
    cluster-wide; else the namespaces the user may list (and list Runs in); else the context's."""
    if asked:
        return list(dict.fromkeys(asked))
    if await allowed(api, "list", "runs", None) and await allowed(api, "watch", "runs", None):
        return [None]
    try:
        listed = await list_all(api, "/api/v1/namespaces")
    except ApiError:
        return [context_namespace]
    names = sorted(str((n.get("metadata") or {}).get("name")) for n in listed.items)
    may = await asyncio.gather(*(allowed(api, "list", "runs", ns) for ns in names))
    found: list[str | None] = [ns for ns, ok in zip(names, may, strict=True) if ok]
    return found or [context_namespace]
