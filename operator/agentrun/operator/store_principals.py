"""The namespaces' principals on the bundled object store, made when a namespace opts in and taken back
when it is gone (agentrun.core.store_principals decides; this carries it out).

It runs only while the replica acts (an activity of the runtime). Its sweep lists the server's principals
first (its users, and those the namespace buckets' policies name), then the namespaces (a namespace made
after the first listing is not on it, so it is never taken for one that is gone), takes the opted-in ones
from the informers' cache of labelled ServiceAccounts, and carries out the plan: each namespace to
provision gets its bucket, principals and Secrets (operator.store_credentials, idempotent), each one gone
loses its principals.
A sweep runs once the caches are listed, whenever a labelled ServiceAccount appears, changes or goes (a
namespace opting in, or being deleted), and every interval besides: an operator that was down while a
namespace was deleted takes its principals back at its first sweep.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from urllib.parse import quote

from agentrun.clock import Clock
from agentrun.core.store_principals import PrincipalPlan, plan_principals
from agentrun.kubeapi import KubeApi
from agentrun.operator.cache import AgentAccounts
from agentrun.operator.store_credentials import StoreCredentials
from agentrun.operator.sweeps import PeriodicSweep
from agentrun.statestore import StateStoreError

log = logging.getLogger("agentrun.operator")


class NamespacePrincipals:
    """Sweeps (start/stop) every `interval_seconds`, and when `nudge`d; or once on demand (sweep)."""

    def __init__(
        self,
        api: KubeApi,
        credentials: StoreCredentials,
        accounts: AgentAccounts,
        *,
        clock: Clock,
        interval_seconds: float,
        namespaces: Sequence[str] = (),
        synced: Callable[[], asyncio.Event],
    ) -> None:
        """synced: the event set once the informers have listed (the opted-in accounts are known)."""
        assert credentials.bundled is not None, "only the bundled server's principals are administered"
        self.api, self.credentials, self.accounts, self.clock = api, credentials, accounts, clock
        self.namespaces = tuple(namespaces)
        self.synced = synced
        self.provisioned: set[str] = set()
        self._periodic = PeriodicSweep(
            self.sweep,
            name="state-store-principals",
            clock=clock,
            interval_seconds=interval_seconds,
            failed=_failed,
            ready=lambda: self.synced().wait(),
        )
        accounts.on_change(self.nudge)

    @property
    def interval_seconds(self) -> float:
        return self._periodic.interval_seconds

    def nudge(self, namespace: str) -> None:
        """A labelled ServiceAccount of `namespace` appeared, changed or went: a sweep soon."""
        self._periodic.nudge()

    def start(self) -> None:
        """Starts sweeping. What was made is remembered afresh: the first sweep makes every opted-in
        namespace once (a Secret deleted while this replica stood by is made again)."""
        self.provisioned = set()
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()

    async def sweep(self) -> PrincipalPlan:
        """One sweep: the server first, then the namespaces, the plan, carried out."""
        bundled = self.credentials.bundled
        assert bundled is not None
        server = await asyncio.to_thread(bundled.principals)
        existing = await self._existing_namespaces()
        plan = plan_principals(
            server,
            namespaces=existing,
            opted_in=self.accounts.namespaces(),
            provisioned=self.provisioned,
            watched=self.namespaces or None,
        )
        for namespace in sorted(plan.revoke):
            try:
                await self.credentials.take_back(namespace)
            except StateStoreError as error:
                log.warning("cannot take back namespace %s's principals yet: %s", namespace, error)
            self.provisioned.discard(namespace)
        for namespace in sorted(plan.provision):
            if await self.credentials.provision(namespace):
                self.provisioned.add(namespace)
        if plan.revoke or plan.provision:
            log.info(
                "state store principals: %d namespaces made, %d taken back",
                len(plan.provision),
                len(plan.revoke),
            )
        return plan

    async def _existing_namespaces(self) -> set[str]:
        """The namespaces that exist and are not being deleted: of the watched ones, each read; else the
        cluster's, listed."""
        if self.namespaces:
            found = [await self.api.get(f"/api/v1/namespaces/{quote(n)}") for n in self.namespaces]
            items = [n for n in found if n is not None]
        else:
            items = [item async for page in self.api.list_pages("/api/v1/namespaces") for item in page]
        return {
            str(item["metadata"]["name"])
            for item in items
            if not (item.get("metadata") or {}).get("deletionTimestamp")
        }


def _failed(error: Exception) -> None:
    """A sweep that failed: the next sweep tries again."""
    log.warning("state store principals: sweep failed: %s", str(error)[:600])
