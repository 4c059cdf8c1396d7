"""The operator's one object graph, built at start-up on one Clock: the API client, the caches, the
informers that fill them, the lease expiry, the work queue, the executor and its observers, the
reconciler, metrics and tracing. kopf delivers the Run events (and keeps the peering); everything else is
here, with nothing held at module level and nothing built behind a default."""

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
from agentrun.operator.attempt_role import AttemptRoleChecks
from agentrun.operator.cache import AgentAccounts, Key, OwnedObjects
from agentrun.operator.executor import Executor, PhaseLog
from agentrun.operator.expiry import LeaseExpiry
from agentrun.operator.informers import Informers
from agentrun.operator.notifier import Notifier, namespace_labels, refusal_event
from agentrun.operator.reconciler import Reconciler
from agentrun.operator.run_cache import RunCache
from agentrun.operator.settings import OperatorSettings
from agentrun.operator.spans import RunSpans
from agentrun.operator.storemetrics import StoreMetrics
from agentrun.operator.workqueue import WorkQueue
from agentrun.statestore import BlobStore
from agentrun.tracing import Tracing

log = logging.getLogger("agentrun.operator")
JsonDict = dict[str, Any]


class Runtime:
    """Builds every collaborator once, at start-up, on one Clock: nothing is made behind a default."""

    def __init__(
        self,
        api: KubeApi,
        config: OperatorSettings,
        namespaces: Sequence[str] = (),
        *,
        operator_account: Account | None,
        tracing: Tracing,
        operator_metrics: metrics.OperatorMetrics,
        clock: Clock,
    ) -> None:
        self.api, self.config, self.clock, self.tracing = api, config, clock, tracing
        self.metrics = operator_metrics
        self.state_store = open_state_store(config, StoreMetrics(operator_metrics.registry))
        self.cache = OwnedObjects(clock, on_put=operator_metrics.cached)
        self.runs = RunCache()
        self.accounts = AgentAccounts()
        self.leases = LeaseExpiry(self.cache, clock)
        self.queue: WorkQueue[Key] = WorkQueue(clock, lease_due=self.leases.due)
        self.spans = RunSpans(tracing)
        self.executor = Executor(
            api,
            self.cache,
            clock=clock,
            runs=self.runs,
            observers=(operator_metrics, self.spans, PhaseLog()),
            state_store=self.state_store,
        )
        self.reconciler = Reconciler(
            api,
            cache=self.cache,
            runs=self.runs,
            accounts=self.accounts,
            roles=AttemptRoleChecks(api, clock),
            queue=self.queue,
            executor=self.executor,
            leases=self.leases,
            metrics=operator_metrics,
            spans=self.spans,
            clock=clock,
            operator_account=operator_account,
            workers=config.workers,
            state_store=self.state_store is not None,
        )
        self.informers = Informers(
            api,
            self.cache,
            self.accounts,
            namespaces,
            wake=self.reconciler.wake,
            timeout_seconds=config.watch_timeout_seconds,
        )
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
        self._metrics_server = metrics.serve(self.config.metrics_port, self.metrics.registry)

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
            self.notifier.forget(body)
        else:
            self.reconciler.run_seen(body)
            self.notifier.observe(body)  # queues only: a notification never holds up a Run

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
        self.queue.stop()
        await self.informers.stop()
        await self.notifier.stop()
        if self._metrics_server:
            await asyncio.to_thread(self._metrics_server.shutdown)
            self._metrics_server.server_close()
        await asyncio.to_thread(self.tracing.shutdown)
        self.api.close()


def open_state_store(config: OperatorSettings, metrics: StoreMetrics) -> BlobStore | None:
    """The operator's own client of the state store, or None when none is configured. Its credentials
    come from the operator's environment (the operator alone may delete: the collector, compaction and
    archives); attempt Pods get their namespace's own credentials instead (core.pods.StateStorePodEnv)."""
    if config.state_store_url is None:
        return None
    return BlobStore.from_url(config.state_store_url, observer=metrics.observe)
