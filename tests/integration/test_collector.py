"""The one collector on the real control plane and its S3 server (versitygw): a Run's blobs stay while
the Run lives, a blob nobody references is marked, quarantined and deleted after the grace periods, and
a deleted Run's blobs become garbage. The sweeps are driven one by one on a clock the test moves (set
from the store's own last-modified times), so nothing waits for a duration; the operator's own loop
is shown by a namespaced operator with short periods, followed through its metrics.
(The decisions: tests/unit/test_core_collector.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrun.core.collector import (
    BlobAddress,
    CollectorSettings,
    StoredBlob,
    Sweep,
    live_address,
    relative_key,
)
from agentrun.kubeapi import KubeApi, load_configuration
from agentrun.operator.collector import Collector, CollectorMetrics
from agentrun.statestore import BlobRef, StateUnverifiable
from agentrun.statestore.documents import document_refs, refs_in
from agentrun.statestore.operatorstore import OperatorStore
from devcluster import security
from devcluster.cluster import LocalCluster
from devcluster.operator import OperatorProcess
from devcluster.processes import free_port
from integration.namespaced.test_metrics import scrape, value
from integration.test_state_store_worker import ENDED, big_state_run, checkpoints
from support.clock import FakeClock
from support.kube import Kube, wait_for
from support.runs import GROUP, VERSION, attempts, create_run, get_run, wait_phase

pytestmark = pytest.mark.cluster

GRACE = 60.0
SETTINGS = CollectorSettings(grace_seconds=GRACE, quarantine_seconds=GRACE)


def operator_store(cluster: LocalCluster) -> OperatorStore:
    return OperatorStore.from_url(cluster.state_store_url, env=cluster.state_store_env())


class Sweeps:
    """One collector for one namespace, its sweeps run one at a time on a clock the test moves."""

    def __init__(self, kube: Kube, cluster: LocalCluster, namespace: str) -> None:
        self.runner = asyncio.Runner()
        self.store = operator_store(cluster)
        self.api = KubeApi(load_configuration(str(kube.kubeconfig)))
        self.namespace = namespace
        self.clock = FakeClock(now=max(blob.last_modified for blob in self.listing()))
        self.collector = Collector(
            self.api,
            self.store,
            SETTINGS,
            clock=self.clock,
            interval_seconds=GRACE,
            namespaces=(namespace,),
            metrics=CollectorMetrics(None),
        )

    def listing(self) -> list[StoredBlob]:
        return [
            *self.runner.run(self.store.list_blobs(self.namespace)),
            *self.runner.run(self.store.list_blobs(f"_quarantine/{self.namespace}")),
        ]

    def after(self, seconds: float) -> Sweep:
        self.clock.advance(seconds)
        return self.runner.run(self.collector.sweep())

    def readable(self, ref: BlobRef) -> bytes:
        return self.runner.run(self.store.get(ref))

    def address(self, ref: BlobRef) -> BlobAddress:
        found = live_address(relative_key(self.store.location.prefix, ref.key) or "")
        assert found is not None, ref.key
        return found

    def __enter__(self) -> Sweeps:
        return self

    def __exit__(self, *_: object) -> None:
        self.runner.run(self.api.aclose())
        self.runner.close()


def references_of_run(kube: Kube, local_cluster: LocalCluster, ns: str, name: str) -> list[BlobRef]:
    """Every blob the finished Run's objects name, once the operator is done with it (its Checkpoint index
    written, its Pods collected after their log tails were kept), with what the documents they name name
    in turn (the checkpoint index): what the collector must keep."""

    def finished() -> dict[str, Any] | None:
        run = get_run(kube, ns, name)
        pods = kube.core.list_namespaced_pod(ns, label_selector=f"agentrun.dev/run={name}").items
        return run if run["status"].get("checkpointIndex") and not pods else None

    run = wait_for(finished, timeout=120, what=f"run {name} compacted and its Pods collected")
    objects = [run, *attempts(kube, ns, name), *checkpoints(kube, ns, name)]
    found = {ref for body in objects for ref in refs_in([body.get("spec"), body.get("status")])}
    store, documents = operator_store(local_cluster), [ref for ref in found if ref.links]
    while documents:
        named = set(document_refs(asyncio.run(store.get(documents.pop()))))
        documents += [ref for ref in named - found if ref.links]
        found |= named
    return sorted(found, key=lambda ref: ref.key)


def test_a_runs_blobs_stay_while_it_lives_and_garbage_goes_after_mark_and_quarantine(
    kube: Kube, local_cluster: LocalCluster, run_namespace: str, operator: OperatorProcess
) -> None:
    ns, name = run_namespace, "kept"
    create_run(kube, ns, big_state_run(name, local_cluster, steps=3, outputBytes=20_000, resultBytes=40_000))
    run = wait_phase(kube, ns, name, ENDED, timeout=180)
    assert run["status"]["phase"] == "Succeeded", (run["status"], operator.log_tail())
    referenced = references_of_run(kube, local_cluster, ns, name)
    assert len(referenced) >= 5  # three states, the result and the checkpoint index, at least
    # what Attempts that died between an upload and the object naming it leave behind
    store, uid = operator_store(local_cluster), run["metadata"]["uid"]
    lost = asyncio.run(store.put(ns, uid, b"uploaded, never referenced " * 1000))
    wanted_data = b"uploaded, named again later " * 1000
    wanted = asyncio.run(store.put(ns, uid, wanted_data))

    with Sweeps(kube, local_cluster, ns) as sweeps:
        kept = {sweeps.address(ref) for ref in referenced}
        garbage = {sweeps.address(lost), sweeps.address(wanted)}

        first = sweeps.after(0)  # every blob is younger than the grace period: none is touched
        assert first.marks.unreferenced_since == {}
        assert (first.quarantine, first.delete) == ((), ())
        assert first.referenced == len(kept)

        marked = sweeps.after(GRACE)
        assert set(marked.marks.unreferenced_since) == {a.key for a in garbage}
        assert marked.quarantine == ()

        moved = sweeps.after(GRACE)
        assert set(moved.quarantine) == garbage
        with pytest.raises(StateUnverifiable) as gone:
            sweeps.readable(wanted)
        assert gone.value.missing
        assert {a.quarantine_key for a in garbage} <= {blob.key for blob in sweeps.listing()}

        # another Run names one of them (as a writer that verified it just before the move would, or a
        # fork naming its source's blob): the next sweep restores it; the other is deleted for good
        naming = big_state_run("names-it", local_cluster, steps=1, outputBytes=10, names=wanted.to_json())
        create_run(kube, ns, naming)
        settled = sweeps.after(GRACE)
        assert settled.restore == (sweeps.address(wanted),)
        assert settled.delete == (sweeps.address(lost),)
        assert sweeps.readable(wanted) == wanted_data
        listed = {blob.key for blob in sweeps.listing()}
        assert {sweeps.address(lost).key, sweeps.address(lost).quarantine_key}.isdisjoint(listed)
        # the Run's own blobs were never marked, and read back verified
        assert {a.key for a in kept} <= listed
        for ref in referenced:
            sweeps.readable(ref)

        # a deleted Run's blobs become garbage (its Checkpoints go with it: owner references), except the
        # one the other Run names
        kube.custom.delete_namespaced_custom_object(
            GROUP, VERSION, ns, "runs", name, body={"propagationPolicy": "Foreground"}
        )

        def run_gone() -> bool:
            return not (run_named(kube, ns, name) or checkpoints(kube, ns, name) or attempts(kube, ns, name))

        wait_for(
            run_gone,
            timeout=120,
            what=f"Run {name} and its Checkpoints and Attempts deleted",
        )
        assert set(sweeps.after(GRACE).marks.unreferenced_since) == {a.key for a in kept}
        assert set(sweeps.after(GRACE).quarantine) == kept
        assert set(sweeps.after(GRACE).delete) == kept
        listed = {blob.key for blob in sweeps.listing()}
        assert sweeps.address(wanted).key in listed
        assert listed.isdisjoint({a.key for a in kept} | {a.quarantine_key for a in kept})
        assert sweeps.readable(wanted) == wanted_data


def run_named(kube: Kube, ns: str, name: str) -> bool:
    found = kube.custom.list_namespaced_custom_object(GROUP, VERSION, ns, "runs")
    return any(item["metadata"]["name"] == name for item in found["items"])


@pytest.fixture
def collecting_operator(
    local_cluster: LocalCluster, namespace: str, operator_kubeconfig: Path, tmp_path: Path
) -> Iterator[tuple[OperatorProcess, int]]:
    """An operator for `namespace` only, with the store's credentials and collection periods of a
    second: its loop sweeps that namespace's prefix, nothing else. The namespace has its bucket on the
    store (made with its principals, as for an opted-in namespace)."""
    local_cluster.namespace_store_env(namespace)
    port = free_port()
    process = OperatorProcess(
        operator_kubeconfig,
        tmp_path / "operator.log",
        env={
            "AGENTRUN_METRICS_PORT": str(port),
            **security.OPERATOR_ENV,
            **security.state_store_operator_env(local_cluster.state_store_url),
            **local_cluster.state_store_env(),
            "AGENTRUN_STATE_STORE_GC_INTERVAL_SECONDS": "0.2",
            "AGENTRUN_STATE_STORE_GC_GRACE_SECONDS": "1",
            "AGENTRUN_STATE_STORE_GC_QUARANTINE_SECONDS": "1",
        },
        args=[f"--namespace={namespace}"],
    )
    process.start()
    process.wait_ready()
    try:
        yield process, port
    finally:
        process.stop()
        local_cluster.forget_namespace_store(namespace)


def test_the_operators_loop_collects_an_unreferenced_blob(
    local_cluster: LocalCluster, namespace: str, collecting_operator: tuple[OperatorProcess, int]
) -> None:
    operator, port = collecting_operator
    store = operator_store(local_cluster)
    run_uid = "5a0c1d2e-3f40-4b5c-8d6e-7f8091a2b3c4"
    planted = asyncio.run(store.put(namespace, run_uid, b"nobody names this blob"))
    wait_for(
        lambda: value(scrape(port), "agentrun_state_store_blobs_collected_total") >= 1,
        timeout=120,
        what=f"the operator's collector to delete {planted.key}",
    )
    samples = scrape(port)
    assert value(samples, "agentrun_state_store_blobs_quarantined_total") == 1
    assert value(samples, "agentrun_state_store_blobs_collected_total") == 1
    assert value(samples, "agentrun_state_store_gc_sweeps_total", outcome="error") == 0
    assert asyncio.run(store.list_blobs(namespace)) == []
    assert asyncio.run(store.list_blobs(f"_quarantine/{namespace}")) == []
    log = operator.log_path.read_text()
    assert f"collector: quarantined {planted.key}" in log
    assert f"collector: deleted for good {planted.key}" in log
