"""Carries out a Plan through agentrun.kubeapi, in order, stopping at the first write that loses a race:
one handler per action kind, observers (metrics, spans, the phase log) told of every write."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentrun.api import API_VERSION, RUN_LABEL, Run, lease_name
from agentrun.api.names import LEASE_VERSION_ANNOTATION
from agentrun.clock import Clock
from agentrun.core import plan as p
from agentrun.core.blobrestore import Restoration
from agentrun.core.identity import owned_by, squatted
from agentrun.core.runs import World
from agentrun.kubeapi import ApiError, KubeApi
from agentrun.operator.archive import Archiver
from agentrun.operator.blobrestore import StateRestorer
from agentrun.operator.cache import OwnedObjects
from agentrun.operator.logtail import log_tail, read_log
from agentrun.operator.run_cache import RunCache
from agentrun.operator.store_credentials import StoreCredentials
from agentrun.statestore import BlobRef, BlobStore, StateStoreError
from agentrun.statestore.checkpoint_index import decode_index, encode_index, entry, inline_state_bytes, merged

log = logging.getLogger("agentrun.operator")
JsonDict = dict[str, Any]
COMPONENT = "agentrun-operator"


class Superseded(Exception):
    """A preconditioned write found the world changed since the decision: decide again."""


class NameSquatted(Exception):
    """A create found an object of that name that the Run does not own: it is not adopted. The plan
    stops there, and the name goes back to core (Executed.squatted), which decides (NameSquatted)."""

    def __init__(self, kind: str, name: str) -> None:
        self.kind, self.name = kind, name
        super().__init__(squatted(kind, name))


def _ours(existing: JsonDict, run: Run, kind: str) -> JsonDict:
    """The object a create found under its name, if the Run controls it; else NameSquatted."""
    if not owned_by(existing, str(run.metadata.uid), controller=True):
        raise NameSquatted(kind, existing["metadata"]["name"])
    return existing


def _version(obj: JsonDict | None) -> str | None:
    version = (obj or {}).get("metadata", {}).get("resourceVersion")
    return None if version is None else str(version)


@dataclass(frozen=True)
class Written:
    """One action carried out, for the observers (metrics, spans, logs): what the write replaced, as
    cached, and what the API server answered (None: nothing written, e.g. the object was gone)."""

    action: p.Action
    before: JsonDict | None = None
    after: JsonDict | None = None
    created: bool = False  # a create that made the object (not one that found it made before)
    changed: bool = False  # it changed an object the operator watches (its watch event is an echo)


class Observer(Protocol):
    def written(self, run: Run, written: Written) -> None: ...


@dataclass
class Executed:
    """What carrying out a Plan did: whether a watched object changed, and what the writes observed
    that core decides on (a Pod the API server refused to create: attempt name -> the refusal; the
    bundled store refusing to make the namespace's credentials; a name the Run needs held by an object
    it does not own: name -> its kind; what became of the blobs restored for the Run)."""

    changed: bool = False
    refused_pods: dict[str, str] = field(default_factory=dict)
    provisioning_refused: bool = False
    squatted: dict[str, str] = field(default_factory=dict)
    restorations: tuple[Restoration, ...] | None = None

    @property
    def news(self) -> bool:
        """Whether the Run is to be decided again: a watched object changed, or core has an observation."""
        observed = bool(self.refused_pods) or self.provisioning_refused or bool(self.squatted)
        return self.changed or observed or self.restorations is not None


@dataclass
class _Progress:
    """The state one execution threads through its handlers."""

    run: Run
    resource_version: str | None
    attempt_uids: dict[str, str] = field(default_factory=dict)
    refused_pods: dict[str, str] = field(default_factory=dict)
    provisioning_refused: bool = False
    restorations: tuple[Restoration, ...] | None = None
    # What the decision saw, for the actions carried out on it (RestoreBlobs); None when not given.
    world: World | None = None


class Executor:
    """Carries out a Plan's actions in order, one small handler per kind; it decides nothing (what a
    write answered that matters to the Run goes back to core as an observation), and the observers
    watch each write instead of being woven through it."""

    def __init__(
        self,
        api: KubeApi,
        cache: OwnedObjects,
        *,
        clock: Clock,
        runs: RunCache | None = None,
        observers: Sequence[Observer] = (),
        archiver: Archiver | None = None,
        state_store: BlobStore | None = None,
        store_credentials: StoreCredentials | None = None,
        restorer: StateRestorer | None = None,
    ) -> None:
        self.api = api
        self.store_credentials = store_credentials
        self.restorer = restorer
        self.archiver = archiver
        self.state_store = state_store
        self.cache = cache
        self.clock = clock
        self.runs = runs
        self.observers = tuple(observers)
        self._handlers: dict[type, Callable[[Any, _Progress], Awaitable[Written]]] = {
            p.PatchRunStatus: self._patch_run_status,
            p.WriteLease: self._write_lease,
            p.CreateAttempt: self._create_attempt,
            p.PatchAttemptStatus: self._patch_attempt_status,
            p.PatchSideEffectStatus: self._patch_side_effect_status,
            p.CreatePod: self._create_pod,
            p.DeletePod: self._delete_pod,
            p.DeleteCheckpoint: self._delete_checkpoint,
            p.CreateCheckpoint: self._create_checkpoint,
            p.CreateSideEffect: self._create_side_effect,
            p.WriteCheckpointIndex: self._write_checkpoint_index,
            p.DeleteLease: self._delete_lease,
            p.SaveLogTail: self._save_log_tail,
            p.ClearManagedFields: self._clear_managed_fields,
            p.RecordEvent: self._event,
            p.RefuseMove: self._refuse_move,
            p.ProvisionStoreCredentials: self._provision_store_credentials,
            p.RestoreBlobs: self._restore_blobs,
            p.ArchiveRun: self._archive_run,
            p.DeleteRun: self._delete_run,
        }

    async def execute(self, plan: p.Plan, run: Run, world: World | None = None) -> Executed:
        """Carries the plan out, stopping at the first write that fails. A write that changed nothing
        (a patch the object already satisfied) does not count as a change. A create that finds its name
        held by an object the Run does not own stops the plan too, and says so (Executed.squatted).
        `world`: what the plan was decided on (RestoreBlobs reads the references it records)."""
        progress = _Progress(run, run.metadata.resource_version, world=world)
        changed = False
        squatted: dict[str, str] = {}
        for action in plan.actions:
            try:
                written = await self._handlers[type(action)](action, progress)
            except NameSquatted as squat:
                squatted[squat.name] = squat.kind
                break
            changed |= written.changed
            for observer in self.observers:
                observer.written(run, written)
        return Executed(
            changed, progress.refused_pods, progress.provisioning_refused, squatted, progress.restorations
        )

    def _ns(self, run: Run) -> tuple[str, str]:
        return str(run.metadata.namespace), str(run.metadata.name)

    async def _patch_run_status(self, action: p.PatchRunStatus, progress: _Progress) -> Written:
        ns, name = self._ns(progress.run)
        body = {"metadata": {"resourceVersion": progress.resource_version}, "status": action.patch}
        written = await self._conditional(
            self.api.merge_patch(self.api.custom_path("runs", ns, name, "status"), body)
        )
        changed = written["metadata"]["resourceVersion"] != progress.resource_version
        progress.resource_version = written["metadata"]["resourceVersion"]
        if self.runs is not None:
            self.runs.put(written)
        return Written(action, after=written, changed=changed)

    async def _write_lease(self, action: p.WriteLease, progress: _Progress) -> Written:
        ns, name = self._ns(progress.run)
        previous = self._cached_lease(ns, name)
        written = await self._lease(action, progress.run)
        self.cache.put("leases", written)
        return Written(action, before=previous, after=written, changed=True)

    async def _create_attempt(self, action: p.CreateAttempt, progress: _Progress) -> Written:
        ns = str(progress.run.metadata.namespace)
        collection = self.api.custom_path("attempts", ns)
        created, new = await self._create_or_get(collection, action.body, progress.run, "Attempt")
        progress.attempt_uids[created["metadata"]["name"]] = created["metadata"]["uid"]
        self.cache.put("attempts", created)
        return Written(action, after=created, created=new, changed=True)  # created, or found: news

    async def _patch_attempt_status(self, action: p.PatchAttemptStatus, progress: _Progress) -> Written:
        ns, name = self._ns(progress.run)
        path = self.api.custom_path("attempts", ns, action.name, "status")
        change: JsonDict = {"status": action.patch}
        if action.log_tail_of is not None and (
            tail := await self._tail_now(progress.run, action.log_tail_of)
        ):
            change["status"] = {**action.patch, "logTail": tail}
        if action.expected_resource_version is not None:
            change["metadata"] = {"resourceVersion": action.expected_resource_version}
        before = self._cached_attempt(ns, name, action.name)
        try:
            written = await self.api.merge_patch(path, change)
        except ApiError as exc:
            if exc.conflict:
                # The cache is behind the Attempt (e.g. the SDK recorded a rejected commit): take the
                # current one in, then decide again on it.
                if current := await self.api.get(self.api.custom_path("attempts", ns, action.name)):
                    self.cache.put("attempts", current)
                raise Superseded(str(exc)) from None
            if not exc.not_found:
                raise
            return Written(action, before=before)
        self.cache.put("attempts", written)
        return Written(action, before=before, after=written, changed=_version(written) != _version(before))

    async def _patch_side_effect_status(
        self, action: p.PatchSideEffectStatus, progress: _Progress
    ) -> Written:
        ns, name = self._ns(progress.run)
        path = self.api.custom_path("sideeffects", ns, action.name, "status")
        guarded: dict[str, Any] = {"status": action.patch}
        if action.resource_version:
            guarded["metadata"] = {"resourceVersion": action.resource_version}
        written = await self.api.merge_patch(path, guarded)
        before = self.cache.get("sideeffects", (ns, name), action.name)
        self.cache.put("sideeffects", written)
        return Written(action, before=before, after=written, changed=_version(written) != _version(before))

    async def _delete_pod(self, action: p.DeletePod, progress: _Progress) -> Written:
        ns, name = self._ns(progress.run)
        if not await self.api.delete(self.api.core_path("pods", ns, action.name), action.grace_seconds):
            self._forget("pods", (ns, name), action.name)
        return Written(action)

    async def _delete_checkpoint(self, action: p.DeleteCheckpoint, progress: _Progress) -> Written:
        """Deleted (or found gone) and out of the cache at once: a Checkpoint's watch events wake no Run
        (operator.informers.QUIET), so the Run is decided again on what this deletion left (changed)."""
        ns, name = self._ns(progress.run)
        await self.api.delete(self.api.custom_path("checkpoints", ns, action.name))
        self._forget("checkpoints", (ns, name), action.name)
        return Written(action, changed=True)

    async def _archive_run(self, action: p.ArchiveRun, progress: _Progress) -> Written:
        """The archive written and verified (operator.archive); a store that cannot raises, and the
        Plan stops before the Run's deletion."""
        if self.archiver is None:
            raise RuntimeError("an archive was planned but the operator has no state store")
        await self.archiver.archive(progress.run, action)
        return Written(action)

    async def _refuse_move(self, action: p.RefuseMove, progress: _Progress) -> Written:
        """Writes nothing: says that a rule's undeclared move was refused (its Event is the plan's)."""
        ns, name = self._ns(progress.run)
        log.error(
            "run %s/%s: the rule %s moved the Run from %s to %s, a move it does not declare: not written",
            ns,
            name,
            action.rule,
            action.source,
            action.target,
        )
        return Written(action)

    async def _provision_store_credentials(
        self, action: p.ProvisionStoreCredentials, progress: _Progress
    ) -> Written:
        """The namespace's principals on the bundled store and their Secrets (operator.store_credentials).
        Made: the Run is decided again, and now finds the Secret. Refused (the reason is in the log): told
        to core, which fails the Run as it would without the bundled store. A store that does not answer
        raises: the Run is looked at again later."""
        if self.store_credentials is None or not self.store_credentials.provisions:
            raise RuntimeError("store credentials were to be made but the operator has no bundled store")
        if not await self.store_credentials.provision(action.namespace):
            progress.provisioning_refused = True
            return Written(action)
        return Written(action, changed=True)

    async def _restore_blobs(self, action: p.RestoreBlobs, progress: _Progress) -> Written:
        """The blobs the Run's failure names restored from the versions the store kept
        (operator.blobrestore), on the references the decision's World records; what became of each goes
        back to core. A store that does not answer raises: the Run is looked at again later."""
        if self.restorer is None or progress.world is None:
            raise RuntimeError("blobs were to be restored but the operator has no state store or no World")
        progress.restorations = await self.restorer.restore(progress.world)
        return Written(action)

    async def _delete_run(self, action: p.DeleteRun, progress: _Progress) -> Written:
        """Deletes the Run as archived (its uid and resourceVersion as preconditions): one changed since,
        or recreated under the name, is decided again instead. Its owned objects go with it (GC)."""
        ns, name = self._ns(progress.run)
        preconditions = {"uid": action.uid, "resourceVersion": action.resource_version}
        try:
            await self.api.delete(self.api.custom_path("runs", ns, name), preconditions=preconditions)
        except ApiError as exc:
            if exc.conflict:
                raise Superseded(str(exc)) from None
            raise
        return Written(action)

    async def _create_checkpoint(self, action: p.CreateCheckpoint, progress: _Progress) -> Written:
        ns = str(progress.run.metadata.namespace)
        collection = self.api.custom_path("checkpoints", ns)
        created, new = await self._create_or_get(collection, action.body, progress.run, "Checkpoint")
        self.cache.put("checkpoints", created)
        return Written(action, after=created, created=new, changed=True)

    async def _create_side_effect(self, action: p.CreateSideEffect, progress: _Progress) -> Written:
        """The record, then its status writes (a repeat after a crash writes the same status again: a
        state kept as it is passes the ledger's transition rules)."""
        ns = str(progress.run.metadata.namespace)
        collection = self.api.custom_path("sideeffects", ns)
        written, new = await self._create_or_get(collection, action.body, progress.run, "SideEffect")
        name = written["metadata"]["name"]
        for status in action.statuses:
            if (written.get("status") or {}).get("state") == "Compensated":
                break  # written in full before: Compensated is final
            written = await self.api.merge_patch(
                self.api.custom_path("sideeffects", ns, name, "status"), {"status": status}
            )
        self.cache.put("sideeffects", written)
        return Written(action, after=written, created=new, changed=True)

    async def _write_checkpoint_index(self, action: p.WriteCheckpointIndex, progress: _Progress) -> Written:
        """Every Checkpoint's entry (inline states moved into blobs), merged with the index recorded
        before, as one content-addressed document; then status.checkpointIndex, preconditioned. Written
        again from the same Checkpoints (an operator restarted half-way), it is the same blob."""
        store = self.state_store
        if store is None:  # core asks only when told there is a store
            raise RuntimeError("a checkpoint index needs the state store")
        run = progress.run
        ns, uid = str(run.metadata.namespace), str(run.metadata.uid)
        previous = []
        if action.previous is not None:
            previous = decode_index(await store.get(BlobRef.from_json(action.previous)))
        current = []
        for body in await self._every_checkpoint(run, action.checkpoints):
            state = (body.get("spec") or {}).get("state")
            inline = None if state is None else await store.put(ns, uid, inline_state_bytes(state))
            current.append(entry(body, inline))
        stored = await store.put(ns, uid, encode_index(merged(previous, current)))
        indexed = BlobRef(stored.key, stored.sha256, stored.size, links=True)
        patched = await self._patch_run_status(
            p.PatchRunStatus({"checkpointIndex": indexed.to_json()}), progress
        )
        return Written(action, after=patched.after, changed=patched.changed)

    async def _every_checkpoint(self, run: Run, seen: Sequence[JsonDict]) -> list[JsonDict]:
        """The Checkpoints the decision saw, with any the cache had not seen yet (listed from the API
        server: the index must name every one, since those it does not name could be deleted later).
        Those are cached too: a Checkpoint's event wakes no Run (operator.informers.QUIET), and the
        compaction that follows (the superseded deleted, managedFields cleared) decides on the cache."""
        ns, uid = str(run.metadata.namespace), str(run.metadata.uid)
        by_name = {c["metadata"]["name"]: c for c in seen}
        collection = self.api.custom_path("checkpoints", ns)
        async for page in self.api.list_pages(collection, f"{RUN_LABEL}={run.metadata.name}"):
            for found in page:
                if owned_by(found, uid, controller=False) and found["metadata"]["name"] not in by_name:
                    by_name[found["metadata"]["name"]] = found
                    self.cache.put("checkpoints", found)
        return list(by_name.values())

    async def _delete_lease(self, action: p.DeleteLease, progress: _Progress) -> Written:
        """The finished Run's Lease, at the version the decision saw (a renewal since: decide again)."""
        ns, name = self._ns(progress.run)
        lease = lease_name(name)
        previous = self._cached_lease(ns, name)
        try:
            unchanged = {"resourceVersion": action.resource_version}
            await self.api.delete(self.api.lease_path(ns, lease), preconditions=unchanged)
        except ApiError as exc:
            if exc.conflict:
                raise Superseded(str(exc)) from None
            raise
        self._forget("leases", (ns, name), lease)
        return Written(action, before=previous, changed=True)

    async def _save_log_tail(self, action: p.SaveLogTail, progress: _Progress) -> Written:
        """The tail of the ended Attempt's Pod log into Attempt status.logTail (core deletes the Pod once
        it is recorded). A Pod already gone leaves nothing to keep."""
        try:
            tail = await self._read_tail(progress.run, action.pod)
        except (ApiError, StateStoreError) as exc:
            if not action.best_effort:
                raise
            log.warning("the log tail of %s was not kept before its Pod went: %s", action.pod, exc)
            return Written(action)
        if tail is None:
            return Written(action)
        return await self._patch_attempt_status(
            p.PatchAttemptStatus(action.attempt, {"logTail": tail}), progress
        )

    async def _read_tail(self, run: Run, pod: str) -> JsonDict | None:
        """status.logTail of the Pod's log as it reads now (None: the Pod is gone)."""
        data = await read_log(self.api, str(run.metadata.namespace), pod)
        if data is None:
            return None
        now = self._now_micro()[:19] + "Z"
        if isinstance(data, str):  # no log to read: say why, so the Pod is not waited on forever
            return {"unavailable": data, "time": now}
        return await log_tail(data, run, self.state_store, now)

    async def _tail_now(self, run: Run, pod: str) -> JsonDict | None:
        """The tail kept with an Attempt's end, if it can be read now: else the end is recorded without
        it, and core keeps the tail later (SaveLogTail) before the Pod is collected."""
        try:
            return await self._read_tail(run, pod)
        except (ApiError, StateStoreError) as exc:
            log.info("the log tail of %s is kept later: %s", pod, exc)
            return None

    async def _clear_managed_fields(self, action: p.ClearManagedFields, progress: _Progress) -> Written:
        """metadata.managedFields reset (the API server strips them when a write sets them to one empty
        entry), preconditioned on the version the decision saw: one written since is decided again. The
        Run's own reset follows on from the Run's version this Plan has reached."""
        run = progress.run
        ns = str(run.metadata.namespace)
        is_run = action.kind == "runs"
        version = progress.resource_version if is_run else action.resource_version
        body: JsonDict = {"metadata": {"resourceVersion": version, "managedFields": [{}]}}
        before = None if is_run else self.cache.get(action.kind, self._ns(run), action.name)
        try:
            written = await self.api.merge_patch(self.api.custom_path(action.kind, ns, action.name), body)
        except ApiError as exc:
            if exc.conflict:
                raise Superseded(str(exc)) from None
            if not exc.not_found:
                raise
            return Written(action, before=before)
        if is_run:
            progress.resource_version = written["metadata"]["resourceVersion"]
            if self.runs is not None:
                self.runs.put(written)
        else:
            self.cache.put(action.kind, written)
        return Written(action, before=before, after=written, changed=True)

    async def _conditional(self, write: Any) -> JsonDict:
        try:
            result: JsonDict = await write
        except ApiError as exc:
            if exc.conflict:
                raise Superseded(str(exc)) from None
            raise
        return result

    async def _create_or_get(
        self, collection: str, body: JsonDict, run: Run, kind: str
    ) -> tuple[JsonDict, bool]:
        """Creates are idempotent: names are deterministic, so AlreadyExists means done before, if what
        exists is the Run's own (anyone may create an object of that name first).
        Returns the object and whether this call created it."""
        try:
            return await self.api.create(collection, body), True
        except ApiError as exc:
            if not exc.conflict:
                raise
        existing = await self.api.get(f"{collection}/{body['metadata']['name']}")
        if existing is None:
            raise Superseded(f"{body['metadata']['name']} exists and vanished: decide again")
        return _ours(existing, run, kind), False

    def _forget(self, kind: str, key: tuple[str, str], name: str) -> None:
        """An object the cache holds but the API server does not (deleted while nobody watched, e.g.
        between the start-up listing and kopf's): without this, decide would wait on it forever."""
        for obj in self.cache.of(kind, key):
            if obj["metadata"]["name"] == name:
                self.cache.remove(kind, obj)

    def _cached_attempt(self, ns: str, run: str, attempt: str) -> JsonDict | None:
        return next(
            (o for o in self.cache.of("attempts", (ns, run)) if o["metadata"]["name"] == attempt), None
        )

    def _cached_lease(self, ns: str, run: str) -> JsonDict | None:
        name = lease_name(run)
        return next((o for o in self.cache.of("leases", (ns, run)) if o["metadata"]["name"] == name), None)

    async def _lease(self, action: p.WriteLease, run: Run) -> JsonDict:
        ns, name = str(run.metadata.namespace), lease_name(str(run.metadata.name))
        spec: JsonDict = {
            "holderIdentity": action.holder,
            "leaseDurationSeconds": action.duration_seconds,
            "leaseTransitions": action.epoch,
            "acquireTime": self._now_micro(),
            "renewTime": self._now_micro(),
        }
        if action.expected_resource_version is None:
            owner = {
                "apiVersion": API_VERSION,
                "kind": "Run",
                "name": run.metadata.name,
                "uid": run.metadata.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": name,
                    "namespace": ns,
                    "labels": {RUN_LABEL: run.metadata.name},
                    "ownerReferences": [owner],
                },
                "spec": spec,
            }
            try:
                created: JsonDict = await self.api.create(self.api.lease_path(ns), body)
            except ApiError as exc:
                if not exc.conflict:
                    raise
                # Created before (the cache lags) or by someone else: only our own is decided on.
                if existing := await self.api.get(self.api.lease_path(ns, name)):
                    self.cache.put("leases", _ours(existing, run, "Lease"))
                raise Superseded(f"Lease {name} exists: decide again") from None
            return created
        patch = {"metadata": {"resourceVersion": action.expected_resource_version}, "spec": spec}
        return await self._conditional(self.api.merge_patch(self.api.lease_path(ns, name), patch))

    async def _create_pod(self, action: p.CreatePod, progress: _Progress) -> Written:
        """Creates the attempt Pod. A Pod the API server refuses as invalid (400, 422: e.g. a bad
        podTemplate) cannot exist, and retrying cannot help: the refusal goes back to core, which
        decides what becomes of the Attempt."""
        run, body = progress.run, action.body
        ns, attempt = str(run.metadata.namespace), body["metadata"]["name"]
        for ref in body["metadata"]["ownerReferences"]:
            if ref["kind"] == "Attempt" and not ref.get("uid"):
                uid = progress.attempt_uids.get(attempt)
                if uid is None:
                    current = await self.api.get(self.api.custom_path("attempts", ns, attempt))
                    if current is None:
                        raise Superseded(f"Attempt {attempt} is not there yet")
                    uid = current["metadata"]["uid"]
                ref["uid"] = uid
        lease = self._cached_lease(ns, str(run.metadata.name))
        if lease is not None and (lease.get("spec") or {}).get("holderIdentity") == attempt:
            # The SDK's first renewal is preconditioned on it, without reading the Lease first.
            body["metadata"]["annotations"][LEASE_VERSION_ANNOTATION] = lease["metadata"]["resourceVersion"]
        try:
            created = await self.api.create(self.api.core_path("pods", ns), body)
        except ApiError as exc:
            if exc.conflict:
                existing = await self.api.get(self.api.core_path("pods", ns, attempt))
                if existing is not None:
                    self.cache.put("pods", _ours(existing, run, "Pod"))
                return Written(action, after=existing, changed=existing is not None)
            if exc.status in (400, 422):
                progress.refused_pods[attempt] = exc.message
                return Written(action)
            raise
        self.cache.put("pods", created)
        return Written(action, after=created, created=True, changed=True)

    def _now_micro(self) -> str:
        return self.clock.now().strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    async def _event(self, action: p.RecordEvent, progress: _Progress) -> Written:
        run = progress.run
        ns = str(run.metadata.namespace)
        regarding: JsonDict = {
            "apiVersion": API_VERSION,
            "kind": "Run",
            "name": run.metadata.name,
            "namespace": ns,
        }
        if action.attempt:
            attempt = next(
                (
                    a
                    for a in self.cache.of("attempts", (ns, str(run.metadata.name)))
                    if a["metadata"]["name"] == action.attempt
                ),
                None,
            )
            regarding = {
                "apiVersion": API_VERSION,
                "kind": "Attempt",
                "name": action.attempt,
                "namespace": ns,
            }
            if attempt:
                regarding["uid"] = attempt["metadata"]["uid"]
        else:
            regarding["uid"] = run.metadata.uid
        now = self._now_micro()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{regarding['name']}.", "namespace": ns},
            "involvedObject": regarding,
            "type": action.type,
            "reason": action.reason,
            "message": action.message[:1024],
            "source": {"component": COMPONENT},
            "firstTimestamp": now[:19] + "Z",
            "lastTimestamp": now[:19] + "Z",
            "count": 1,
            "reportingComponent": COMPONENT,
        }
        fields = {"namespace": ns, "run": str(run.metadata.name)}
        if action.attempt:
            fields["attempt"] = action.attempt
        # The Event's story goes to the log too (Events expire after an hour; logs are kept longer).
        level = logging.WARNING if action.type == "Warning" else logging.INFO
        log.log(level, "run %s/%s %s: %s", ns, run.metadata.name, action.reason, action.message, extra=fields)
        try:
            await self.api.create(self.api.core_path("events", ns), body)
        except ApiError as exc:  # an Event is worth a log line, never a failed reconcile
            log.warning("event %s not recorded: %s", action.reason, exc, extra=fields)
        return Written(action)


class PhaseLog:
    """Every phase change goes to the log, also those no Event is recorded for (a first grant, a
    success): the log tells a Run's story at no request's cost."""

    def written(self, run: Run, written: Written) -> None:
        if not isinstance(written.action, p.PatchRunStatus):
            return
        before = run.status.phase.value if run.status.phase else None
        after = written.action.patch.get("phase")
        if after is None or after == before:
            return
        ns, name = run.metadata.namespace, run.metadata.name
        fields = {"namespace": str(ns), "run": str(name)}
        message = written.action.patch.get("message") or ""
        log.info("run %s/%s %s -> %s: %s", ns, name, before or "(new)", after, message, extra=fields)
