"""The operator's one object graph, built at start-up on one Clock: the API client, the caches, the
informers that fill them, the lease expiry, the work queue, the executor and its observers, the
reconciler, metrics and tracing. kopf delivers the Run events (and keeps the peering); everything else is
here, with nothing held at module level and nothing built behind a default.

With peering, the runtime acts only while kopf would (agentrun.operator.peering): a replica standing by
runs no informer, no reconcile worker, no timer and no notification sender (the Runs kopf still hands
over are only noted). Taking over is a full resync: the caches are listed again and every Run known is
reconciled, as at a start."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, Protocol
from wsgiref.simple_server import WSGIServer

from agentrun.clock import Clock
from agentrun.core.identity import Account
from agentrun.core.peering import Standing
from agentrun.kubeapi import KubeApi
from agentrun.operator import fork, metrics
from agentrun.operator.archive import Archiver, ArchiveRetention
from agentrun.operator.attempt_role import AttemptRoleChecks
from agentrun.operator.blobrestore import RestoreMetrics, StateRestorer
from agentrun.operator.cache import AgentAccounts, Key, OwnedObjects
from agentrun.operator.collector import build_collector
from agentrun.operator.executor import Executor, PhaseLog
from agentrun.operator.informers import Informers
from agentrun.operator.lease import LeaseExpiry
from agentrun.operator.notifications import Notifier, namespace_labels, refusal_event
from agentrun.operator.peering import PeeringStanding
from agentrun.operator.reconciler import Reconciler
from agentrun.operator.run_cache import RunCache
from agentrun.operator.settings import OperatorSettings
from agentrun.operator.spans import RunSpans
from agentrun.operator.store_credentials import StoreCredentials
from agentrun.operator.store_principals import NamespacePrincipals
from agentrun.operator.storemetrics import StoreMetrics
from agentrun.operator.workqueue import WorkQueue
from agentrun.statestore.operatorstore import OperatorStore
from agentrun.tracing import Tracing

log = logging.getLogger("agentrun.operator")
JsonDict = dict[str, Any]


class Activity(Protocol):
    """Something that works on its own (senders, collectors, timers of its own): it runs only while the
    replica acts. start() begins it; stop() ends what it does, keeping what a start again needs."""

    def start(self) -> None: ...

    async def stop(self) -> None: ...


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
        identity: str,
    ) -> None:
        """identity: this replica's name among its peers (the one kopf is given)."""
        self.api, self.config, self.clock, self.tracing = api, config, clock, tracing
        self.metrics = operator_metrics
        self.state_store = open_state_store(config, StoreMetrics(operator_metrics.registry))
        self.cache = OwnedObjects(clock, on_put=operator_metrics.cached)
        self.runs = RunCache()
        self.archiver = (
            Archiver(self.state_store, clock, operator_metrics.registry, alive=self.runs.__contains__)
            if self.state_store
            else None
        )
        self.accounts = AgentAccounts()
        self.leases = LeaseExpiry(self.cache, clock)
        self.queue: WorkQueue[Key] = WorkQueue(clock, lease_due=self.leases.due)
        self.spans = RunSpans(tracing, clock)
        self.store_credentials = StoreCredentials.for_settings(api, clock, config)
        restorer = (
            StateRestorer(self.state_store, metrics=RestoreMetrics(operator_metrics.registry))
            if self.state_store is not None
            else None
        )
        self.executor = Executor(
            api,
            self.cache,
            clock=clock,
            runs=self.runs,
            observers=(operator_metrics, self.spans, PhaseLog()),
            archiver=self.archiver,
            state_store=self.state_store,
            store_credentials=self.store_credentials,
            restorer=restorer,
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
            store_credentials=self.store_credentials,
            default_ttl_seconds=config.ttl_seconds_after_finished,
            has_store=self.state_store is not None,
            store_mode=config.state_store_mode,
            archives=fork.archives_in(self.state_store),
        )
        self.informers = Informers(
            api,
            self.cache,
            self.accounts,
            namespaces,
            wake=self.reconciler.wake,
            timeout_seconds=config.watch_timeout_seconds,
            clock=clock,
            delivered=operator_metrics.watch_event,
        )
        self.notifier = Notifier(
            config,
            clock=clock,
            namespace_labels=namespace_labels(api, clock),
            record_refusal=refusal_event(api, clock),
        )
        self.collector = build_collector(
            api, self.state_store, config, namespaces, clock=clock, registry=operator_metrics.registry
        )
        # What runs only while this replica acts, beside the informers and the reconcile workers: a new
        # sender, collector or timer of its own is added here (built on the runtime's clock).
        self.activities: list[Activity] = [self.notifier, *([self.collector] if self.collector else [])]
        if self.archiver is not None and config.archive_retention_seconds is not None:
            self.activities.append(ArchiveRetention(self.archiver, config.archive_retention_seconds))
        if self.store_credentials.bundled is not None:  # the namespaces' principals on the bundled server
            self.activities.append(
                NamespacePrincipals(
                    api,
                    self.store_credentials,
                    self.accounts,
                    clock=clock,
                    interval_seconds=config.state_store_principal_sweep_seconds,
                    namespaces=namespaces,
                    synced=lambda: self.informers.synced,
                )
            )
        self.peering = (
            PeeringStanding(
                api,
                name=config.peering,
                namespaces=namespaces,
                identity=identity,
                priority=config.priority,
                clock=clock,
                flip=self._flip,
                timeout_seconds=config.watch_timeout_seconds,
            )
            if config.peering
            else None
        )
        self.active = False
        self._task: asyncio.Task[None] | None = None
        self._metrics_server: WSGIServer | None = None

    def start(self) -> None:
        """Acts at once when standalone; with peering, once the peering objects say this replica may."""
        self._metrics_server = metrics.serve(self.config.metrics_port, self.metrics.registry)
        if self.peering is None:
            self._activate()
        else:
            log.info("standing by until the peering %s is read", self.config.peering)
            self.peering.start()

    async def _flip(self, standing: Standing) -> None:
        """A new standing among the peers: logged once it holds (a replica says it stands by only once
        nothing of it runs any more)."""
        if standing.active and not self.active:
            self._activate()
        elif not standing.active:
            await self._stand_by()
        log.info("%s: %s", "active" if standing.active else "standing by", standing.reason)

    def _activate(self) -> None:
        """Starts the informers (a fresh listing) and queues every Run known; the reconcile workers
        start once every cache has synced."""
        self.active = True
        self.metrics.active.set(1)
        self.reconciler.resync()
        self.informers.start()
        for activity in self.activities:
            activity.start()
        self._task = asyncio.create_task(self._reconcile_when_synced(), name="reconciler")

    async def _stand_by(self) -> None:
        """Stops everything that reads or writes on its own: workers (a reconcile under way is cancelled,
        as if the process had stopped), timers, informers and the activities (notification senders)."""
        if not self.active:
            return
        self.active = False
        self.metrics.active.set(0)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self.queue.pause()
        await self.informers.stop()
        for activity in self.activities:
            await activity.stop()
        self.reconciler.stand_by()

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
        if self.peering is not None:
            await self.peering.stop()
        await self._stand_by()
        if self._metrics_server:
            await asyncio.to_thread(self._metrics_server.shutdown)
            self._metrics_server.server_close()
        await asyncio.to_thread(self.tracing.shutdown)
        self.api.close()


def open_state_store(config: OperatorSettings, metrics: StoreMetrics) -> OperatorStore | None:
    """The operator's own client of the state store, or None when none is configured. Its credentials
    come from the operator's environment (the operator alone may delete: the collector, compaction and
    archives); attempt Pods get their namespace's own credentials instead (core.pods.StateStorePodEnv)."""
    if config.state_store_url is None:
        return None
    return OperatorStore.from_url(config.state_store_url, observer=metrics.observe)
