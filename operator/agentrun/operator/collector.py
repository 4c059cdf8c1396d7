"""The one collector of the state store (docs/state-store.md, "Collection"):
every interval, one sweep lists the store's blobs, then gathers the roots (fresh lists of every Run,
Attempt, Checkpoint and SideEffect, the documents their `links` references reach, and every archive),
lets agentrun.core.collector decide, and carries out its decisions: quarantine, restore, delete for
good. Only the operator runs it, with its own credentials; marks live in its memory.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge

from agentrun.api import GROUP, VERSION
from agentrun.clock import Clock
from agentrun.core.collector import (
    QUARANTINE_SEGMENT,
    BlobAddress,
    CollectorSettings,
    Marks,
    Roots,
    StoredBlob,
    Sweep,
    decide,
    live_address,
    relative_key,
)
from agentrun.kubeapi import KubeApi
from agentrun.operator.informers import collection_paths
from agentrun.operator.settings import OperatorSettings
from agentrun.operator.sweeps import PeriodicSweep
from agentrun.statestore import BlobRef, StateStoreError, StateUnverifiable, StoreTimeouts, archives
from agentrun.statestore.documents import document_refs, refs_in
from agentrun.statestore.operatorstore import OperatorStore

log = logging.getLogger("agentrun.operator.collector")
JsonDict = dict[str, Any]

# The kinds whose objects hold references (every field is searched).
ROOT_KINDS: Final = ("runs", "attempts", "checkpoints", "sideeffects")
SWEEP_OUTCOMES: Final = ("ok", "error")
_REF_FIELDS: Final = frozenset({"key", "sha256", "size"})


class CollectorMetrics:
    """Registered in `registry` (None: not registered)."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.sweeps = Counter(
            "agentrun_state_store_gc_sweeps",
            "Sweeps of the state store's collector, by outcome (error: nothing was decided)",
            ["outcome"],
            registry=registry,
        )
        self.quarantined = Counter(
            "agentrun_state_store_blobs_quarantined",
            "Unreferenced blobs moved into quarantine by the collector",
            registry=registry,
        )
        self.restored = Counter(
            "agentrun_state_store_blobs_restored",
            "Quarantined blobs referenced again and restored to their keys",
            registry=registry,
        )
        self.collected = Counter(
            "agentrun_state_store_blobs_collected",
            "Blobs deleted for good by the collector (after mark, grace and quarantine)",
            registry=registry,
        )
        self.marked = Gauge(
            "agentrun_state_store_blobs_marked",
            "Blobs the last sweep found unreferenced and old enough (marked, not yet quarantined)",
            registry=registry,
        )
        self.held = Gauge(
            "agentrun_state_store_gc_held_namespaces",
            "Namespaces where the last sweep collected nothing: a document there could not be read",
            registry=registry,
        )
        for outcome in SWEEP_OUTCOMES:
            self.sweeps.labels(outcome)


@dataclass
class _Gathering:
    """Roots being gathered: referenced keys (relative), held namespaces, documents still to read."""

    prefix: str
    keys: set[str] = field(default_factory=set)
    held: set[str] = field(default_factory=set)
    complete: bool = True
    documents: list[tuple[BlobRef, str | None]] = field(default_factory=list)

    def add(self, ref: BlobRef, namespace: str | None) -> None:
        key = relative_key(self.prefix, ref.key)
        if key is None:
            return  # not in this store: not the collector's
        self.keys.add(key)
        if ref.links:
            self.documents.append((ref, namespace))

    def take(self, objects: Iterable[JsonDict]) -> None:
        for obj in objects:
            namespace = (obj.get("metadata") or {}).get("namespace")
            for ref in references(obj):
                self.add(ref, namespace)

    def hold(self, key: str | None, namespace: str | None, why: str) -> None:
        address = live_address(key) if key is not None else None
        places = {n for n in (namespace, address.namespace if address else None) if n}
        log.warning("collector holds %s: %s", ", ".join(sorted(places)) or "everything", why)
        if not places:
            self.complete = False
        self.held |= places

    def roots(self) -> Roots:
        return Roots(frozenset(self.keys), frozenset(self.held), self.complete)


