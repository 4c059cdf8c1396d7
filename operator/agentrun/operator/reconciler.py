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
from collections.abc import Iterable
from typing import Any

from agentrun.api import (
    FINISHED_ATTEMPT_PHASES,
    TERMINAL_PHASES,
    Attempt,
    Checkpoint,
    Run,
    SideEffect,
    StateStoreMode,
)
from agentrun.clock import Clock
from agentrun.core.blobrestore import Restoration, waits_for_restore
from agentrun.core.identity import Account, account_refusal, agent_account, may_start_pods, owned_by
from agentrun.core.plan import DeleteRun, Plan
from agentrun.core.pods import pod_view
from agentrun.core.runs import World, decide
from agentrun.core.runs.grants import reads_refs
from agentrun.kubeapi import ApiError, KubeApi, unanswered
from agentrun.operator import fork, logs
from agentrun.operator.attempt_role import AttemptRoleChecks
from agentrun.operator.cache import HAS_MANAGED_FIELDS, AgentAccounts, Key, OwnedObjects
from agentrun.operator.executor import Executed, Executor, Superseded
from agentrun.operator.lease import LeaseExpiry
from agentrun.operator.metrics import OperatorMetrics, planned_run_phase
from agentrun.operator.run_cache import RunCache
from agentrun.operator.spans import RunSpans
from agentrun.operator.store_credentials import StoreCredentials
from agentrun.operator.workqueue import MAX_DELAY, WorkQueue
from agentrun.statestore import StateStoreError

log = logging.getLogger("agentrun.operator")
JsonDict = dict[str, Any]


def _fields(key: Key) -> dict[str, str]:
    return {"namespace": key[0], "run": key[1]}


