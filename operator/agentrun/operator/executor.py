"""Carries out a Plan through agentrun.kubeapi, in order, stopping at the first write that loses a race."""

from __future__ import annotations

import logging
from typing import Any

from agentrun.api import API_VERSION, RUN_LABEL, FailureClass, Run, Usage, lease_name
from agentrun.api.names import LEASE_VERSION_ANNOTATION
from agentrun.clock import Clock
from agentrun.core import plan as p
from agentrun.core.failures import failure
from agentrun.core.identity import owned_by, squatted
from agentrun.kubeapi import ApiError, KubeApi
from agentrun.operator.cache import OwnedObjects
from agentrun.operator.metrics import OperatorMetrics
from agentrun.operator.run_cache import RunCache
from agentrun.operator.spans import TRACED_END_PHASES, RunSpans
from agentrun.tracing import Tracing

log = logging.getLogger("agentrun.operator")
JsonDict = dict[str, Any]
COMPONENT = "agentrun-operator"


class Superseded(Exception):
    """A preconditioned write found the world changed since the decision: decide again."""


class NameSquatted(Exception):
    """A create found an object of that name that the Run does not own: it is not adopted."""

    def __init__(self, kind: str, name: str) -> None:
        self.message = squatted(kind, name)
        super().__init__(self.message)


def _ours(existing: JsonDict, run: Run, kind: str) -> JsonDict:
    """The object a create found under its name, if the Run controls it; else NameSquatted."""
    if not owned_by(existing, str(run.metadata.uid), controller=True):
        raise NameSquatted(kind, existing["metadata"]["name"])
    return existing


def _version(obj: JsonDict | None) -> str | None:
    version = (obj or {}).get("metadata", {}).get("resourceVersion")
    return None if version is None else str(version)