class Collector:
    """Sweeps the store every `interval_seconds` (start/stop), or once on demand (sweep)."""

    def __init__(
        self,
        api: KubeApi,
        store: OperatorStore,
        settings: CollectorSettings,
        *,
        clock: Clock,
        interval_seconds: float,
        namespaces: Sequence[str] = (),
        metrics: CollectorMetrics,
    ) -> None:
        self.api, self.store, self.settings, self.clock = api, store, settings, clock
        self.namespaces = tuple(namespaces)
        self.metrics = metrics
        self.marks = Marks()
        # Documents are immutable: what each named, by its reference, kept while it is still reached.
        self._documents: dict[BlobRef, tuple[BlobRef, ...]] = {}
        self._archives: dict[tuple[str, str], tuple[BlobRef, ...]] = {}  # (key, sha256) -> what it names
        self._periodic = PeriodicSweep(
            self.sweep,
            name="state-store-collector",
            clock=clock,
            interval_seconds=interval_seconds,
            failed=self._failed,
        )

    @property
    def interval_seconds(self) -> float:
        return self._periodic.interval_seconds

    def start(self) -> None:
        """Starts sweeping. Marks start afresh: a replica that stood by saw nothing meanwhile."""
        self.marks = Marks()
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()

    def _failed(self, error: Exception) -> None:
        """A sweep that failed: nothing was decided on it; the next sweep tries again."""
        self.metrics.sweeps.labels("error").inc()
        log.warning("collector sweep failed, nothing decided: %s", str(error)[:600])

    async def sweep(self) -> Sweep:
        """One sweep: the listing first, then the roots, then the decisions, carried out."""
        listing = await self._listing()
        roots = await self.gather_roots()
        decided = decide(
            listing,
            roots,
            self.marks,
            self.clock.now(),
            self.settings,
            namespaces=frozenset(self.namespaces) or None,
        )
        sizes = {blob.key: blob.size for blob in listing}
        failed = await self._carry_out(decided, sizes)
        self.marks = _after(decided.marks, self.marks, failed)
        self.metrics.sweeps.labels("ok").inc()
        self.metrics.marked.set(decided.marked)
        self.metrics.held.set(len(roots.held))
        log.info(
            "collector sweep: %d referenced, %d young, %d held, %d marked, %d quarantined, %d restored, "
            "%d deleted%s",
            decided.referenced,
            decided.young,
            decided.held,
            decided.marked,
            len(decided.quarantine),
            len(decided.restore),
            len(decided.delete),
            "" if roots.complete else " (roots incomplete: nothing collected)",
        )
        return decided

    async def _listing(self) -> list[StoredBlob]:
        if not self.namespaces:
            return await self.store.list_blobs()
        found: list[StoredBlob] = []
        for namespace in self.namespaces:
            found += await self.store.list_blobs(namespace)
            found += await self.store.list_blobs(f"{QUARANTINE_SEGMENT}/{namespace}")
        return found

    async def gather_roots(self) -> Roots:
        """Every reference in the live objects, in the documents they reach, and in the archives."""
        gathering = _Gathering(self.store.location.prefix)
        for plural in ROOT_KINDS:
            for path, _ in collection_paths(GROUP, VERSION, plural, self.namespaces):
                async for page in self.api.list_pages(path):
                    gathering.take(page)
        return await self._complete(gathering)

    async def roots_of(self, objects: Iterable[JsonDict]) -> Roots:
        """The roots as they would be if `objects` were the live objects (the store read as in a sweep)."""
        gathering = _Gathering(self.store.location.prefix)
        gathering.take(objects)
        return await self._complete(gathering)

    async def _complete(self, gathering: _Gathering) -> Roots:
        await self._archive_roots(gathering)
        await self._follow_documents(gathering)
        return gathering.roots()

    async def _archive_roots(self, gathering: _Gathering) -> None:
        """What every archive names, read through the archive index (statestore.archives: each archive
        verified against the sha256 and size its index entry records). An archive read once is not read
        again while its entry stays the same; one that cannot be read holds all collection."""
        seen: dict[tuple[str, str], tuple[BlobRef, ...]] = {}
        for namespace in await archives.archived_namespaces(self.store):
            for entry in await archives.archived_runs(self.store, namespace):
                known = (entry.key, entry.sha256)
                named = self._archives.get(known)
                if named is None:
                    try:
                        named = tuple(refs_in(await archives.read_entry(self.store, entry)))
                    except (StateUnverifiable, ValueError) as error:
                        gathering.hold(None, None, f"archive {entry.key} cannot be read: {error}")
                        continue
                seen[known] = named
                for ref in named:
                    gathering.add(ref, None)
        self._archives = seen

    async def _follow_documents(self, gathering: _Gathering) -> None:
        reached: dict[BlobRef, tuple[BlobRef, ...]] = {}
        while gathering.documents:
            ref, namespace = gathering.documents.pop()
            if ref in reached:
                continue
            named = self._documents.get(ref)
            if named is None:
                try:
                    named = tuple(document_refs(await self._read_document(ref)))
                except (StateUnverifiable, ValueError) as error:
                    gathering.hold(relative_key(self.store.location.prefix, ref.key), namespace, str(error))
                    continue
            reached[ref] = named
            address = live_address(relative_key(self.store.location.prefix, ref.key) or "")
            for inner in named:
                gathering.add(inner, address.namespace if address else namespace)
        self._documents = reached

    async def _read_document(self, ref: BlobRef) -> bytes:
        """A document, verified; from its quarantine copy when a sweep moved it away (it is restored)."""
        try:
            return await self.store.get(ref)
        except StateUnverifiable as error:
            address = live_address(relative_key(self.store.location.prefix, ref.key) or "")
            if not error.missing or address is None:
                raise
            return await self.store.get_at(address.quarantine_key, ref.size)

    async def _carry_out(self, decided: Sweep, sizes: Mapping[str, int]) -> dict[str, str]:
        """Quarantines, restores and deletes, each on its own: one that fails is logged and tried again
        by a later sweep. Returns what failed, by key."""
        failed: dict[str, str] = {}
        for address in decided.quarantine:
            if await self._attempt("quarantine", address, self.store.quarantine(address), failed):
                self.metrics.quarantined.inc()
        for address in decided.restore:
            size = sizes.get(address.quarantine_key, 0)
            if await self._attempt("restore", address, self.store.restore(address, size), failed):
                self.metrics.restored.inc()
        for address in decided.delete:
            if await self._attempt("delete", address, self.store.delete(address.quarantine_key), failed):
                self.metrics.collected.inc()
        return failed

    @staticmethod
    async def _attempt(
        what: str, address: BlobAddress, action: Awaitable[object], failed: dict[str, str]
    ) -> bool:
        try:
            await action
        except StateStoreError as error:
            failed[address.key] = what
            log.warning("collector could not %s %s: %s", what, address.key, error)
            return False
        log.info("collector: %s %s", _DONE[what], address.key)
        return True


