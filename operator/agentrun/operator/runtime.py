"""The operator's one object graph, built at start-up: the API client, the caches, the informers that
fill them, the work queue, the reconciler and its executor, metrics and tracing. kopf delivers the Run
events (and keeps the peering); everything else is here, with nothing held at module level."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any
from wsgiref.simple_server import WSGIServer

from agentrun.core.identity import Account
from agentrun.kubeapi import KubeApi
from agentrun.operator import metrics
from agentrun.operator.cache import AgentAccounts, OwnedObjects
from agentrun.operator.informers import Informers
from agentrun.operator.notifier import Notifier, SystemClock, namespace_labels, refusal_event
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
    ) -> None:
        self.api, self.config = api, config
        self.tracing = tracing or Tracing("agentrun-operator", {})
        self.cache = OwnedObjects(on_put=operator_metrics.cached)
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
        )
        self.informers = Informers(
            api,
            self.cache,
            self.accounts,
            namespaces,
            wake=self.reconciler.wake,
            timeout_seconds=config.watch_timeout_seconds,
        )
        clock = SystemClock()
        self.notifier = Notifier(
            config,
            clock=clock,
            namespace_labels=namespace_labels(api, clock),
            record_refusal=refusal_event(api, clock),
        )
        self._task: asyncio.Task[None] | None = None
        self._metrics_server: WSGIServer | None = None

    def start(self) -> None:
        """Starts the informers; the reconcile workers start once every cache has synced."""
        self.informers.start()
        self.notifier.start()
        self._task = asyncio.create_task(self._reconcile_when_synced(), name="reconciler")
        self._metrics_server = metrics.serve(self.config.metrics_port)

    async def _reconcile_when_synced(self) -> None:
        started = time.monotonic()
        await self.informers.synced.wait()
        log.info("caches synced in %.1fs: %s", time.monotonic() - started, self.cache.size())
        await self.reconciler.run()

    def run_event(self, event: JsonDict) -> None:
        """A watch event of a Run, as kopf delivers it (type None: found by kopf's listing)."""
        body = event["object"]
        if event.get("type") == "DELETED":
            self.reconciler.forget(self.runs.key_of(body))
            self.notifier.forget(body)
        else:
            self.reconciler.run_seen(body)
            self.notifier.observe(body)  # queues only: a notification never holds up a Run

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
        await self.informers.stop()
        await self.notifier.stop()
        if self._metrics_server:
            await asyncio.to_thread(self._metrics_server.shutdown)
            self._metrics_server.server_close()
        await asyncio.to_thread(self.tracing.shutdown)
        self.api.close()
