"""The watches that fill the operator's cache: one list-then-watch (agentrun.kubewatch) per owned kind
and watched namespace, selected by the API server (labelSelector agentrun.dev/run, and
agentrun.dev/agent=true for the ServiceAccounts attempt Pods may run as), so that no foreign Pod or Lease
of the cluster ever reaches the operator.

Reconciles start only after every collection's first list is in (`synced`), as an informer's consumers
wait for its caches to sync: a Run reconciled before its Attempts and Pods are cached would look as if
they were gone (a retry would start as "initial", a running Pod would pass for a lost one).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any, Final
from urllib.parse import quote

from agentrun.api import AGENT_LABEL, GROUP, RUN_LABEL, VERSION
from agentrun.clock import Clock
from agentrun.core.lease import lease_view
from agentrun.core.pods import pod_view
from agentrun.kubeapi import KubeApi
from agentrun.kubewatch import Event, Listed, reflect
from agentrun.operator.cache import AgentAccounts, Key, OwnedObjects, essentials

log = logging.getLogger("agentrun.operator")
JsonDict = dict[str, Any]

# The kinds a Run owns that the reconciler reads from the cache: kind -> (group, version, plural).
OWNED: Final = {
    "attempts": (GROUP, VERSION, "attempts"),
    "checkpoints": (GROUP, VERSION, "checkpoints"),
    "sideeffects": (GROUP, VERSION, "sideeffects"),
    "pods": ("", "v1", "pods"),
    "leases": ("coordination.k8s.io", "v1", "leases"),
}
# Kinds the cache keeps current that wake no Run: a worker writes a Checkpoint at every step, and the
# operator must not be woken by a step. A decision that needs a Checkpoint the cache does not hold yet (the
# one the Run's pointer names may come before its own event) reads it from the API server
# (operator.reconciler); an index of every Checkpoint is listed (operator.executor); the operator's own
# deletions leave the cache at once (operator.executor) and decide the Run again.
QUIET: Final = frozenset({"checkpoints"})
AGENT_ACCOUNTS: Final = ("", "v1", "serviceaccounts")
AGENT_ACCOUNT_SELECTOR: Final = f"{AGENT_LABEL}=true"


def collection_paths(
    group: str, version: str, plural: str, namespaces: Sequence[str]
) -> list[tuple[str, str | None]]:
    """(path, namespace) to list and watch: one per watched namespace, or the whole cluster (None)."""
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    if not namespaces:
        return [(f"{base}/{plural}", None)]
    return [(f"{base}/namespaces/{quote(ns)}/{plural}", ns) for ns in namespaces]


def news_for_decide(kind: str, previous: JsonDict | None, obj: JsonDict) -> bool:
    """Whether a new version of an owned object can change what `decide` sees. A Lease renewal (only
    renewTime moved) cannot: the cache notes the sighting, and the lease check planned for the Lease's
    expiry judges it again then. Nor can a Pod status update that leaves its PodView as it was
    (conditions, IPs, publishes of an unchanged state). Skipping those saves a reconcile per renewal and
    per such update."""
    if previous is None:
        return True
    if kind == "leases":
        return _lease_terms(previous) != _lease_terms(obj)
    if kind == "pods":
        return pod_view(previous) != pod_view(obj)
    return True


def _lease_terms(lease: JsonDict) -> tuple[Any, ...]:
    view = lease_view(lease)
    return view.holder, view.epoch


class Informers:
    """Feeds `cache` and `accounts`; tells `wake` the key of each Run whose owned objects changed (but for
    the QUIET kinds), and `delivered` of every watch event: its kind and whether it woke a Run."""

    def __init__(
        self,
        api: KubeApi,
        cache: OwnedObjects,
        accounts: AgentAccounts,
        namespaces: Sequence[str],
        *,
        wake: Callable[[Key], None],
        timeout_seconds: int = 300,
        clock: Clock | None = None,
        delivered: Callable[[str, bool], None] | None = None,
    ) -> None:
        self.api, self.cache, self.accounts, self.wake = api, cache, accounts, wake
        self.delivered = delivered
        self.clock = clock
        self.timeout_seconds = timeout_seconds
        self._collections: list[tuple[str | None, str, str, str | None]] = [
            (kind, path, RUN_LABEL, ns)
            for kind, gvp in OWNED.items()
            for path, ns in collection_paths(*gvp, namespaces)
        ] + [
            (None, path, AGENT_ACCOUNT_SELECTOR, ns)
            for path, ns in collection_paths(*AGENT_ACCOUNTS, namespaces)
        ]
        self._pending = len(self._collections)
        self.synced = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Lists and watches every collection; `synced` is set again once each is listed (a restart
        after `stop` lists afresh)."""
        self._pending = len(self._collections)
        self.synced = asyncio.Event()
        for kind, path, selector, ns in self._collections:
            self._tasks.append(
                asyncio.create_task(self._follow(kind, path, selector, ns), name=f"watch {path}")
            )

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def _follow(self, kind: str | None, path: str, selector: str, namespace: str | None) -> None:
        first = True
        # A listing keeps only what the cache keeps of each object, page by page (a restart lists every
        # attempt Pod: whole, 1,600 of them were ~60 MiB at once, and the allocator keeps such a peak).
        keep = functools.partial(essentials, kind) if kind is not None else None
        async for item in reflect(
            self.api,
            path,
            label_selector=selector,
            timeout_seconds=self.timeout_seconds,
            keep=keep,
            clock=self.clock,
        ):
            if isinstance(item, Listed):
                self._listed(kind, item, namespace, first)
                if first:
                    first = False
                    log.info("listed %d %s", len(item.items), path)
                    self._pending -= 1
                    if self._pending == 0:
                        self.synced.set()
            else:
                self._changed(kind, item)
            del item  # not held (a whole listing) while the watch waits for its next event

    def _listed(self, kind: str | None, listed: Listed, namespace: str | None, first: bool) -> None:
        if kind is None:
            self.accounts.replace(listed.items, namespace)
            return
        touched = self.cache.replace(kind, listed.items, listed.resource_version, namespace)
        # The first list precedes every reconcile: each Run's own event queues it.
        if not first and kind not in QUIET:
            for key in touched:
                self.wake(key)

    def _changed(self, kind: str | None, event: Event) -> None:
        if kind is None:  # an account that loses the label leaves the selection: reported DELETED
            (self.accounts.remove if event.type == "DELETED" else self.accounts.put)(event.object)
            self._delivered("serviceaccounts", woke=False)
            return
        woke = self._take(kind, event)
        self._delivered(kind, woke=woke)

    def _take(self, kind: str, event: Event) -> bool:
        """The event into the cache; wakes its Run if the event can change what `decide` sees."""
        if event.type == "DELETED":
            key = self.cache.remove(kind, event.object)
        else:
            key, previous, news = self.cache.take(kind, event.object)
            if not news or not news_for_decide(kind, previous, event.object):
                return False
        if key is None or kind in QUIET:
            return False
        self.wake(key)
        return True

    def _delivered(self, kind: str, *, woke: bool) -> None:
        if self.delivered is not None:
            self.delivered(kind, woke)