class Executor:
    def __init__(
        self,
        api: KubeApi,
        cache: OwnedObjects,
        metrics: OperatorMetrics | None = None,
        spans: RunSpans | None = None,
        *,
        clock: Clock,
        runs: RunCache | None = None,
    ) -> None:
        self.api = api
        self.cache = cache
        self.clock = clock
        self.runs = runs
        self.metrics = metrics or OperatorMetrics(registry=None)
        self.spans = spans or RunSpans(Tracing("agentrun-operator", env={}))

    async def execute(self, plan: p.Plan, run: Run) -> bool:
        """Carries the plan out; returns whether a write changed an object the operator watches (its
        watch event is then an echo, dropped: whoever asked decides again on what the writes answered).
        A write that changed nothing (a patch the object already satisfied) does not count."""
        changed = False
        ns, name = str(run.metadata.namespace), str(run.metadata.name)
        resource_version = run.metadata.resource_version
        attempt_uids: dict[str, str] = {}
        for action in plan.actions:
            match action:
                case p.PatchRunStatus(patch=patch):
                    body = {"metadata": {"resourceVersion": resource_version}, "status": patch}
                    written = await self._conditional(
                        self.api.merge_patch(self.api.custom_path("runs", ns, name, "status"), body)
                    )
                    changed |= written["metadata"]["resourceVersion"] != resource_version
                    resource_version = written["metadata"]["resourceVersion"]
                    if self.runs is not None:
                        self.runs.put(written)
                    if "usage" in patch:
                        self.metrics.usage_added(ns, run.status.usage, Usage.model_validate(patch["usage"]))
                    if patch.get("phase") in TRACED_END_PHASES:
                        self.spans.run_ended(run, str(patch["phase"]))
                    self._log_phase(run, patch)
                case p.WriteLease():
                    previous = self._cached_lease(ns, name)
                    self.cache.put("leases", await self._write_lease(action, run))
                    self.metrics.lease_written(previous, action)
                    changed = True
                case p.CreateAttempt(body=body):
                    created, new = await self._create_or_get(
                        self.api.custom_path("attempts", ns), body, run, "Attempt"
                    )
                    attempt_uids[created["metadata"]["name"]] = created["metadata"]["uid"]
                    self.cache.put("attempts", created)
                    changed = True  # created, or found and cached: news either way
                    if new:
                        self.metrics.attempt_started(str(body["spec"]["reason"]))
                case p.PatchAttemptStatus(name=attempt, patch=patch, expected_resource_version=rv):
                    path = self.api.custom_path("attempts", ns, attempt, "status")
                    change: JsonDict = {"status": patch}
                    if rv is not None:
                        change["metadata"] = {"resourceVersion": rv}
                    before = self._cached_attempt(ns, name, attempt)
                    try:
                        written = await self.api.merge_patch(path, change)
                        changed |= _version(written) != _version(before)
                        self.cache.put("attempts", written)
                    except ApiError as exc:
                        if exc.conflict:
                            # The cache is behind the Attempt (e.g. the SDK recorded a rejected commit):
                            # take the current one in, then decide again on it.
                            if current := await self.api.get(self.api.custom_path("attempts", ns, attempt)):
                                self.cache.put("attempts", current)
                            raise Superseded(str(exc)) from None
                        if not exc.not_found:
                            raise
                    else:
                        self.metrics.attempt_status_written(patch)
                        self.spans.attempt_written(run, self._cached_attempt(ns, name, attempt), patch)
                case p.PatchSideEffectStatus(name=effect, patch=patch, resource_version=version):
                    path = self.api.custom_path("sideeffects", ns, effect, "status")
                    guarded: dict[str, Any] = {"status": patch}
                    if version:
                        guarded["metadata"] = {"resourceVersion": version}
                    written = await self.api.merge_patch(path, guarded)
                    changed |= _version(written) != _version(
                        self.cache.get("sideeffects", (ns, name), effect)
                    )
                    self.cache.put("sideeffects", written)
                case p.CreatePod(body=body):
                    changed |= await self._create_pod(body, run, attempt_uids)
                case p.DeletePod(name=pod, grace_seconds=grace):
                    if not await self.api.delete(self.api.core_path("pods", ns, pod), grace):
                        self._forget("pods", (ns, name), pod)
                case p.DeleteCheckpoint(name=checkpoint):
                    await self.api.delete(self.api.custom_path("checkpoints", ns, checkpoint))
                case p.RecordEvent():
                    await self._event(action, run)
        return changed

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

    async def _write_lease(self, action: p.WriteLease, run: Run) -> JsonDict:
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

    async def _create_pod(self, body: JsonDict, run: Run, attempt_uids: dict[str, str]) -> bool:
        """Creates the attempt Pod; returns whether that changed a watched object (the Pod, or the
        Attempt failed for a Pod that cannot exist)."""
        ns, attempt = str(run.metadata.namespace), body["metadata"]["name"]
        for ref in body["metadata"]["ownerReferences"]:
            if ref["kind"] == "Attempt" and not ref.get("uid"):
                uid = attempt_uids.get(attempt)
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
            self.cache.put("pods", await self.api.create(self.api.core_path("pods", ns), body))
        except ApiError as exc:
            if exc.conflict:
                existing = await self.api.get(self.api.core_path("pods", ns, attempt))
                if existing is not None:
                    self.cache.put("pods", _ours(existing, run, "Pod"))
                return existing is not None
            if exc.status in (400, 422):
                # The Pod the Run describes cannot exist (e.g. a bad podTemplate): retrying cannot help.
                bad = failure(FailureClass.DETERMINISTIC, f"the attempt Pod was refused: {exc.message}")
                path = self.api.custom_path("attempts", ns, attempt, "status")
                patch = {
                    "status": {
                        "phase": "Failed",
                        "completionTime": self._now_micro()[:19] + "Z",
                        "failure": bad.to_api(),
                    }
                }
                self.cache.put("attempts", await self.api.merge_patch(path, patch))
                self.metrics.attempt_status_written(patch["status"])
                return True
            raise
        return True

    def _now_micro(self) -> str:
        return self.clock.now().strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    @staticmethod
    def _log_phase(run: Run, patch: JsonDict) -> None:
        """Every phase change goes to the log, also those no Event is recorded for (a first grant, a
        success): the log tells a Run's story at no request's cost."""
        before = run.status.phase.value if run.status.phase else None
        after = patch.get("phase")
        if after is None or after == before:
            return
        ns, name = run.metadata.namespace, run.metadata.name
        fields = {"namespace": str(ns), "run": str(name)}
        message = patch.get("message") or ""
        log.info("run %s/%s %s -> %s: %s", ns, name, before or "(new)", after, message, extra=fields)

    async def _event(self, action: p.RecordEvent, run: Run) -> None:
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
