"""Reconciling one Run: take it and what it owns from the cache, decide, write.

The cached Run (the last watch event or our own write's response) may be behind the API server, e.g. the
worker's commit may have landed since. Each Plan states from which view it may be written
(core.plan.Consistency, decided in core): one that needs a freshly read Run is written only after the
Run was read, and if the Run moved, decided again on what was read. A Run with no cached view, or one
whose write just lost a race, is read too.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

from agentrun.api import FINISHED_ATTEMPT_PHASES, Attempt, Checkpoint, Run, SideEffect, lease_name
from agentrun.clock import Clock
from agentrun.core.identity import Account, account_refusal, agent_account, may_start_pods, owned_by
from agentrun.core.lease import LeaseView, lease_view, seconds_until_expiry
from agentrun.core.plan import Plan
from agentrun.core.pods import pod_view
from agentrun.core.runs import World, decide, fail_squatted
from agentrun.kubeapi import ApiError, KubeApi, unanswered
from agentrun.operator import logs
from agentrun.operator.cache import AgentAccounts, Key, OwnedObjects
from agentrun.operator.executor import Executor, NameSquatted, PhaseLog, Superseded
from agentrun.operator.metrics import OperatorMetrics, planned_run_phase
from agentrun.operator.run_cache import RunCache
from agentrun.operator.spans import RunSpans
from agentrun.operator.workqueue import MAX_DELAY, WorkQueue
from agentrun.tracing import Tracing, now

log = logging.getLogger("agentrun.operator")
JsonDict = dict[str, Any]
LEASE_CHECK_SLACK: Final = 0.05


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
        runs: RunCache | None = None,
        accounts: AgentAccounts | None = None,
        operator_account: Account | None = None,
        tracing: Tracing | None = None,
        clock: Clock,
    ) -> None:
        self.api = api
        self.cache = cache
        self.clock = clock
        # `is None`, not `or`: an empty cache is falsy (it has a length), and a fresh one in its place
        # would never be filled (the informers fill the one they were given).
        self.runs = RunCache() if runs is None else runs
        self.accounts = AgentAccounts() if accounts is None else accounts
        self.operator_account = operator_account
        self.queue: WorkQueue[Key] = WorkQueue(lease_due=self._lease_due)
        self.metrics = metrics or OperatorMetrics(registry=None)
        self.spans = RunSpans(tracing or Tracing("agentrun-operator", {}))
        self.executor = Executor(
            api, cache, clock=clock, runs=self.runs, observers=(self.metrics, self.spans, PhaseLog())
        )
        self.metrics.track(side_effects=lambda: cache.snapshot("sideeffects"), queue_depth=self.queue.__len__)
        self.workers = workers
        self.reconciles = 0
        self._stale: set[Key] = set()  # Runs whose cached view lost a race: read before deciding
        self._refused: dict[Key, str] = {}  # the permanent error last logged for a Run
        # Pods the API server refused to create as invalid, by Run: attempt name -> the refusal. Told to
        # core (World.refused_pods), which decides the Attempt's fate; forgotten once it has ended.
        self._refused_pods: dict[Key, dict[str, str]] = {}
        # The uid and spec.lease.durationSeconds of each Run, as last decided on: the lease check between
        # reconciles reads no Run, and never the Lease's own leaseDurationSeconds (its holder may write it).
        self._leases: dict[Key, tuple[str, int]] = {}

    # ---- what feeds the queue -------------------------------------------------------------------

    def run_seen(self, body: JsonDict) -> None:
        """A watch event of a Run (kopf's): news is cached and queued; the echo of our own write is not."""
        key = RunCache.key_of(body)
        if self.runs.put(body):
            self._stale.discard(key)
            self.queue.add(key)

    def wake(self, key: Key) -> None:
        """Something the Run owns changed. A Run not cached yet is queued by its own event when it comes
        (one of a deleted Run is never queued: its owned objects go with it)."""
        if key in self.runs:
            self.queue.add(key)

    def forget(self, key: Key) -> None:
        """The Run is gone: drop what this operator keeps about it."""
        self.cache.forget_run(key)
        self.runs.remove(key)
        self.queue.forget(key)
        self.metrics.forget_run(key)
        self._leases.pop(key, None)
        self._stale.discard(key)
        self._refused.pop(key, None)
        self._refused_pods.pop(key, None)

    # ---- the workers ----------------------------------------------------------------------------

    async def run(self) -> None:
        await asyncio.gather(*(self._worker() for _ in range(self.workers)))

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            started = self.clock.monotonic()
            with logs.bound(namespace=key[0], run=key[1]):
                outcome = await self._process(key)
            self.metrics.reconciled(outcome, self.clock.monotonic() - started)
            self.queue.done(key)

    async def _process(self, key: Key) -> str:
        """One reconcile and what its outcome asks of the queue; returns the outcome for the metrics."""
        try:
            await self.reconcile(key)
        except Superseded as exc:
            log.debug("run %s/%s superseded: %s", *key, exc, extra=_fields(key))
            self._stale.add(key)
            self.queue.add_rate_limited(key)
            return "superseded"
        except ApiError as exc:
            if exc.permanent:  # the same request would be refused again: say so once, retry rarely
                if self._refused.get(key) != str(exc):
                    self._refused[key] = str(exc)
                    log.error("run %s/%s: %s; not retried before a change", *key, exc, extra=_fields(key))
                self.queue.add(key, MAX_DELAY)
                return "error"
            delay = self.queue.add_rate_limited(key)
            log.warning("run %s/%s: %s; retrying in %.2fs", *key, exc, delay, extra=_fields(key))
            return "error"
        except Exception as exc:
            delay = self.queue.add_rate_limited(key)
            if unanswered(exc):  # the API server restarting: a line, not a traceback per Run
                log.warning(
                    "run %s/%s: the API server did not answer (%s); retrying in %.2fs",
                    *key,
                    exc,
                    delay,
                    extra=_fields(key),
                )
            else:
                log.exception("run %s/%s: reconcile failed; retrying", *key, extra=_fields(key))
            return "error"
        self.queue.succeeded(key)
        self._refused.pop(key, None)
        return "ok"

    async def _read(self, key: Key) -> Run | None:
        """The Run as the API server has it now (and into the cache); None when it is gone."""
        body = await self.api.get(self.api.custom_path("runs", *key))
        if body is None:
            self.forget(key)
            return None
        self.runs.put(body)
        self._stale.discard(key)
        return Run.model_validate(body)

    async def reconcile(self, key: Key) -> None:
        self.reconciles += 1
        cached = None if key in self._stale else self.runs.get(key)
        run = cached if cached is not None else await self._read(key)
        if run is None:
            return
        plan = decide(await self._world(key, run))
        if cached is not None and plan.needs_fresh_run:
            current = await self._read(key)
            if current is None:
                return
            if current.metadata.resource_version != run.metadata.resource_version:
                run = current
                plan = decide(await self._world(key, run))
        try:
            changed = await self._execute(plan, run)
        except NameSquatted as squat:
            # Someone else's object holds a name this Run needs: fail the Run rather than adopt it. The
            # earlier writes of the plan moved the Run on: decide on it as it is now.
            current = await self._read(key)
            if current is None:
                return
            run = current
            plan = fail_squatted(await self._world(key, run), squat.message)
            changed = await self._execute(plan, run)
        self.metrics.run_seen(key, planned_run_phase(plan) or run.status.phase)
        if plan.requeue_after is not None:
            self.queue.add(key, plan.requeue_after)
        self.queue.check_lease_in(key, plan.lease_expires_in)
        if changed:
            # The watch events of these writes are echoes (dropped): decide again on what the writes
            # answered (done() queues the key again once this reconcile ends).
            self.queue.add(key)

    async def _execute(self, plan: Plan, run: Run) -> bool:
        """Carries the plan out; a plan that writes is a span of the Run's trace (what was decided).
        Returns whether it changed an object the operator watches, or observed what core decides on
        (a refused Pod): either way the Run is decided again."""
        started, error = now(), None
        try:
            executed = await self.executor.execute(plan, run)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self.spans.decided(run, plan, started, error)
        if executed.refused_pods:
            key = (str(run.metadata.namespace), str(run.metadata.name))
            self._refused_pods.setdefault(key, {}).update(executed.refused_pods)
        return executed.changed or bool(executed.refused_pods)

    async def _world(self, key: Key, run: Run) -> World:
        """What decide sees: only what this Run owns. An object that merely carries the Run's label (or
        a Run of the same name that was deleted) is not the Run's, and never adopted."""
        uid = str(run.metadata.uid)
        self.metrics.run_seen(key, run.status.phase)
        self._leases[key] = (uid, run.spec.lease.duration_seconds)
        attempts = {
            a.spec.number: a
            for a in (Attempt.model_validate(o) for o in self._owned("attempts", key, uid, controller=True))
        }
        pods = {v.name: v for v in (pod_view(o) for o in self._owned("pods", key, uid, controller=True))}
        lease = self._cached_lease(key)
        refused = self._refused_pods.get(key, {})
        for ended in [a for a in attempts.values() if a.status.phase in FINISHED_ATTEMPT_PHASES]:
            refused.pop(str(ended.metadata.name), None)
        return World(
            run=run,
            attempts=attempts,
            pods=pods,
            lease=lease,
            now=self.clock.now(),
            lease_expires_in=self._lease_expires_in(key, lease),
            side_effects=[SideEffect.model_validate(o) for o in self._owned("sideeffects", key, uid)],
            checkpoints=[Checkpoint.model_validate(o) for o in self._owned("checkpoints", key, uid)],
            account_refusal=await self._account_refusal(run) if may_start_pods(run) else None,
            refused_pods=dict(refused),
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

    # ---- the Lease's expiry, looked at without reading the Run ---------------------------------------

    def _cached_lease(self, key: Key) -> LeaseView | None:
        name, (uid, _) = lease_name(key[1]), self._leases.get(key, ("", 0))
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
        if lease is None or key not in self._leases:
            return None
        duration = self._leases[key][1]
        sighting = self.cache.sighting(key[0], lease_name(key[1]))
        started = self.cache.running_seen(key[0], lease.holder) if lease.holder else None
        return seconds_until_expiry(sighting, duration, self.clock.monotonic(), started)

    def _lease_due(self, key: Key) -> float | None:
        """The holder's Lease was due to expire. Renewed since (as a healthy worker does every
        renewSeconds): the seconds until the new expiry, no reconcile. Otherwise None: the Run is
        decided again, which judges the expiry. A change of holder or epoch queues the Run through its
        watch event anyway."""
        left = self._lease_expires_in(key, self._cached_lease(key))
        return left + LEASE_CHECK_SLACK if left is not None and left > 0 else None
