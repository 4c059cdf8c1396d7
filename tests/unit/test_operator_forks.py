"""operator.forks: the seam where a deleted fork source is read from its archive."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from agentrun.operator.forks import DocumentArchives, NoArchives, archives_in
from agentrun.statestore import BlobStore
from agentrun.statestore import archives as stored
from unit.test_core_forks import checkpoint, record, source_run
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
