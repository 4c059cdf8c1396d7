"""Reconciling one Run: read it fresh, gather what it owns from the cache, decide, write."""

from __future__ import annotations

import asyncio
import datetime
import logging
import time

from agentrun.api import Attempt, Checkpoint, Run, SideEffect, lease_name
from agentrun.core.lease import lease_view, seconds_until_expiry
from agentrun.core.pods import pod_view
from agentrun.core.runs import World, decide
from agentrun.kubeapi import ApiError, KubeApi
from agentrun.operator import logs
from agentrun.operator.cache import Key, OwnedObjects
from agentrun.operator.executor import Executor, Superseded
from agentrun.operator.metrics import OperatorMetrics, planned_run_phase
from agentrun.operator.workqueue import WorkQueue

log = logging.getLogger("agentrun.operator")
ERROR_BACKOFF_SECONDS = 2.0


def _fields(key: Key) -> dict[str, str]:
    return {"namespace": key[0], "run": key[1]}


class Reconciler:
    def __init__(
        self, api: KubeApi, cache: OwnedObjects, workers: int = 8, metrics: OperatorMetrics | None = None
    ) -> None:
        self.api = api
        self.cache = cache
        self.queue: WorkQueue[Key] = WorkQueue()
        self.metrics = metrics or OperatorMetrics(registry=None)
        self.executor = Executor(api, cache, self.metrics)
        self.metrics.track(side_effects=lambda: cache.snapshot("sideeffects"), queue_depth=self.queue.__len__)
        self.workers = workers
        self.reconciles = 0

    async def run(self) -> None:
        await asyncio.gather(*(self._worker() for _ in range(self.workers)))

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            started, outcome = time.perf_counter(), "ok"
            try:
                with logs.bound(namespace=key[0], run=key[1]):
                    await self.reconcile(key)
            except Superseded as exc:
                outcome = "superseded"
                log.debug("run %s/%s superseded: %s", *key, exc, extra=_fields(key))
                self.queue.add(key, 0.05)
            except ApiError as exc:
                outcome = "error"
                log.warning("run %s/%s: %s; retrying", *key, exc, extra=_fields(key))
                self.queue.add(key, ERROR_BACKOFF_SECONDS)
            except Exception:
                outcome = "error"
                log.exception("run %s/%s: reconcile failed; retrying", *key, extra=_fields(key))
                self.queue.add(key, ERROR_BACKOFF_SECONDS)
            finally:
                self.metrics.reconciled(outcome, time.perf_counter() - started)
                self.queue.done(key)

    async def reconcile(self, key: Key) -> None:
        namespace, name = key
        self.reconciles += 1
        body = await self.api.get(self.api.custom_path("runs", namespace, name))
        if body is None:
            self.cache.forget_run(key)
            self.queue.forget(key)
            self.metrics.forget_run(key)
            return
        run = Run.model_validate(body)
        self.metrics.run_seen(key, run.status.phase)
        attempts = {
            a.spec.number: a for a in (Attempt.model_validate(o) for o in self.cache.of("attempts", key))
        }
        pods = {v.name: v for v in (pod_view(o) for o in self.cache.of("pods", key))}
        lease_obj = next(
            (o for o in self.cache.of("leases", key) if o["metadata"]["name"] == lease_name(name)), None
        )
        lease = lease_view(lease_obj) if lease_obj else None
        expires_in = None
        if lease is not None:
            sighting = self.cache.sighting(namespace, lease_name(name))
            started = self.cache.running_seen(namespace, lease.holder) if lease.holder else None
            expires_in = seconds_until_expiry(sighting, lease.duration_seconds, time.monotonic(), started)
        world = World(
            run=run,
            attempts=attempts,
            pods=pods,
            lease=lease,
            now=datetime.datetime.now(datetime.UTC),
            lease_expires_in=expires_in,
            side_effects=[SideEffect.model_validate(o) for o in self.cache.of("sideeffects", key)],
            checkpoints=[Checkpoint.model_validate(o) for o in self.cache.of("checkpoints", key)],
        )
        plan = decide(world)
        await self.executor.execute(plan, run)
        self.metrics.run_seen(key, planned_run_phase(plan) or run.status.phase)
        if plan.requeue_after is not None:
            self.queue.add(key, plan.requeue_after)