class Reconciler:
    """Takes Run keys from the queue, decides on what the caches hold, has the executor write. Its
    collaborators are built by the runtime, all on one Clock."""

    def __init__(
        self,
        api: KubeApi,
        *,
        cache: OwnedObjects,
        runs: RunCache,
        accounts: AgentAccounts,
        roles: AttemptRoleChecks,
        queue: WorkQueue[Key],
        executor: Executor,
        leases: LeaseExpiry,
        metrics: OperatorMetrics,
        spans: RunSpans,
        clock: Clock,
        operator_account: Account | None,
        workers: int,
        store_credentials: StoreCredentials,
        default_ttl_seconds: int | None = None,
        has_store: bool = False,
        store_mode: StateStoreMode | None = None,
        archives: fork.ArchivedSources | None = None,
    ) -> None:
        self.api = api
        self.cache, self.runs, self.accounts, self.roles = cache, runs, accounts, roles
        self.queue, self.executor, self.leases = queue, executor, leases
        self.metrics, self.spans, self.clock = metrics, spans, clock
        self.operator_account = operator_account
        self.store_credentials = store_credentials
        self.metrics.track(side_effects=lambda: cache.snapshot("sideeffects"), queue_depth=self.queue.__len__)
        self.workers = workers
        self.default_ttl_seconds = default_ttl_seconds
        self.has_store = has_store  # told to core: finished Runs' indexes, archives and log tails go there
        self.store_mode = store_mode  # told to core: each phase change says it (status.stateStore)
        self.archives = archives or fork.NoArchives()  # where a deleted fork source is read from
        self.reconciles = 0
        self._stale: set[Key] = set()  # Runs whose cached view lost a race: read before deciding
        self._refused: dict[Key, str] = {}  # the permanent error last logged for a Run
        # Pods the API server refused to create as invalid, by Run: attempt name -> the refusal. Told to
        # core (World.refused_pods), which decides the Attempt's fate; forgotten once it has ended.
        self._refused_pods: dict[Key, dict[str, str]] = {}
        # Runs for which the bundled store refused to make the namespace's credentials (an executed
        # ProvisionStoreCredentials): told to core (World.store_provisioning_refused), which fails the Run;
        # forgotten once the Secret is found or no Pod may start.
        self._provisioning_refused: set[Key] = set()
        # Names a Run needs that an object it does not own holds (name -> kind), found by the executor's
        # creates: told to core (World.squatted), whose NameSquatted rule fails the Run; forgotten once
        # the Run has ended (a retry after the squatter was deleted starts afresh).
        self._squatted: dict[Key, dict[str, str]] = {}
        # What became of the blobs restored for a Run's StateUnverifiable failure (an executed RestoreBlobs),
        # with that failure's message: told to core (World.restorations), whose StateRestore rule records
        # it; forgotten once the Run no longer waits for that failure's restore.
        self._restorations: dict[Key, tuple[str | None, tuple[Restoration, ...]]] = {}
        # The uid of the newest ended Attempt of each Run read fresh from the API server and found
        # without the SDK's statement that it reads references (status.sdkReads): not read again.
        self._undeclared: dict[Key, str] = {}
        # Checkpoints a Run names that the API server did not have when read (World's checkpoints).
        self._absent: dict[Key, set[str]] = {}

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

    def resync(self) -> None:
        """Taking over (a start, or the end of a standby): every Run known is reconciled, level-based."""
        for key in self.runs.known():
            self.queue.add(key)

    def stand_by(self) -> None:
        """This replica stops acting: another one writes the Runs meanwhile, so the cached views are
        read again before they are decided on (a Run kopf hands over later is fresh again)."""
        self._stale.update(self.runs.known())
        self.metrics.forget_runs()  # the active replica counts them

    def forget(self, key: Key) -> None:
        """The Run is gone: drop what this operator keeps about it."""
        self.cache.forget_run(key)
        self.runs.remove(key)
        self.queue.forget(key)
        self.metrics.forget_run(key)
        self.leases.forget(key)
        self._stale.discard(key)
        self._refused.pop(key, None)
        self._refused_pods.pop(key, None)
        self._provisioning_refused.discard(key)
        self._squatted.pop(key, None)
        self._restorations.pop(key, None)
        self._undeclared.pop(key, None)
        self._absent.pop(key, None)

    # ---- the workers ----------------------------------------------------------------------------

    async def run(self) -> None:
        await asyncio.gather(*(self._worker() for _ in range(self.workers)))

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            try:  # cancelled (the replica stands by): the key is done all the same
                started = self.clock.monotonic()
                with logs.bound(namespace=key[0], run=key[1]):
                    outcome = await self._process(key)
                self.metrics.reconciled(outcome, self.clock.monotonic() - started)
            finally:
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
        except StateStoreError as exc:  # an archive not written: the Run is kept, its deletion retried
            delay = self.queue.add_rate_limited(key)
            log.warning("run %s/%s: %s; retrying in %.2fs", *key, exc, delay, extra=_fields(key))
            return "error"
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
        world = await self._world(key, run)
        plan = decide(world)
        if cached is not None and plan.needs_fresh_run:
            current = await self._read(key)
            if current is None:
                return
            if current.metadata.resource_version != run.metadata.resource_version:
                run = current
                world = await self._world(key, run)
                plan = decide(world)
        executed = await self._execute(plan, run, world)
        if executed.squatted:
            # Someone else's object holds a name this Run needs (World.squatted: the table fails the Run
            # rather than adopt it). The earlier writes of the plan moved the Run on: decide on it as it
            # is now.
            current = await self._read(key)
            if current is None:
                return
            run = current
            world = await self._world(key, run)
            plan = decide(world)
            executed = await self._execute(plan, run, world)
        changed = executed.news
        if plan.of(DeleteRun):  # archived and deleted: its DELETED event makes the operator forget it
            return
        self._seen(key, planned_run_phase(plan) or run.status.phase)
        if plan.requeue_after is not None:
            self.queue.add(key, plan.requeue_after)
        self.queue.check_lease_in(key, plan.lease_expires_in)
        if changed:
            # The watch events of these writes are echoes (dropped): decide again on what the writes
            # answered (done() queues the key again once this reconcile ends).
            self.queue.add(key)

    def _seen(self, key: Key, phase: object) -> None:
        """The Run's phase counted (agentrun_runs), unless the Run was forgotten meanwhile: its DELETED
        event may come while a reconcile of it awaits a read or a write, and a gauge entry put back
        after that would stay for good."""
        if key in self.runs:
            self.metrics.run_seen(key, phase)

    async def _execute(self, plan: Plan, run: Run, world: World) -> Executed:
        """Carries the plan out; a plan that writes is a span of the Run's trace (what was decided). What
        it observed that core decides on (a refused Pod, a refused provisioning, a squatted name) is kept
        for the Run's next World; whether it changed a watched object or observed any: Executed.news
        (either way the Run is decided again)."""
        started, error = self.clock.now().timestamp(), None
        try:
            executed = await self.executor.execute(plan, run, world)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self.spans.decided(run, plan, started, error)
        key = (str(run.metadata.namespace), str(run.metadata.name))
        if executed.refused_pods:
            self._refused_pods.setdefault(key, {}).update(executed.refused_pods)
        if executed.provisioning_refused:
            self._provisioning_refused.add(key)
        if executed.squatted:
            self._squatted.setdefault(key, {}).update(executed.squatted)
        if executed.restorations is not None and run.status.failure is not None:
            failed_for = run.status.failure.to_api().get("message")
            self._restorations[key] = (failed_for, executed.restorations)
        return executed

    async def _world(self, key: Key, run: Run) -> World:
        """What decide sees: only what this Run owns. An object that merely carries the Run's label (or
        a Run of the same name that was deleted) is not the Run's, and never adopted. It only reads:
        what the table wants written (a store Secret made, blobs restored) is an action of its Plan, and
        what the executor observed carrying one out (a refused Pod or provisioning, a squatted name, the
        blobs restored) comes back here as an observation."""
        uid = str(run.metadata.uid)
        self._seen(key, run.status.phase)
        self.leases.remember(key, uid, run.spec.lease.duration_seconds)
        owned_attempts = self._owned("attempts", key, uid, controller=True)
        owned_effects = self._owned("sideeffects", key, uid)
        attempts = {a.spec.number: a for a in (Attempt.model_validate(o) for o in owned_attempts)}
        owned_checkpoints = await self._checkpoints(key, run, attempts.values())
        pods = {v.name: v for v in (pod_view(o) for o in self._owned("pods", key, uid, controller=True))}
        await self._fresh_statement(key, attempts, pods)
        lease = self.leases.lease(key)
        refused = self._refused_pods.get(key, {})
        if run.status.phase in TERMINAL_PHASES:
            self._squatted.pop(key, None)
        restorations = self._restorations_for(key, run)
        for ended in [a for a in attempts.values() if a.status.phase in FINISHED_ATTEMPT_PHASES]:
            refused.pop(str(ended.metadata.name), None)
        account_refused = await self._account_refusal(run) if may_start_pods(run) else None
        role_denied: tuple[str, ...] = ()
        if may_start_pods(run) and account_refused is None:
            role_denied = await self.roles.denied(agent_account(run))
        # The store's Secret is looked for once the account may run Pods (only looked for: with the
        # bundled server, the table asks for it to be made).
        allowed = may_start_pods(run) and account_refused is None and not role_denied
        store_missing = allowed and await self.store_credentials.missing(key[0])
        if not store_missing:
            self._provisioning_refused.discard(key)
        fork_source = None
        if fork.wants_source(run):  # a fork not started yet: its source, read from the API server
            fork_source = await fork.read_source(self.api, run, self.archives)
        return World(
            run=run,
            attempts=attempts,
            pods=pods,
            lease=lease,
            now=self.clock.now(),
            lease_expires_in=self.leases.expires_in(key, lease),
            side_effects=[SideEffect.model_validate(o) for o in owned_effects],
            checkpoints=[Checkpoint.model_validate(o) for o in owned_checkpoints],
            account_refusal=account_refused,
            attempt_role_denied=role_denied,
            refused_pods=dict(refused),
            squatted=dict(self._squatted.get(key, {})),
            restorations=restorations,
            state_store=self.store_credentials.store,
            store_credentials_missing=store_missing,
            provisions_store_credentials=self.store_credentials.provisions,
            store_provisioning_refused=key in self._provisioning_refused,
            default_ttl_seconds=self.default_ttl_seconds,
            has_store=self.has_store,
            store_mode=self.store_mode,
            fork_source=fork_source,
            managed_fields=self._managed_fields(
                key, attempts=owned_attempts, sideeffects=owned_effects, checkpoints=owned_checkpoints
            ),
        )

    def _restorations_for(self, key: Key, run: Run) -> tuple[Restoration, ...] | None:
        """What became of the blobs restored for the Run's failure, while it waits for their restore."""
        status, kept = run.status, self._restorations.get(key)
        failure = status.failure.to_api() if status.failure is not None else None
        kinds = [c.type for c in status.conditions or []]
        if kept is None or failure is None or not waits_for_restore(status.phase, failure, kinds):
            self._restorations.pop(key, None)
            return None
        message, restorations = kept
        if message != failure.get("message"):  # restored for an earlier failure: this one is new
            self._restorations.pop(key, None)
            return None
        return restorations

    async def _checkpoints(self, key: Key, run: Run, attempts: Iterable[Attempt]) -> list[JsonDict]:
        """The Run's Checkpoints as cached, with those it names that the cache does not hold yet read from
        the API server (and cached): its pointer, its pending request's, a manual retry's, what an
        Attempt resumes from. A Checkpoint's event wakes no Run (operator.informers.QUIET) and may come
        after the Run's event that names it: a decision is never made on less (retention keeps what the
        pointer's state is rebuilt from, a retry is judged on the checkpoint it names, a grant sees
        whether the state it resumes is in the store). One read per such Checkpoint; one found absent
        is not read again for this Run (a named Checkpoint exists before it is named)."""
        uid = str(run.metadata.uid)
        cached = self._owned("checkpoints", key, uid)
        named = {
            run.status.latest_checkpoint,
            run.status.pending_request.checkpoint_id if run.status.pending_request else None,
            run.spec.retry_request.from_checkpoint if run.spec.retry_request else None,
            *(a.spec.resume_from for a in attempts),
        }
        held = {c["metadata"]["name"] for c in cached} | {(c.get("spec") or {}).get("id") for c in cached}
        absent = self._absent.setdefault(key, set())
        missing = sorted(n for n in named if n and n not in held and n not in absent)
        for name in missing:
            body = await self.api.get(self.api.custom_path("checkpoints", key[0], name))
            owned = body is not None and owned_by(body, uid, controller=False)
            if body is None or not owned or self.cache.put("checkpoints", body) is None:
                absent.add(name)
        return self._owned("checkpoints", key, uid) if missing else cached

    async def _fresh_statement(self, key: Key, attempts: dict[int, Attempt], pods: dict[str, Any]) -> None:
        """The newest Attempt, once it has ended, as the API server has it when the cache shows no
        statement of its SDK that it reads references: an SDK states it first, before it writes any, so
        an Attempt read after its end shows every statement that counts (core: state_in_store, the
        AgentSDKTooOld verdict), whatever the watch's lag. One read per ended Attempt, with a store."""
        if not self.has_store or not attempts:
            return
        number = max(attempts)
        attempt = attempts[number]
        name, attempt_uid = str(attempt.metadata.name), str(attempt.metadata.uid)
        pod = pods.get(name)
        ended = attempt.status.phase in FINISHED_ATTEMPT_PHASES or (pod is not None and pod.finished)
        if not ended or reads_refs(attempt) or self._undeclared.get(key) == attempt_uid:
            return
        namespace = str(attempt.metadata.namespace)
        body = await self.api.get(self.api.custom_path("attempts", namespace, name))
        if body is None:
            return
        fresh = Attempt.model_validate(body)
        if fresh.metadata.uid == attempt.metadata.uid:
            attempts[number] = fresh
        if not reads_refs(fresh):
            self._undeclared[key] = attempt_uid

    def _managed_fields(self, key: Key, **owned: list[JsonDict]) -> frozenset[tuple[str, str]]:
        """(plural, name) of the Run and of its objects that carry managedFields, as cached."""
        found = {
            (kind, o["metadata"]["name"])
            for kind, objects in owned.items()
            for o in objects
            if o.get(HAS_MANAGED_FIELDS)
        }
        if self.runs.has_managed_fields(key):
            found.add(("runs", key[1]))
        return frozenset(found)

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
