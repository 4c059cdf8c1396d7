"""Restores a Run's overwritten blobs from the versions the store kept (docs/state-store.md, "Restoring an
overwritten blob"; the decisions: agentrun.core.blobrestore).

The Run's table asks (core.runs.restoring: the action core.plan.RestoreBlobs, carried out by the
executor), for a Run at rest waiting in NeedsReconciliation for a StateUnverifiable failure that no
StateRestored condition answers yet. For each blob the failure names and one of the Run's objects
references, the operator reads it (it may verify now: nothing to do), lists the key's versions, reads
those of the recorded size newest first, writes the first whose sha256 is the recorded one back as the
current version (with its own credentials: the only ones that may overwrite), and reads it back verified.
What became of each blob goes back to core (World.restorations), whose rule records the condition and an
Event on the Run through the table, preconditioned like every status write. It never retries the Run: a
person decides.

A store that cannot answer now raises StoreUnavailable: nothing is recorded, the reconciler tries again
later (level-based: the next pass finds what this one restored already verified). A refusal or a store
without versions is recorded, as is "no version matches": loudly, the blob stays named.

The collector never quarantines these blobs (they are referenced). A referenced blob the collector moved
away in its one window (docs/state-store.md, "The window it cannot close") may be restored here and by its
next sweep alike: both write the key's own verified content, so neither undoes the other.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Final

from prometheus_client import CollectorRegistry, Counter

from agentrun.api import Checkpoint
from agentrun.core import blobrestore
from agentrun.core.blobrestore import Outcome, Reference, Restoration, Target
from agentrun.core.runs import World
from agentrun.operator.collector import references
from agentrun.statestore import BlobRef, StateUnverifiable, StoreRefused
from agentrun.statestore.documents import document_refs
from agentrun.statestore.operatorstore import OperatorStore

log = logging.getLogger("agentrun.operator.blobrestore")

# How many documents are read to find a named blob that no object references directly.
_DOCUMENTS_LIMIT: Final = 1000


class RestoreMetrics:
    """Registered in `registry` (None: not registered)."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.restored = Counter(
            "agentrun_state_store_overwritten_blobs",
            "Blobs named by a Run's StateUnverifiable failure, by what became of them: restored from a "
            "version the store kept, verified already, no version matching, unsupported, refused",
            ["outcome"],
            registry=registry,
        )
        for outcome in Outcome:
            self.restored.labels(outcome.value)


class StateRestorer:
    """Restores the blobs a Run's StateUnverifiable failure names (restore), on the operator's store."""

    def __init__(self, store: OperatorStore, *, metrics: RestoreMetrics) -> None:
        self.store, self.metrics = store, metrics

    async def restore(self, world: World) -> tuple[Restoration, ...]:
        """Restores what the Run's failure names, if it waits for it, and says what became of each blob
        (empty: it names no content address the operator can look at). Writes no object of the Run."""
        run = world.run
        status = run.status
        failure = status.failure.to_api() if status.failure is not None else None
        kinds = [c.type for c in status.conditions or []]
        if failure is None or not blobrestore.waits_for_restore(status.phase, failure, kinds):
            return ()
        # Only keys under the Run's own namespace: a fork shares its source's blobs, never another
        # namespace's. (Whatever a reference says, only bytes whose sha256 is the key's own are written.)
        inside = self.store.location.key(str(run.metadata.namespace)) + "/"
        refs = [r for r in _references(world) if r.key.startswith(inside)]
        if missing := blobrestore.unreferenced(failure, refs):
            refs += await self._in_documents(refs, missing, inside)
        found = blobrestore.targets(status.phase, failure, kinds, refs)
        restorations = [await self._restore(target) for target in found]
        restorations += blobrestore.not_referenced(status.phase, failure, kinds, refs)
        for restoration in restorations:
            if restoration.outcome != Outcome.RESTORED:  # a restore is counted when it is written
                self.metrics.restored.labels(restoration.outcome.value).inc()
        return tuple(restorations)

    async def _in_documents(
        self, refs: list[Reference], wanted: frozenset[str], inside: str
    ) -> list[Reference]:
        """The references inside the documents the Run's references reach (read verified, as the
        collector follows them), until every key in `wanted` is found or the documents run out. A
        document that cannot be read is passed over: if it is what the failure names, it is a target
        of its own."""
        found: list[Reference] = []
        queue = [r for r in refs if r.links]
        seen: set[str] = set()
        left = set(wanted)
        while queue and left and len(seen) < _DOCUMENTS_LIMIT:
            document = queue.pop()
            if document.key in seen:
                continue
            seen.add(document.key)
            try:
                ref = BlobRef(document.key, document.sha256, document.size)
                named = document_refs(await self.store.get(ref))
            except (StateUnverifiable, ValueError) as error:
                log.info("restoring state: document %s passed over: %s", document.key, error)
                continue
            for each in named:
                holder = f"document {document.key}"
                inner = Reference(each.key, each.sha256, each.size, holder, document.checkpoint, each.links)
                if not each.key.startswith(inside):
                    continue
                found.append(inner)
                left.discard(each.key)
                if each.links:
                    queue.append(inner)
        return found

    async def _restore(self, target: Target) -> Restoration:
        ref = BlobRef(target.key, target.sha256, target.size)
        try:
            await self.store.get(ref)
            return Restoration(target, Outcome.VERIFIED)
        except StateUnverifiable:
            pass
        if not self.store.keeps_versions():
            detail = f"a {self.store.location.scheme}:// store keeps no versions the operator can list"
            return Restoration(target, Outcome.UNSUPPORTED, detail=detail)
        try:
            versions = await self.store.versions(target.key)
            read = 0
            for version in blobrestore.versions_to_try(target, versions):
                data = await self.store.get_version(target.key, version)
                read += 1
                if blobrestore.verifies(target, data):
                    await self.store.put_back(ref, data)
                    self.metrics.restored.labels(Outcome.RESTORED.value).inc()
                    log.warning("restored blob %s from the version %s the store kept", target.key, version)
                    return Restoration(target, Outcome.RESTORED, version, len(versions), read)
        except StoreRefused as error:
            return Restoration(target, Outcome.REFUSED, detail=str(error))
        return Restoration(target, Outcome.NO_VERSION, listed=len(versions), read=read)


def _references(world: World) -> Iterator[Reference]:
    """Every blob reference the Run's objects record, with the object holding it."""
    for checkpoint in world.checkpoints:
        yield from _of_checkpoint(checkpoint)
    others = [
        *((f"SideEffect {e.metadata.name}", e.to_api()) for e in world.side_effects),
        *((f"Attempt {a.metadata.name}", a.to_api()) for a in world.attempts.values()),
        (f"Run {world.run.metadata.name}", world.run.to_api()),
    ]
    for holder, body in others:
        for ref in references(body):
            yield Reference(ref.key, ref.sha256, ref.size, holder, None, ref.links)


def _of_checkpoint(checkpoint: Checkpoint) -> Iterator[Reference]:
    body = checkpoint.to_api()
    state = (body.get("spec") or {}).get("stateRef") or {}
    for ref in references(body):
        named = checkpoint.spec.id if ref.key == state.get("key") else None
        holder = f"Checkpoint {checkpoint.metadata.name}"
        yield Reference(ref.key, ref.sha256, ref.size, holder, named, ref.links)
