"""Reading a fork's source (spec.forkFrom) for core.fork: the source Run, its checkpoint and its
SideEffects, read from the API server (not the caches: a record a lagging cache had not seen yet would
not be inherited, and its action could be executed again). Done only while the fork has not started.

A source Run that is gone may have been archived: `ArchivedSources` is the seam where its archive is
read (`archives_in`: the state store's archives, verified; without a store a deleted source is not
found). A compacted
source keeps only its latest Checkpoint object: an older checkpoint is read from its checkpoint index in
the store (its state by reference, shared like any other).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from agentrun.api import RUN_LABEL, Checkpoint, Run, RunPhase, SideEffect
from agentrun.core.fork import ForkSourceView, archived_source
from agentrun.core.identity import owned_by
from agentrun.kubeapi import KubeApi
from agentrun.statestore import BlobRef as StoredRef
from agentrun.statestore import BlobStore, archives
from agentrun.statestore.checkpoint_index import as_checkpoint, decode_index, state_as_ref

JsonDict = dict[str, Any]


class ArchivedSources(Protocol):
    """Reads what of a source is in the state store: a deleted source Run from its archive, and a
    compacted source's older checkpoint from its checkpoint index. None when there is none."""

    async def fork_source(self, namespace: str, run: str, checkpoint_id: str) -> ForkSourceView | None: ...

    async def indexed_checkpoint(self, source: Run, checkpoint_id: str) -> Checkpoint | None: ...


class NoArchives:
    """No state store: a deleted source, or a compacted source's older checkpoint, is not found."""

    async def fork_source(self, namespace: str, run: str, checkpoint_id: str) -> ForkSourceView | None:
        return None

    async def indexed_checkpoint(self, source: Run, checkpoint_id: str) -> Checkpoint | None:
        return None


# Reads the verified archive document of the latest archived Run of that name (None: no archive), e.g.
# statestore.archives.read_archive(store, namespace, name)[1], LookupError mapped to None.
ReadArchive = Callable[[str, str], Awaitable[Mapping[str, Any] | None]]


# Reads a blob, verified (BlobStore.get).
ReadBlob = Callable[[StoredRef], Awaitable[bytes]]


class DocumentArchives:
    """Deleted sources read from their archive documents (core.fork.archived_source), and compacted
    sources' older checkpoints from their checkpoint index (statestore.checkpoint_index)."""

    def __init__(self, read: ReadArchive, read_blob: ReadBlob | None = None) -> None:
        self.read = read
        self.read_blob = read_blob

    async def fork_source(self, namespace: str, run: str, checkpoint_id: str) -> ForkSourceView | None:
        document = await self.read(namespace, run)
        if document is None:
            return None
        found = archived_source(document, checkpoint_id)
        if found.checkpoint is None and found.run is not None:
            found = replace(found, checkpoint=await self.indexed_checkpoint(found.run, checkpoint_id))
        return found

    async def indexed_checkpoint(self, source: Run, checkpoint_id: str) -> Checkpoint | None:
        """The source's checkpoint `checkpoint_id` as its index recorded it, its state by reference."""
        index = source.status.checkpoint_index
        if index is None or self.read_blob is None:
            return None
        stored = StoredRef(index.key, index.sha256, index.size, bool(index.links))
        for found in decode_index(await self.read_blob(stored)):
            if found.get("id") == checkpoint_id:
                body = as_checkpoint(found, str(source.metadata.name), str(source.metadata.namespace))
                if (ref := state_as_ref(found)) is not None:
                    body["spec"]["stateRef"] = ref
                return Checkpoint.model_validate(body)
        return None


def archives_in(store: BlobStore | None) -> ArchivedSources:
    """Where deleted fork sources are read from: the state store's archives (statestore.archives), or
    nowhere without a store."""
    if store is None:
        return NoArchives()

    async def read(namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            return (await archives.read_archive(store, namespace, name))[1]
        except LookupError:
            return None

    return DocumentArchives(read, store.get)


def wants_source(run: Run) -> bool:
    """Whether decide needs the fork's source now: a fork that has not started."""
    return run.spec.fork_from is not None and run.status.phase in (None, RunPhase.QUEUED)


async def read_source(api: KubeApi, fork: Run, archives: ArchivedSources) -> ForkSourceView:
    """The source as the API server has it now (or its archive, when the Run is gone)."""
    wanted = fork.spec.fork_from
    assert wanted is not None
    ns = str(fork.metadata.namespace)
    if wanted.run == fork.metadata.name:
        return ForkSourceView(run=fork)  # core refuses it: never read as a source of itself
    body = await api.get(api.custom_path("runs", ns, wanted.run))
    if body is None:
        archived = await archives.fork_source(ns, wanted.run, wanted.checkpoint_id)
        return archived if archived is not None else ForkSourceView(run=None)
    source = Run.model_validate(body)
    uid = str(source.metadata.uid)
    checkpoints = [
        Checkpoint.model_validate(o) for o in await _owned(api, "checkpoints", ns, wanted.run, uid)
    ]
    checkpoint = next((c for c in checkpoints if c.spec.id == wanted.checkpoint_id), None)
    note = None
    if checkpoint is None and source.status.checkpoint_index is not None:
        # compacted: its older checkpoints are in its checkpoint index in the store
        checkpoint = await archives.indexed_checkpoint(source, wanted.checkpoint_id)
        if checkpoint is None:
            note = "nor in its checkpoint index"
    records = [SideEffect.model_validate(o) for o in await _owned(api, "sideeffects", ns, wanted.run, uid)]
    return ForkSourceView(run=source, checkpoint=checkpoint, side_effects=records, missing_note=note)


async def _owned(api: KubeApi, plural: str, ns: str, run: str, uid: str) -> list[JsonDict]:
    """The source Run's own objects of a kind (its label, its spec.runName, owned by its uid)."""
    found: list[JsonDict] = []
    async for page in api.list_pages(api.custom_path(plural, ns), label_selector=f"{RUN_LABEL}={run}"):
        for obj in page:
            if (obj.get("spec") or {}).get("runName") == run and owned_by(obj, uid, controller=False):
                found.append(obj)
    return found
