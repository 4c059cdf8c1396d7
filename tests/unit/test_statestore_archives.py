"""Archives of finished Runs and their index (statestore.archives) on memory:// and file://: written
put-if-absent, verified on every read, one per Run uid, listed from an index without one read per
archive, deleted by retention a day at a time."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agentrun.statestore import BlobStore, StateUnverifiable
from agentrun.statestore import archives as a
from agentrun.statestore.documents import document_refs

NS = "team-a"
NOW = datetime(2026, 12, 2, 9, 30, tzinfo=UTC)


def store(tmp_path: Path | None = None) -> BlobStore:
    return BlobStore.from_url(f"file://{tmp_path}/store" if tmp_path else "memory://state")


def summary(name: str, uid: str, phase: str = "Succeeded") -> a.RunSummary:
    times = ("2026-12-02T09:00:00Z", "2026-12-02T09:10:00Z")
    return a.RunSummary(NS, name, uid, phase, *times, attempts=1, usage={"tokens": 3})


async def archived(s: BlobStore, name: str, uid: str, body: dict[str, Any] | None = None) -> a.ArchiveEntry:
    entry = await a.write_archive(s, summary(name, uid), "7", body or {"attempts": []}, NOW)
    await a.index_archive(s, entry)
    return entry


def test_an_archive_is_written_verified_indexed_and_read_back_whole() -> None:
    async def scenario() -> None:
        s = store()
        state = await s.put(NS, "uid-1", b"the state")
        body = {"checkpoints": [{"id": "c1", "stateRef": state.to_json()}]}
        entry = await archived(s, "echo", "uid-1", body)
        assert entry.key == "state/_archives/team-a/echo/uid-1.json"
        assert entry.key.startswith(a.archives_prefix(s))
        [listed] = await a.archived_runs(s, NS)
        assert listed == entry
        found, document = await a.read_archive(s, NS, "echo")
        assert found == entry
        assert document["checkpoints"] == body["checkpoints"]
        assert document["archivedTime"] == "2026-12-02T09:30:00Z"
        # the archive names the blobs it needs: the collector keeps them while the archive lives
        raw = await s.read_key(entry.key)
        assert raw is not None
        assert document_refs(raw) == [state]

    asyncio.run(scenario())


def test_a_run_recreated_under_the_same_name_keeps_both_archives() -> None:
    async def scenario() -> None:
        s = store()
        first = await archived(s, "echo", "uid-1", {"attempts": ["first"]})
        second = await archived(s, "echo", "uid-2", {"attempts": ["second"]})
        assert first.key != second.key
        assert [e.uid for e in await a.archived_runs(s, NS)] == ["uid-1", "uid-2"]
        assert (await a.read_archive(s, NS, "echo", "uid-1"))[1]["attempts"] == ["first"]
        assert (await a.read_archive(s, NS, "echo"))[1]["attempts"] == ["second"], "the latest by default"

    asyncio.run(scenario())


def test_a_repeat_after_a_restart_keeps_the_first_archive_and_indexes_it_once() -> None:
    async def scenario() -> None:
        s = store()
        first = await archived(s, "echo", "uid-1", {"attempts": ["as first written"]})
        again = await a.write_archive(s, summary("echo", "uid-1"), "7", {"attempts": ["changed since"]}, NOW)
        assert (again.key, again.sha256, again.size) == (first.key, first.sha256, first.size)
        assert await a.index_archive(s, again) is False
        assert len(await a.archived_runs(s, NS)) == 1
        assert (await a.read_archive(s, NS, "echo"))[1]["attempts"] == ["as first written"]


def test_a_run_changed_after_its_archive_is_archived_again_beside_it() -> None:
    async def scenario() -> None:
        s = store()
        first = await archived(s, "echo", "uid-1", {"attempts": ["version 7"]})
        later = datetime(2026, 12, 2, 9, 31, tzinfo=UTC)
        changed = await a.write_archive(s, summary("echo", "uid-1"), "9", {"attempts": ["version 9"]}, later)
        assert changed.key == "state/_archives/team-a/echo/uid-1-9.json" != first.key
        assert await a.index_archive(s, changed) is True
        [entry] = await a.archived_runs(s, NS)
        assert entry == changed, "one entry per Run: the latest archived"
        assert (await a.read_archive(s, NS, "echo"))[1]["attempts"] == ["version 9"]

    asyncio.run(scenario())


def test_an_archive_changed_behind_the_index_is_refused_on_read(tmp_path: Path) -> None:
    async def scenario() -> None:
        s = store(tmp_path)
        entry = await archived(s, "echo", "uid-1")
        path = tmp_path / "store" / entry.key
        path.write_bytes(path.read_bytes().replace(b"attempts", b"attempt_s"))
        with pytest.raises(StateUnverifiable, match="the index names"):
            await a.read_archive(s, NS, "echo")
        path.unlink()
        with pytest.raises(StateUnverifiable, match="no archive at this key"):
            await a.read_archive(s, NS, "echo")

    asyncio.run(scenario())


def test_another_runs_archive_at_the_key_is_never_taken_for_this_one() -> None:
    async def scenario() -> None:
        s = store()
        planted = a.archive_key(s, NS, "echo", "uid-1")
        await s.put_new(planted, b'{"kind":"RunArchive","refs":[],"run":{"uid":"someone-else"}}')
        with pytest.raises(StateUnverifiable, match="not the archive of the Run with uid uid-1"):
            await a.write_archive(s, summary("echo", "uid-1"), "7", {}, NOW)

    asyncio.run(scenario())


def test_no_archive_of_a_name_is_a_clear_lookup_error() -> None:
    async def scenario() -> None:
        s = store()
        await archived(s, "echo", "uid-1")
        with pytest.raises(LookupError, match="no archive of Run other in namespace team-a"):
            await a.read_archive(s, NS, "other")
        with pytest.raises(LookupError, match="with uid uid-9"):
            await a.read_archive(s, NS, "echo", "uid-9")

    asyncio.run(scenario())


def test_the_index_reads_one_segment_per_chain_and_supersedes_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(a, "CHAIN_LENGTH", 3)

    async def scenario() -> None:
        s = store()
        for number in range(7):
            await archived(s, f"run-{number}", f"uid-{number}")
        keys = await s.list_keys(a.index_prefix(s, NS))
        segments = [k.rsplit("/", 1)[-1] for k in keys]
        assert segments == ["000000-000002.json", "000001-000002.json", "000002-000000.json"]
        assert [e.name for e in await a.archived_runs(s, NS)] == [f"run-{n}" for n in range(7)]

    asyncio.run(scenario())


def test_concurrent_writers_lose_no_entry() -> None:
    async def scenario() -> None:
        s = store()
        await asyncio.gather(*(archived(s, f"run-{n}", f"uid-{n}") for n in range(12)))
        assert sorted(e.uid for e in await a.archived_runs(s, NS)) == sorted(f"uid-{n}" for n in range(12))

    asyncio.run(scenario())


def test_retention_deletes_a_days_archives_then_its_index() -> None:
    async def scenario() -> None:
        s = store()
        entry = await archived(s, "echo", "uid-1")
        assert await a.archived_namespaces(s) == [NS]
        assert await a.index_days(s, NS) == ["2026-12-02"]
        assert await a.delete_day(s, NS, "2026-12-02") == 1
        assert await s.read_key(entry.key) is None
        assert await a.archived_runs(s, NS) == []
        assert await a.index_days(s, NS) == []

    asyncio.run(scenario())


def test_keys_outside_the_store_prefix_are_refused() -> None:
    async def scenario() -> None:
        s = store()
        with pytest.raises(ValueError, match="not under the store's prefix"):
            await s.put_new("elsewhere/archives/x.json", b"{}")

    asyncio.run(scenario())
