"""Filling the cache before the first reconcile, as an informer waits for its caches to sync.

kopf lists every watched kind on its own once it starts, but Run events and the events of the objects
a Run owns arrive in no particular order: a Run reconciled before its Attempts and Pods are cached looks
as if they were gone (a retry would start as "initial", a running Pod would pass for a lost one). kopf
starts watching only after the startup handlers finish, so listing here first closes that window.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Final
from urllib.parse import quote

from agentrun.api import AGENT_LABEL, GROUP, RUN_LABEL, VERSION
from agentrun.kubeapi import ApiError, KubeApi
from agentrun.operator.cache import AgentAccounts, OwnedObjects

log = logging.getLogger("agentrun.operator")

# The kinds a Run owns that the reconciler reads from the cache: kind -> (group, version, plural).
OWNED: Final = {
    "attempts": (GROUP, VERSION, "attempts"),
    "checkpoints": (GROUP, VERSION, "checkpoints"),
    "sideeffects": (GROUP, VERSION, "sideeffects"),
    "pods": ("", "v1", "pods"),
    "leases": ("coordination.k8s.io", "v1", "leases"),
}
# The ServiceAccounts attempt Pods may run as (agentrun.core.identity), listed and watched by label.
AGENT_ACCOUNTS: Final = ("", "v1", "serviceaccounts")
AGENT_ACCOUNT_SELECTOR: Final = f"{AGENT_LABEL}=true"
RETRY_SECONDS: Final = 1.0
LOG_EVERY_SECONDS: Final = 10.0


def collection_paths(group: str, version: str, plural: str, namespaces: Sequence[str]) -> list[str]:
    """The paths to list: one per watched namespace, or the whole cluster when none is named."""
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    if not namespaces:
        return [f"{base}/{plural}"]
    return [f"{base}/namespaces/{quote(namespace)}/{plural}" for namespace in namespaces]


async def fill(
    api: KubeApi, cache: OwnedObjects, namespaces: Sequence[str], accounts: AgentAccounts | None = None
) -> dict[str, int]:
    """Lists every object a Run owns (labelled with its Run) into the cache, and the opted-in
    ServiceAccounts into `accounts`; returns the count by kind. Retries until the API server answers (it
    may be restarting along with the operator)."""
    counts = dict.fromkeys(OWNED, 0)
    for kind, (group, version, plural) in OWNED.items():
        for collection in collection_paths(group, version, plural, namespaces):
            listing = functools.partial(_list_into, api, cache, collection, kind)
            counts[kind] += await _patiently(listing, collection)
    if accounts is not None:
        counts["serviceaccounts"] = 0
        for collection in collection_paths(*AGENT_ACCOUNTS, namespaces):
            listing = functools.partial(_list_accounts, api, accounts, collection)
            counts["serviceaccounts"] += await _patiently(listing, collection)
    return counts


async def _list_accounts(api: KubeApi, accounts: AgentAccounts, collection: str) -> int:
    listed = 0
    async for page in api.list_pages(collection, AGENT_ACCOUNT_SELECTOR):
        for obj in page:
            accounts.put(obj)
        listed += len(page)
    return listed


async def _list_into(api: KubeApi, cache: OwnedObjects, collection: str, kind: str) -> int:
    listed = 0
    async for page in api.list_pages(collection, RUN_LABEL):
        for obj in page:
            cache.put(kind, obj)
        listed += len(page)
    return listed


async def _patiently(attempt: Callable[[], Awaitable[int]], collection: str) -> int:
    """attempt() until it succeeds (a listing interrupted midway is done again: puts are idempotent)."""
    logged = 0.0
    while True:
        try:
            return await attempt()
        except ApiError as exc:
            if exc.status in (401, 403, 404):
                raise  # no permission, or the API is not served: waiting cannot help
            error: Exception = exc
        except Exception as exc:  # connection refused, reset, timed out: the API server is restarting
            error = exc
        if time.monotonic() - logged >= LOG_EVERY_SECONDS:
            log.warning("listing %s before the first reconcile: %s; retrying", collection, error)
            logged = time.monotonic()
        await asyncio.sleep(RETRY_SECONDS)
