"""Archives outlive their Run for archiveRetention, then go (docs/state-store.md, "Archives of finished Runs";
docs/state-store.md, "Retention"), on a control plane of this module's own with its real S3 server
(versitygw): a real operator told AGENTRUN_ARCHIVE_RETENTION_SECONDS archives and deletes a Run with
ttlSecondsAfterFinished 0, and its retention pass deletes an archive past the retention (the document,
then its day of the index: `history` lists it no more) while it keeps the younger one.

Retention deletes whole days: a day goes once its end is the retention past. The real operator's clock is
the machine's, so the archive past the retention is one written on an earlier day (by the operator's own
Archiver on a clock set to that day, the day taken from the younger archive's recorded time). The
operator's pass runs when it starts acting, then every interval: the test starts it after that archive
is there and waits for the deletion it observes. Then the Run's own archive, once older than the
retention: the same pass (ArchiveRetention) run on a clock the test moves to the boundary the archive's
recorded time gives, one second short of it (kept), then on it (deleted); nothing waits for time to pass.

The module runs its own control plane: the session's operator (cluster-wide) would act on these Runs too,
and the retention pass below sweeps the whole store."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agentrun.api import Run
from agentrun.core.plan import ArchiveRun
from agentrun.operator.archive import Archiver, ArchiveRetention
from agentrun.statestore import archives as stored
from devcluster.cluster import LocalCluster
from devcluster.processes import free_port
from integration.namespaced.test_archive import created, start_operator, store_of, wait_deleted, with_store
from integration.namespaced.test_metrics import scrape, value
from integration.test_state_store_worker import cli_with_store
from support.clock import FakeClock
from support.clusters import cluster_kube, operator_identity, started_cluster
from support.kube import Kube, wait_for
from support.runs import GROUP, VERSION, create_run, scenario_run, wait_phase

pytestmark = pytest.mark.cluster

# A day: an archive written now stays however long the test takes (it is younger than this, whatever the
# time of day), and one written the day before yesterday is past it.
RETENTION = 86_400


@pytest.fixture(scope="module")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Overrides the session's: a control plane (and object store) of this module's own. The retention
    pass sweeps every archived namespace of its store, on a clock moved a day on: it would delete the
    archives of any module sharing the store."""
    yield from started_cluster(tmp_path_factory, "retention-cluster")


@pytest.fixture(scope="module")
def kube(local_cluster: LocalCluster) -> Kube:
    return cluster_kube(local_cluster)


@pytest.fixture(scope="module")
def operator_kubeconfig(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return operator_identity(kube, tmp_path_factory)


def recorded(entry: stored.ArchiveEntry) -> datetime:
    """The time the archive was written, as its index entry records it."""
    return datetime.fromisoformat(entry.archived_time.replace("Z", "+00:00"))


def day_end(entry: stored.ArchiveEntry) -> datetime:
    start = datetime.fromisoformat(entry.day).replace(tzinfo=UTC)
    return start + timedelta(days=1)


def archived(cluster: LocalCluster, ns: str) -> dict[str, stored.ArchiveEntry]:
    """The namespace's archives as the index lists them, by Run uid."""
    return {entry.uid: entry for entry in asyncio.run(stored.archived_runs(store_of(cluster), ns))}


def days_indexed(cluster: LocalCluster, ns: str) -> set[str]:
    """The days the namespace's index has segments for (a day deleted may leave its folder, empty, on a
    store over a file system such as versitygw's posix backend)."""
    store = store_of(cluster)
    prefix = stored.index_prefix(store, ns)
    return {key.removeprefix(prefix).split("/")[0] for key in asyncio.run(store.list_keys(prefix))}


def present(cluster: LocalCluster, key: str) -> bool:
    return asyncio.run(store_of(cluster).read_key(key)) is not None


def archive_on_an_earlier_day(kube: Kube, cluster: LocalCluster, ns: str, name: str, when: datetime) -> str:
    """Archives the Run, succeeded, as the operator's Archiver would have at `when` (its clock set so),
    then deletes it as the operator does after its archive; returns its uid."""
    run = Run.model_validate(wait_phase(kube, ns, name, {"Succeeded"}, timeout=120))
    action = ArchiveRun(
        document={"object": run.model_dump(mode="json", by_alias=True, exclude_none=True)},
        summary={"phase": "Succeeded", "attempts": 1},
    )
    entry = asyncio.run(Archiver(store_of(cluster), FakeClock(now=when), None).archive(run, action))
    assert entry.day == when.strftime("%Y-%m-%d"), entry
    kube.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, "runs", name)
    return str(run.metadata.uid)


