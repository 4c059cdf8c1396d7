"""Reconciling one Run: read it fresh, gather what it owns from the cache, decide, write."""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from typing import Any

from agentrun.api import Attempt, Checkpoint, Run, SideEffect, lease_name
from agentrun.core.identity import Account, account_refusal, agent_account, may_start_pods, owned_by
from agentrun.core.lease import LeaseView, lease_view, seconds_until_expiry
from agentrun.core.plan import Plan
from agentrun.core.pods import pod_view
from agentrun.core.runs import World, decide, fail_squatted
from agentrun.kubeapi import ApiError, KubeApi, unanswered
from agentrun.operator import logs
from agentrun.operator.cache import AgentAccounts, Key, OwnedObjects
from agentrun.operator.executor import Executor, NameSquatted, Superseded
from agentrun.operator.metrics import OperatorMetrics, planned_run_phase
from agentrun.operator.spans import RunSpans
from agentrun.operator.workqueue import WorkQueue
from agentrun.tracing import Tracing, now

log = logging.getLogger("agentrun.operator")
ERROR_BACKOFF_SECONDS = 2.0
JsonDict = dict[str, Any]


def _fields(key: Key) -> dict[str, str]:
    return {"namespace": key[0], "run": key[1]}


class Reconciler:
    def __init__(
        self,
        api: KubeApi,
        cache: OwnedObjects,
        workers: int = 8,
        metrics: OperatorMetrics | None = None,
        *,
        accounts: AgentAccounts | None = None,
        operator_account: Account | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.api = api
        self.cache = cache
        self.accounts = accounts or AgentAccounts()
        self.operator_account = operator_account
        self.queue: WorkQueue[Key] = WorkQueue()
        self.metrics = metrics or OperatorMetrics(registry=None)
        self.executor = Executor(
            api, cache, self.metrics, RunSpans(tracing or Tracing("agentrun-operator", {}))
        )
        self.metrics.track(side_effects=lambda: cache.snapshot("sideeffects"), queue_depth=self.queue.__len__)
        self.workers = workers
        self.reconciles = 0
        self._lease_checks: dict[Key, asyncio.TimerHandle] = {}
        # The uid and spec.lease.durationSeconds of each Run, as last read: the expiry check between
        # reconciles reads no Run, and never the Lease's own leaseDurationSeconds (its holder may write it).
        self._runs: dict[Key, tuple[str, int]] = {}

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
            except Exception as exc:
                outcome = "error"
                if unanswered(exc):  # the API server restarting: a line, not a traceback per Run
                    log.warning(
                        "run %s/%s: the API server did not answer (%s); retrying",
                        *key,
                        exc,
                        extra=_fields(key),
                    )
                else:
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
            self.forget(key)
            return
        run = Run.model_validate(body)
        self.metrics.run_seen(key, run.status.phase)
        self._runs[key] = (str(run.metadata.uid), run.spec.lease.duration_seconds)
        world = await self._world(key, run)
        try:
            plan = decide(world)
            await self._execute(plan, run)
        except NameSquatted as squat:
            # Someone else's object holds a name this Run needs: fail the Run rather than adopt it. The
            # earlier writes of the plan moved the Run on: decide on it as it is now.
            body = await self.api.get(self.api.custom_path("runs", namespace, name))
            if body is None:
                return
            run = Run.model_validate(body)
            plan = fail_squatted(await self._world(key, run), squat.message)
            await self._execute(plan, run)
        self.metrics.run_seen(key, planned_run_phase(plan) or run.status.phase)
        if plan.requeue_after is not None:
            self.queue.add(key, plan.requeue_after)
        self._check_lease_in(key, plan.lease_expires_in)

    async def _execute(self, plan: Plan, run: Run) -> None:
        """Carries the plan out; a plan that writes is a span of the Run's trace (what was decided)."""
        started, error = now(), None
        try:
            await self.executor.execute(plan, run)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self.executor.spans.decided(run, plan, started, error)

    async def _world(self, key: Key, run: Run) -> World:
        """What decide sees: only what this Run owns. An object that merely carries the Run's label (or
        a Run of the same name that was deleted) is not the Run's, and never adopted."""
        uid = str(run.metadata.uid)
        attempts = {
            a.spec.number: a
            for a in (Attempt.model_validate(o) for o in self._owned("attempts", key, uid, controller=True))
        }
        pods = {v.name: v for v in (pod_view(o) for o in self._owned("pods", key, uid, controller=True))}
        lease = self._cached_lease(key)
        return World(
            run=run,
            attempts=attempts,
            pods=pods,
            lease=lease,
            now=datetime.datetime.now(datetime.UTC),
            lease_expires_in=self._lease_expires_in(key, lease),
            side_effects=[SideEffect.model_validate(o) for o in self._owned("sideeffects", key, uid)],
            checkpoints=[Checkpoint.model_validate(o) for o in self._owned("checkpoints", key, uid)],
            account_refusal=await self._account_refusal(run) if may_start_pods(run) else None,
        )

    def _owned(self, kind: str, key: Key, uid: str, *, controller: bool = False) -> list[JsonDict]:
        return [o for o in self.cache.of(kind, key) if owned_by(o, uid, controller=controller)]

    async def _account_refusal(self, run: Run) -> str | None:
        """Whether attempt Pods may run as the Run's ServiceAccount: the opted-in accounts come from the
        cache; a miss is read (a label set a moment ago must not be refused for the watch's lag)."""
        account = agent_account(run)
        labels = self.accounts.labels(account.namespace, account.name)
        if labels is None:
            found = await self.api.get(self.api.core_path("serviceaccounts", account.namespace, account.name))
            if found is not None:
                labels = dict((found.get("metadata") or {}).get("labels") or {})
        return account_refusal(account, labels, self.operator_account)

    def forget(self, key: Key) -> None:
        """The Run is gone: drop what this operator keeps about it."""
        self.cache.forget_run(key)
        self.queue.forget(key)
        self.metrics.forget_run(key)
        self._check_lease_in(key, None)
        self._runs.pop(key, None)

    # ---- the Lease's expiry, looked at without reading the Run ---------------------------------------

    def _cached_lease(self, key: Key) -> LeaseView | None:
        name, (uid, _) = lease_name(key[1]), self._runs.get(key, ("", 0))
        lease = next(
            (
                o
                for o in self.cache.of("leases", key)
                if o["metadata"]["name"] == name and owned_by(o, uid, controller=True)
            ),
            None,
        )
        return lease_view(lease) if lease else None

    def _lease_expires_in(self, key: Key, lease: LeaseView | None) -> float | None:
        if lease is None or key not in self._runs:
            return None
        duration = self._runs[key][1]
        sighting = self.cache.sighting(key[0], lease_name(key[1]))
        started = self.cache.running_seen(key[0], lease.holder) if lease.holder else None
        return seconds_until_expiry(sighting, duration, time.monotonic(), started)

    def _check_lease_in(self, key: Key, seconds: float | None) -> None:
        """(Re)arms the one expiry check of this Run; None disarms it."""
        if timer := self._lease_checks.pop(key, None):
            timer.cancel()
        if seconds is not None:
            loop = asyncio.get_running_loop()
            self._lease_checks[key] = loop.call_later(seconds, self._lease_check, key)

    def _lease_check(self, key: Key) -> None:
        """The holder's Lease was due to expire. Renewed since (as a healthy worker does every
        renewSeconds): wait for the new expiry, no reconcile. Otherwise the Run is decided again, which
        judges the expiry. A change of holder or epoch queues the Run through its watch event anyway."""
        self._lease_checks.pop(key, None)
        left = self._lease_expires_in(key, self._cached_lease(key))
        if left is not None and left > 0:
            self._check_lease_in(key, left + 0.05)
        else:
            self.queue.add(key)
