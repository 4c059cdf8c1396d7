"""What the operator has seen of the objects a Run owns, fed by watch events and by its own writes.

Reconciles read Attempts, Pods, the Lease and the Run itself from here (no request per reconcile; when
a decision must not trust the cached Run, see agentrun.operator.reconciler). The cache may lag: every
write the state machine asks for is idempotent or preconditioned, so a stale view costs a retry, never a
wrong write. Our own writes are put in at once (write-through), so the cache is never older than what
this operator did itself: an object it created is there from the create's response on (the expectation
the Job controller keeps), and the watch event of its own write (same resourceVersion) is no news.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from agentrun.api import RUN_LABEL
from agentrun.clock import Clock
from agentrun.core.lease import Sighting, sight
from agentrun.core.pods import pod_essentials

Key = tuple[str, str]  # (namespace, run name)
JsonDict = dict[str, Any]
# Told of every object the cache takes in: (kind, the version it replaces or None, the new version).
Observer = Callable[[str, JsonDict | None, JsonDict], None]


def version_of(obj: JsonDict | None) -> int | None:
    """An object's resourceVersion as the integer etcd makes it (None if it is not one)."""
    try:
        return int((obj or {})["metadata"]["resourceVersion"])
    except (KeyError, ValueError, TypeError):
        return None


def _newer_or_equal(incoming: JsonDict, cached: JsonDict | None) -> bool:
    """resourceVersions are opaque by contract, but etcd's are integers: use them to refuse an event
    older than what a write already showed us."""
    new, old = version_of(incoming), version_of(cached)
    return new is None or old is None or new >= old


def _newer(incoming: JsonDict, cached: JsonDict | None) -> bool:
    """Whether `incoming` tells more than `cached`: not the same version again (the echo of our own
    write, whose response gave it), nor an older one."""
    new, old = version_of(incoming), version_of(cached)
    if cached is None or new is None or old is None:
        return True
    return new > old


# Kept at the top of a cached object (not in its metadata) when the object carries managedFields: a
# compacted Run's are cleared (core.runs.compaction), and only whether there are any is decided on.
HAS_MANAGED_FIELDS = "hasManagedFields"


def essentials(kind: str, obj: JsonDict) -> JsonDict:
    """What the cache keeps of an object: what the reconciler reads. managedFields go (often the largest
    part of an object; HAS_MANAGED_FIELDS says whether there were any), a Pod keeps only what says how its
    agent is doing, a Checkpoint loses its state (the operator never reads it; it may be hundreds of KiB)."""
    if kind == "pods":
        return pod_essentials(obj)
    metadata = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    kept = {**obj, "metadata": metadata}
    if (obj.get("metadata") or {}).get("managedFields"):
        kept[HAS_MANAGED_FIELDS] = True
    if kind == "checkpoints":
        kept["spec"] = {k: v for k, v in (obj.get("spec") or {}).items() if k != "state"}
    return kept


def _agent_running(pod: JsonDict) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return any("running" in (s.get("state") or {}) for s in statuses)


class OwnedObjects:
    def __init__(self, clock: Clock, on_put: Observer | None = None) -> None:
        self.clock = clock  # when a Lease version or a running agent was first seen (monotonic)
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

    def get(self, kind: str, key: Key, name: str) -> JsonDict | None:
        return self._by_run[kind].get(key, {}).get(name)

    def take(self, kind: str, obj: JsonDict) -> tuple[Key | None, JsonDict | None, bool]:
        """A watched version of an object: (its Run's key, the version it replaces, whether it was
        news). An echo of our own write, or an older version, is no news and changes nothing."""
        key = self.run_key(obj)
        if key is None:
            return None, None, False
        previous = self.get(kind, key, obj["metadata"]["name"])
        if not _newer(obj, previous):
            return key, previous, False
        self.put(kind, obj)
        return key, previous, True

    def replace(
        self, kind: str, listed: list[JsonDict], resource_version: str, namespace: str | None = None
    ) -> set[Key]:
        """A relist (of one namespace, or of all when None): the listed objects replace the cached ones
        of `kind` there. An object missing from the
        list is gone, unless the cache holds it at a version newer than the list (our own create or
        write answered after the list's snapshot: the expectation holds). Returns the keys of the Runs
        whose objects changed."""
        try:
            listed_at: int | None = int(resource_version)
        except ValueError:
            listed_at = None
        touched: set[Key] = set()
        seen: set[tuple[Key, str]] = set()
        for obj in listed:
            key, _, news = self.take(kind, obj)
            if key is not None:
                seen.add((key, obj["metadata"]["name"]))
                if news:
                    touched.add(key)
        for key, bucket in list(self._by_run[kind].items()):
            if namespace is not None and key[0] != namespace:
                continue
            for name, cached in list(bucket.items()):
                version = version_of(cached)
                if (key, name) in seen or (
                    listed_at is not None and version is not None and version > listed_at
                ):
                    continue
                self.remove(kind, cached)
                touched.add(key)
        return touched

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
                self._running_seen.setdefault((key[0], name), self.clock.monotonic())
            if kind == "leases":
                lease_key = (key[0], name)
                rv = obj["metadata"]["resourceVersion"]
                self._sightings[lease_key] = sight(self._sightings.get(lease_key), rv, self.clock.monotonic())
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
            bucket = self._by_run[kind][key]
            cached = bucket.get(obj["metadata"]["name"])
            uid = obj["metadata"].get("uid")
            if cached is not None and (uid is None or cached["metadata"].get("uid") in (None, uid)):
                del bucket[obj["metadata"]["name"]]
            if not bucket:
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
        self._listeners: list[Callable[[str], None]] = []

    def on_change(self, listener: Callable[[str], None]) -> None:
        """`listener(namespace)` after an account of that namespace is put (listed too) or removed."""
        self._listeners.append(listener)

    def put(self, account: JsonDict) -> None:
        metadata = account.get("metadata") or {}
        self._labels[(metadata["namespace"], metadata["name"])] = dict(metadata.get("labels") or {})
        self._changed(str(metadata["namespace"]))

    def remove(self, account: JsonDict) -> None:
        metadata = account.get("metadata") or {}
        self._labels.pop((str(metadata.get("namespace")), str(metadata.get("name"))), None)
        self._changed(str(metadata.get("namespace")))

    def replace(self, listed: list[JsonDict], namespace: str | None = None) -> None:
        """A relist (of one namespace, or of all when None): exactly the listed accounts are opted in."""
        gone = {k[0] for k in self._labels if namespace is None or k[0] == namespace}
        for where in [k for k in self._labels if namespace is None or k[0] == namespace]:
            del self._labels[where]
        for account in listed:
            self.put(account)
        for left in sorted(gone - self.namespaces()):
            self._changed(left)

    def namespaces(self) -> frozenset[str]:
        """The namespaces with at least one opted-in account."""
        return frozenset(namespace for namespace, _ in self._labels)

    def _changed(self, namespace: str) -> None:
        for listener in self._listeners:
            listener(namespace)

    def labels(self, namespace: str, name: str) -> dict[str, str] | None:
        return self._labels.get((namespace, name))

    def __len__(self) -> int:
        return len(self._labels)