_DONE: Final = {"quarantine": "quarantined", "restore": "restored", "delete": "deleted for good"}


def _after(marks: Marks, previous: Marks, failed: Mapping[str, str]) -> Marks:
    """The marks to keep once the sweep's actions ran: a quarantine that failed leaves the blob at its
    key (marked again from the start); a delete that failed leaves it in quarantine, its period as it
    was; a restore that failed is decided again by the next sweep."""
    quarantined_since = dict(marks.quarantined_since)
    for key, what in failed.items():
        if what == "quarantine":
            quarantined_since.pop(key, None)
        elif what == "delete" and key in previous.quarantined_since:
            quarantined_since[key] = previous.quarantined_since[key]
    return Marks(marks.unreferenced_since, quarantined_since)


def references(value: Any) -> Iterator[BlobRef]:
    """Every blob reference in a JSON value (agentrun.statestore.documents.refs_in's rule), tolerant: a
    mapping that has a reference's fields but is not a valid one still roots its key, since a malformed
    record in an object must not stop the collector nor free what the key names."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            fields = set(item)
            if _REF_FIELDS <= fields <= {*_REF_FIELDS, "links"}:
                yield from _as_ref(item)
            else:
                stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _as_ref(item: Mapping[str, Any]) -> Iterator[BlobRef]:
    try:
        yield BlobRef.from_json(item)
    except ValueError:
        key = item.get("key")
        if isinstance(key, str) and key:
            yield BlobRef(key, "0" * 64, 0)  # roots the key; never read (not a document)


def build_collector(
    api: KubeApi,
    store: OperatorStore | None,
    config: OperatorSettings,
    namespaces: Sequence[str],
    *,
    clock: Clock,
    registry: CollectorRegistry | None,
) -> Collector | None:
    """The runtime's collector; None without a store or with collection turned off (interval 0)."""
    if store is None or config.state_store_gc_interval_seconds == 0:
        return None
    settings = CollectorSettings(
        config.state_store_gc_grace_seconds, config.state_store_gc_quarantine_seconds
    )
    timeouts = StoreTimeouts()
    longest_upload = timeouts.retry_budget_seconds + timeouts.request_seconds
    if settings.grace_seconds < longest_upload:
        log.warning(
            "the collector's grace period (%.0fs) is shorter than an upload may take (%.0fs): "
            "a blob whose referencing object is not written yet may be quarantined",
            settings.grace_seconds,
            longest_upload,
        )
    return Collector(
        api,
        store,
        settings,
        clock=clock,
        interval_seconds=config.state_store_gc_interval_seconds,
        namespaces=namespaces,
        metrics=CollectorMetrics(registry),
    )
