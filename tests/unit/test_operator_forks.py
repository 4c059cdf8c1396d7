"""operator.fork: the seam where a deleted fork source is read from its archive."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from agentrun.api.blobref import BlobRef as ApiBlobRef
from agentrun.operator.fork import DocumentArchives, NoArchives, archives_in
from agentrun.statestore import BlobRef, BlobStore
from agentrun.statestore import archives as stored
from agentrun.statestore.checkpoint_index import encode_index, entry, inline_state_bytes
from unit.factories import NAMESPACE
from unit.test_core_forks import SOURCE_UID, checkpoint, record, source_run
from unit.test_statestore_archives import NOW, summary


def test_a_deleted_source_is_read_from_its_archive_document_when_a_reader_is_wired() -> None:
    asked: list[tuple[str, str]] = []
    document = {
        "object": source_run().to_api(),
        "checkpoints": [checkpoint().to_api()],
        "sideEffects": [record("k1", 1).to_api()],
    }

    async def read(namespace: str, run: str) -> Mapping[str, Any] | None:
        asked.append((namespace, run))
        return document if run == "source" else None

    archives = DocumentArchives(read)
    found = asyncio.run(archives.fork_source("team-a", "source", "source-a1-s2"))
    absent = asyncio.run(archives.fork_source("team-a", "other", "x"))

    assert found is not None and found.archived
    assert found.checkpoint is not None and found.checkpoint.spec.id == "source-a1-s2"
    assert [r.spec.idempotency_key for r in found.side_effects] == ["k1"]
    assert absent is None
    assert asked == [("team-a", "source"), ("team-a", "other")]
    assert asyncio.run(NoArchives().fork_source("team-a", "source", "source-a1-s2")) is None


def test_the_runtime_reads_deleted_sources_from_the_stores_verified_archives() -> None:
    """archives_in: what the runtime wires: the archive statestore.archives wrote, read back verified."""
    source = source_run()
    body = {
        "object": source.to_api(),
        "checkpoints": [checkpoint().to_api()],
        "sideEffects": [record("k1", 1).to_api()],
    }
    store = BlobStore.from_url("memory://state")

    async def scenario() -> None:
        entry = await stored.write_archive(store, summary("source", str(source.metadata.uid)), "7", body, NOW)
        await stored.index_archive(store, entry)

    asyncio.run(scenario())
    found = asyncio.run(archives_in(store).fork_source("team-a", "source", "source-a1-s2"))
    assert found is not None and found.archived and found.run is not None
    assert found.checkpoint is not None and found.checkpoint.spec.id == "source-a1-s2"
    assert asyncio.run(archives_in(store).fork_source("team-a", "never-archived", "x")) is None
    assert isinstance(archives_in(None), NoArchives)


def test_a_compacted_sources_older_checkpoint_is_read_from_its_index_its_state_shared() -> None:
    """After compaction only the latest Checkpoint object stays: the one a fork names is in the index,
    with its ledger mark, and its state (a stateRef, or an inline state moved into a blob) by reference."""
    store = BlobStore.from_url("memory://state")
    older, inline = checkpoint("source-a1-s1"), checkpoint("source-a1-s2", stateRef=None, state={"n": 2})

    async def compacted() -> BlobRef:
        moved = await store.put(NAMESPACE, SOURCE_UID, inline_state_bytes({"n": 2}))
        entries = [entry(older.to_api(), None), entry(inline.to_api(), moved)]
        return await store.put(NAMESPACE, SOURCE_UID, encode_index(entries))

    index = asyncio.run(compacted())
    source = source_run()
    source.status.checkpoint_index = ApiBlobRef.model_validate({**index.to_json(), "links": True})
    reader = archives_in(store)

    found = asyncio.run(reader.indexed_checkpoint(source, "source-a1-s1"))
    assert found is not None and found.spec.ledger_mark == older.spec.ledger_mark
    assert found.spec.state_ref == older.spec.state_ref
    moved = asyncio.run(reader.indexed_checkpoint(source, "source-a1-s2"))
    assert moved is not None and moved.spec.state_ref is not None and moved.spec.state is None
    assert asyncio.run(store.get(BlobRef.from_json(moved.spec.state_ref.to_api()))) == b'{"n":2}'
    assert asyncio.run(reader.indexed_checkpoint(source, "source-a9-s9")) is None
    assert asyncio.run(NoArchives().indexed_checkpoint(source, "source-a1-s1")) is None
