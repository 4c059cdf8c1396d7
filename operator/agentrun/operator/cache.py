"""What the operator has seen of the objects a Run owns, fed by watch events and by its own writes.

Reconciles read Attempts, Pods and the Lease from here (no request per reconcile); the Run itself is
always read fresh. The cache may lag: every write the state machine asks for is idempotent or
preconditioned, so a stale view costs a retry, never a wrong write. Our own writes are put in at once
(write-through), so the cache is never older than what this operator did itself.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from agentrun.api import RUN_LABEL
from agentrun.core.lease import Sighting, sight
from agentrun.core.pods import pod_essentials

Key = tuple[str, str]  # (namespace, run name)
JsonDict = dict[str, Any]
# Told of every object the cache takes in: (kind, the version it replaces or None, the new version).
Observer = Callable[[str, JsonDict | None, JsonDict], None]


def _newer_or_equal(incoming: JsonDict, cached: JsonDict | None) -> bool:
    """resourceVersions are opaque by contract, but etcd's are integers: use them to refuse an event
    older than what a write already showed us."""
    if cached is None:
        return True
    try:
        return int(incoming["metadata"]["resourceVersion"]) >= int(cached["metadata"]["resourceVersion"])
    except (KeyError, ValueError):
        return True


def essentials(kind: str, obj: JsonDict) -> JsonDict:
    """What the cache keeps of an object: what the reconciler reads. managedFields go (often the largest
    part of an object), a Pod keeps only what says how its agent is doing, a Checkpoint loses its state
    (the operator never reads it; it may be hundreds of KiB)."""
    if kind == "pods":
        return pod_essentials(obj)
    metadata = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    kept = {**obj, "metadata": metadata}
    if kind == "checkpoints":
        kept["spec"] = {k: v for k, v in (obj.get("spec") or {}).items() if k != "state"}
    return kept


def _agent_running(pod: JsonDict) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return any("running" in (s.get("state") or {}) for s in statuses)


class OwnedObjects:
    def __init__(self, on_put: Observer | None = None) -> None:
        self.on_put = on_put
        self._by_run: dict[str, dict[Key, dict[str, JsonDict]]] = {
            kind: defaultdict(dict) for kind in ("attempts", "checkpoints", "sideeffects", "pods", "leases")
        }
        self._sightings: dict[tuple[str, str], Sighting] = {}
        self._running_seen: dict[tuple[str, str], float] = {}  # attempt Pods, by (namespace, name)

    @staticmethod
    def run_key(obj: JsonDict) -> Key | None:
        labels = obj.get("metadata", {}).get("labels") or {}
        run = labels.get(RUN_LABEL)
        return (obj["metadata"]["namespace"], run) if run else None

    def put(self, kind: str, obj: JsonDict) -> Key | None:
        key = self.run_key(obj)
        if key is None:
            return None
        obj = essentials(kind, obj)
        bucket = self._by_run[kind][key]
        name = obj["metadata"]["name"]
        previous = bucket.get(name)
        if _newer_or_equal(obj, previous):
            bucket[name] = obj
            if kind == "pods" and _agent_running(obj):
                self._running_seen.setdefault((key[0], name), time.monotonic())
            if kind == "leases":
                lease_key = (key[0], name)
                rv = obj["metadata"]["resourceVersion"]
                self._sightings[lease_key] = sight(self._sightings.get(lease_key), rv, time.monotonic())
            if self.on_put is not None:
                self.on_put(kind, previous, obj)
        return key

    def remove(self, kind: str, obj: JsonDict) -> Key | None:
        key = self.run_key(obj)
        where = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        if kind == "pods":
            self._running_seen.pop(where, None)
        if kind == "leases":
            self._sightings.pop(where, None)
        if key is not None:
            self._by_run[kind][key].pop(obj["metadata"]["name"], None)
            if not self._by_run[kind][key]:
                del self._by_run[kind][key]
        return key

    def of(self, kind: str, key: Key) -> list[JsonDict]:
        return list(self._by_run[kind].get(key, {}).values())

    def snapshot(self, kind: str) -> list[JsonDict]:
        """Every cached object of a kind; safe to call from another thread (e.g. a metrics scrape)."""
        return [obj for bucket in list(self._by_run[kind].values()) for obj in list(bucket.values())]

    def sighting(self, namespace: str, lease: str) -> Sighting | None:
        return self._sightings.get((namespace, lease))

    def running_seen(self, namespace: str, pod: str) -> float | None:
        """When (monotonic) this operator first saw the Pod's agent running."""
        return self._running_seen.get((namespace, pod))

    def forget_run(self, key: Key) -> None:
        for kind in self._by_run.values():
            kind.pop(key, None)

    def size(self) -> dict[str, int]:
        return {kind: sum(len(v) for v in runs.values()) for kind, runs in self._by_run.items()}


class AgentAccounts:
    """The labels of the ServiceAccounts opted in for attempt Pods (agentrun.dev/agent=true), fed by a
    label-selected watch: an account that loses the label leaves the selection and is dropped. A miss
    is no verdict (the watch may lag a fresh label): the reconciler reads the account then."""

    def __init__(self) -> None:
        self._labels: dict[tuple[str, str], dict[str, str]] = {}

    def put(self, account: JsonDict) -> None:
        metadata = account.get("metadata") or {}
        self._labels[(metadata["namespace"], metadata["name"])] = dict(metadata.get("labels") or {})

    def remove(self, account: JsonDict) -> None:
        metadata = account.get("metadata") or {}
        self._labels.pop((str(metadata.get("namespace")), str(metadata.get("name"))), None)

    def labels(self, namespace: str, name: str) -> dict[str, str] | None:
        return self._labels.get((namespace, name))

    def __len__(self) -> int:
        return len(self._labels)
