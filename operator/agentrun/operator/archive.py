"""Archives of finished Runs (docs/state-store.md, "Archives of finished Runs"): the executor's handler of
core's ArchiveRun (write, read back, verify, index: statestore.archives), the retention pass that deletes
archives past `archiveRetention`, and their metrics in the runtime's registry.

A store that is down raises out of the handler, so the Plan stops before its DeleteRun: the deletion
waits for the store (the reconciler retries with backoff), the record is never lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge

from agentrun.api import Run
from agentrun.clock import Clock
from agentrun.core import archive
from agentrun.core.plan import ArchiveRun
from agentrun.operator.sweeps import PeriodicSweep
from agentrun.statestore import BlobStore, StateStoreError
from agentrun.statestore import archives as stored

log = logging.getLogger("agentrun.operator")
Key = tuple[str, str]
ARCHIVE_OUTCOMES: Final = ("verified", "failed")


class ArchiveMetrics:
    """Archives written and verified (or failed), Runs whose deletion waits for their archive, archives
    deleted by retention."""

    def __init__(self, registry: CollectorRegistry | None, pending: Callable[[], int]) -> None:
        self.archives = Counter(
            "agentrun_run_archives",
            "Archives of finished Runs written, read back and verified (verified), or not (failed: retried)",
            ("outcome",),
            registry=registry,
        )
        for outcome in ARCHIVE_OUTCOMES:
            self.archives.labels(outcome)
        self.pending = Gauge(
            "agentrun_run_deletions_pending",
            "Expired Runs kept because their archive could not be written yet (the store is down)",
            registry=registry,
        )
        self.pending.set_function(lambda: float(pending()))
        self.expired = Counter(
            "agentrun_run_archives_expired",
            "Archives deleted by the retention pass (archiveRetention)",
            registry=registry,
        )


class Archiver:
    """Carries out ArchiveRun: the archive written put-if-absent, read back, verified and indexed."""

    def __init__(
        self,
        store: BlobStore,
        clock: Clock,
        registry: CollectorRegistry | None,
        alive: Callable[[Key], bool] = lambda key: True,
    ) -> None:
        self.store, self.clock = store, clock
        self._waiting: set[Key] = set()
        self._alive = alive
        self.metrics = ArchiveMetrics(registry, self.deletions_pending)

    def deletions_pending(self) -> int:
        """Runs whose archive failed and that are still there (their deletion waits)."""
        self._waiting = {key for key in self._waiting if self._alive(key)}
        return len(self._waiting)

    async def archive(self, run: Run, action: ArchiveRun) -> stored.ArchiveEntry:
        namespace, name = str(run.metadata.namespace), str(run.metadata.name)
        summary = stored.RunSummary(
            namespace,
            name,
            str(run.metadata.uid),
            str(action.summary.get("phase") or ""),
            action.summary.get("createdTime"),
            action.summary.get("finishedTime"),
            int(action.summary.get("attempts") or 0),
            action.summary.get("usage"),
        )
        try:
            entry = await stored.write_archive(
                self.store, summary, str(run.metadata.resource_version), action.document, self.clock.now()
            )
            await stored.index_archive(self.store, entry)
        except (StateStoreError, ValueError):
            self._waiting.add((namespace, name))
            self.metrics.archives.labels("failed").inc()
            raise
        self._waiting.discard((namespace, name))
        self.metrics.archives.labels("verified").inc()
        log.info(
            "run %s/%s archived to %s (%d bytes, sha256 %s)",
            namespace,
            name,
            entry.key,
            entry.size,
            entry.sha256,
            extra={"namespace": namespace, "run": name},
        )
        return entry


class ArchiveRetention:
    """Deletes archives past `retention_seconds` (and their index), a day at a time, every
    `interval_seconds` on the runtime's Clock. Several replicas may run it: every delete is idempotent.
    A pass that fails on the state store is tried again after the interval; any other error ends the
    passes (until the replica stops them)."""

    def __init__(self, archiver: Archiver, retention_seconds: int) -> None:
        self.store, self.clock, self.metrics = archiver.store, archiver.clock, archiver.metrics
        self.retention_seconds = retention_seconds
        self._periodic = PeriodicSweep(
            self.pass_once,
            name="archive-retention",
            clock=self.clock,
            interval_seconds=float(min(3600, max(60, retention_seconds // 24))),
            failed=self._failed,
        )

    @property
    def interval_seconds(self) -> float:
        return self._periodic.interval_seconds

    def start(self) -> None:
        """Runs its passes while this replica acts (one of the runtime's activities)."""
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()

    def _failed(self, error: Exception) -> None:
        """A pass the state store failed is tried again; any other error is a defect: logged with its
        traceback, then raised (the passes end until this replica acts again), never swallowed."""
        if not isinstance(error, StateStoreError):
            log.error("archive retention stopped until this replica acts again", exc_info=error)
            raise error
        log.warning("archive retention: %s; trying again in %.0fs", error, self.interval_seconds)

    async def pass_once(self) -> int:
        """One pass over every namespace's index; returns how many archives it deleted."""
        deleted = 0
        now = self.clock.now()
        for namespace in await stored.archived_namespaces(self.store):
            days = await stored.index_days(self.store, namespace)
            for day in archive.expired_days(days, now, self.retention_seconds):
                count = await stored.delete_day(self.store, namespace, day)
                if not count:  # emptied by an earlier pass: a store on a file system (versitygw's posix
                    continue  # backend, file://) keeps listing the day's empty folder; nothing to tell
                deleted += count
                self.metrics.expired.inc(count)
                log.info("archive retention: deleted %d archives of %s archived on %s", count, namespace, day)
        return deleted
