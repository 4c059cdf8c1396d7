"""operator.forks: the seam where a deleted fork source is read from its archive."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from agentrun.operator.forks import DocumentArchives, NoArchives
from unit.test_core_forks import checkpoint, record, source_run


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
