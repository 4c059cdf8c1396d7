"""operator.archive on a memory:// store and a fake Clock: ArchiveRun written, verified and indexed (its
metrics in the given registry), a store that refuses counted as a failure with the deletion pending, and
the retention pass deleting a day's archives once the whole day is past archiveRetention."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from agentrun.core import archive
from agentrun.core.plan import ArchiveRun
from agentrun.core.runs import World
from agentrun.operator.archive import Archiver, ArchiveRetention
from agentrun.statestore import BlobStore, StateStoreError, StoreUnavailable
from agentrun.statestore import archives as stored
from support.clock import FakeClock
from unit.factories import NAMESPACE, NOW, RUN, RUN_UID, make_attempt, make_run, run_status

ARCHIVED = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)


def action() -> tuple[World, ArchiveRun]:
    world = World(
        run=make_run(run_status("Succeeded", current=1, lease_epoch=1)),
        attempts={1: make_attempt(1, phase="Succeeded")},
        pods={},
        lease=None,
        now=NOW,
    )
    return world, ArchiveRun(archive.archive_document(world), archive.run_summary(world, NOW))


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def test_an_archive_is_written_verified_and_indexed_and_counted() -> None:
    async def scenario() -> None:
        registry, clock = CollectorRegistry(), FakeClock(ARCHIVED)
        archiver = Archiver(BlobStore.from_url("memory://state"), clock, registry)
        world, planned = action()
        entry = await archiver.archive(world.run, planned)
        assert (entry.namespace, entry.name, entry.uid, entry.phase) == (NAMESPACE, RUN, RUN_UID, "Succeeded")
        [listed] = await stored.archived_runs(archiver.store, NAMESPACE)
        assert listed == entry
        assert value(registry, "agentrun_run_archives_total", outcome="verified") == 1
        assert value(registry, "agentrun_run_deletions_pending") == 0

    asyncio.run(scenario())


def test_a_store_that_cannot_keeps_the_run_pending_and_is_counted(tmp_path: Path) -> None:
    async def scenario() -> None:
        registry = CollectorRegistry()
        store = BlobStore.from_url(f"file://{tmp_path}/store")
        (tmp_path / "store" / "_archives").write_text("a file where the archives' folder should be")
        archiver = Archiver(store, FakeClock(ARCHIVED), registry)
        world, planned = action()
        with pytest.raises(StateStoreError):
            await archiver.archive(world.run, planned)
        assert value(registry, "agentrun_run_archives_total", outcome="failed") == 1
        assert value(registry, "agentrun_run_deletions_pending") == 1

    asyncio.run(scenario())


def test_the_retention_pass_deletes_whole_days_past_retention() -> None:
    async def scenario() -> None:
        registry, clock = CollectorRegistry(), FakeClock(ARCHIVED)
        archiver = Archiver(BlobStore.from_url("memory://state"), clock, registry)
        world, planned = action()
        entry = await archiver.archive(world.run, planned)
        retention = ArchiveRetention(archiver, retention_seconds=86400)
        clock.advance(timedelta(hours=38).total_seconds())  # the day ended 23 h ago: kept
        assert await retention.pass_once() == 0
        clock.advance(timedelta(hours=1).total_seconds())
        assert await retention.pass_once() == 1
        assert await archiver.store.read_key(entry.key) is None
        assert await stored.archived_runs(archiver.store, NAMESPACE) == []
        assert value(registry, "agentrun_run_archives_expired_total") == 1

    asyncio.run(scenario())


def test_a_day_already_deleted_is_not_told_again_where_its_empty_folder_stays(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """On a store over a file system (file://, versitygw's posix backend) the day's folder stays, empty,
    and is listed again by every later pass: nothing is deleted, counted or logged for it."""

    async def scenario() -> None:
        registry, clock = CollectorRegistry(), FakeClock(ARCHIVED)
        archiver = Archiver(BlobStore.from_url(f"file://{tmp_path}/store"), clock, registry)
        world, planned = action()
        entry = await archiver.archive(world.run, planned)
        retention = ArchiveRetention(archiver, retention_seconds=86400)
        clock.advance(timedelta(hours=39).total_seconds())
        assert await retention.pass_once() == 1
        assert await stored.index_days(archiver.store, NAMESPACE) == [entry.day]  # the empty folder
        with caplog.at_level("INFO", logger="agentrun.operator"):
            assert await retention.pass_once() == 0
        assert not [r for r in caplog.records if "archive retention" in r.getMessage()], caplog.text
        assert value(registry, "agentrun_run_archives_expired_total") == 1

    asyncio.run(scenario())


class WaitingClock(FakeClock):
    """Each sleep is handed to the test (its seconds) and lasts until it is cancelled."""

    def __init__(self, now: datetime) -> None:
        super().__init__(now)
        self.sleeps: asyncio.Queue[float] = asyncio.Queue()

    async def sleep(self, seconds: float) -> None:
        self.sleeps.put_nowait(seconds)
        await asyncio.get_running_loop().create_future()


def test_the_retention_passes_outlast_a_store_that_fails_and_end_on_any_other_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    listings: asyncio.Queue[Exception] = asyncio.Queue()

    async def failing(store: BlobStore) -> list[str]:
        raise await listings.get()

    monkeypatch.setattr(stored, "archived_namespaces", failing)

    async def scenario() -> None:
        clock = WaitingClock(ARCHIVED)
        retention = ArchiveRetention(Archiver(BlobStore.from_url("memory://state"), clock, None), 86400)
        assert retention.interval_seconds == 3600.0
        retention.start()
        listings.put_nowait(StoreUnavailable("list", "_archives/", "connection refused"))
        assert await clock.sleeps.get() == 3600.0  # the store failed: the next pass after the interval
        [warning] = [r for r in caplog.records if r.getMessage().startswith("archive retention:")]
        assert warning.levelname == "WARNING"
        assert warning.getMessage() == (
            "archive retention: state store unavailable during list of _archives/: connection refused; "
            "trying again in 3600s"
        )
        await retention.stop()
        retention.start()
        [task] = [task for task in asyncio.all_tasks() if task.get_name() == "archive-retention"]
        listings.put_nowait(ValueError("a bug"))
        with pytest.raises(ValueError, match="a bug"):
            await task
        assert clock.sleeps.empty()  # no next pass
        [stopped] = [r for r in caplog.records if r.levelname == "ERROR"]  # loud, with its traceback
        assert stopped.getMessage() == "archive retention stopped until this replica acts again"
        assert stopped.exc_info is not None and isinstance(stopped.exc_info[1], ValueError)
        await retention.stop()

    asyncio.run(scenario())