def test_the_retention_pass_deletes_archives_past_the_retention_and_keeps_the_younger(
    kube: Kube, local_cluster: LocalCluster, run_namespace: str, operator_kubeconfig: Path, tmp_path: Path
) -> None:
    ns, log = run_namespace, tmp_path / "operator.log"
    settings = {**with_store(local_cluster), "AGENTRUN_ARCHIVE_RETENTION_SECONDS": str(RETENTION)}

    # a Run with ttlSecondsAfterFinished 0 is archived, verified and deleted by the operator (retention on)
    operator = start_operator(operator_kubeconfig, log, ns, **settings)
    try:
        young = created(kube, ns, scenario_run("young", {"steps": 1}, ttlSecondsAfterFinished=0))
        wait_deleted(kube, ns, "young", young, operator)
        create_run(kube, ns, scenario_run("earlier", {"steps": 1}))  # kept: no ttlSecondsAfterFinished
        wait_phase(kube, ns, "earlier", {"Succeeded"}, timeout=120)
    finally:
        operator.stop()
    kept = archived(local_cluster, ns)[young]

    # another Run archived on a day whose end is the retention past the young archive's recorded time
    when = recorded(kept) - timedelta(seconds=RETENTION, days=1)
    earlier = archive_on_an_earlier_day(kube, local_cluster, ns, "earlier", when)
    old = archived(local_cluster, ns)[earlier]
    assert day_end(old) + timedelta(seconds=RETENTION) <= recorded(kept), (old, kept)
    listed = cli_with_store(kube, local_cluster, ns, "history")
    assert listed.returncode == 0, listed.stderr
    assert young in listed.stdout and earlier in listed.stdout, listed.stdout

    # the operator (restarted: its pass runs when it starts acting) deletes the old archive, then its index
    port = free_port()
    operator = start_operator(operator_kubeconfig, log, ns, **settings, AGENTRUN_METRICS_PORT=str(port))
    try:
        try:
            wait_for(
                lambda: earlier not in archived(local_cluster, ns) and not present(local_cluster, old.key),
                timeout=120,
                what="the archive past the retention deleted, and its index entry",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{operator.log_tail()}") from None
        said = f"archive retention: deleted 1 archives of {ns} archived on {old.day}"
        wait_for(lambda: said in log.read_text(), timeout=120, what="the pass's log line")
        assert value(scrape(port), "agentrun_run_archives_expired_total") == 1
    finally:
        operator.stop()
    # the same pass looked at the young archive's day and kept it: younger than the retention
    assert datetime.now(UTC) < recorded(kept) + timedelta(seconds=RETENTION)
    store = store_of(local_cluster)
    assert days_indexed(local_cluster, ns) == {kept.day}
    entry, document = asyncio.run(stored.read_archive(store, ns, "young"))  # read and verified
    assert (entry.uid, document["object"]["metadata"]["uid"]) == (young, young)
    listed = cli_with_store(kube, local_cluster, ns, "history")
    assert listed.returncode == 0, listed.stderr
    assert young in listed.stdout and earlier not in listed.stdout, listed.stdout
    gone = cli_with_store(kube, local_cluster, ns, "describe", "--archived", "earlier")
    assert gone.returncode != 0, gone.stdout

    # the Run's own archive, once older than the retention: the pass on a clock at the boundary its
    # recorded day gives (a second short of it: kept; on it: deleted, the document, then the index)
    clock = FakeClock(now=day_end(kept) + timedelta(seconds=RETENTION - 1))
    retention = ArchiveRetention(Archiver(store, clock, None), RETENTION)
    assert asyncio.run(retention.pass_once()) == 0
    assert young in archived(local_cluster, ns) and present(local_cluster, kept.key)
    clock.advance(1)
    assert asyncio.run(retention.pass_once()) == 1
    assert archived(local_cluster, ns) == {} and not present(local_cluster, kept.key)
    assert days_indexed(local_cluster, ns) == set()
    assert asyncio.run(retention.pass_once()) == 0  # the day's folder may stay, empty: nothing more to do
    listed = cli_with_store(kube, local_cluster, ns, "history")
    assert listed.returncode == 0, listed.stderr
    assert young not in listed.stdout and earlier not in listed.stdout, listed.stdout
    assert f"No archived runs in namespace {ns}." in listed.stdout + listed.stderr, listed
