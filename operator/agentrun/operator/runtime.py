"""The operator's one object graph, built at start-up: the API client, the caches, the informers that
fill them, the work queue, the reconciler and its executor, metrics and tracing. kopf delivers the Run
events (and keeps the peering); everything else is here, with nothing held at module level."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any
from wsgiref.simple_server import WSGIServer

from agentrun.clock import Clock
from agentrun.core.identity import Account
from agentrun.kubeapi import KubeApi
from agentrun.operator import metrics
from agentrun.operator.cache import AgentAccounts, OwnedObjects
from agentrun.operator.informers import Informers
from agentrun.operator.reconciler import Reconciler
from agentrun.operator.run_cache import RunCache
from agentrun.operator.settings import OperatorSettings
from agentrun.tracing import Tracing

log = logging.getLogger("agentrun.operator")
JsonDict = dict[str, Any]


class Runtime:
    def __init__(
        self,
        api: KubeApi,
        config: OperatorSettings,
        namespaces: Sequence[str] = (),
        *,
        operator_account: Account | None = None,
        tracing: Tracing | None = None,
        operator_metrics: metrics.OperatorMetrics = metrics.METRICS,
        clock: Clock,
    ) -> None:
        self.api, self.config, self.clock = api, config, clock
        self.tracing = tracing or Tracing("agentrun-operator", {})
        self.cache = OwnedObjects(clock, on_put=operator_metrics.cached)
        self.runs = RunCache()
        self.accounts = AgentAccounts()
        self.reconciler = Reconciler(
            api,
            self.cache,
            workers=config.workers,
            metrics=operator_metrics,
            runs=self.runs,
            accounts=self.accounts,
            operator_account=operator_account,
            tracing=self.tracing,
            clock=clock,
        )
        self.informers = Informers(
            api,
            self.cache,
            self.accounts,
            namespaces,
            wake=self.reconciler.wake,
            timeout_seconds=config.watch_timeout_seconds,
        )
        self._task: asyncio.Task[None] | None = None
        self._metrics_server: WSGIServer | None = None

    def start(self) -> None:
        """Starts the informers; the reconcile workers start once every cache has synced."""
        self.informers.start()
        self._task = asyncio.create_task(self._reconcile_when_synced(), name="reconciler")
        self._metrics_server = metrics.serve(self.config.metrics_port)

    async def _reconcile_when_synced(self) -> None:
        started = self.clock.monotonic()
        await self.informers.synced.wait()
        log.info("caches synced in %.1fs: %s", self.clock.monotonic() - started, self.cache.size())
        await self.reconciler.run()

    def run_event(self, event: JsonDict) -> None:
        """A watch event of a Run, as kopf delivers it (type None: found by kopf's listing)."""
        body = event["object"]
        if event.get("type") == "DELETED":
            self.reconciler.forget(self.runs.key_of(body))
        else:
            self.reconciler.run_seen(body)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
        await self.informers.stop()
        if self._metrics_server:
            await asyncio.to_thread(self._metrics_server.shutdown)
            self._metrics_server.server_close()
        await asyncio.to_thread(self.tracing.shutdown)
        self.api.close()
