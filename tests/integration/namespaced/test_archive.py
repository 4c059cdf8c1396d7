"""Finished Runs leave the cluster, archive first (docs/state-store.md, "Archives of finished Runs"), on the
namespaced control plane (conftest.py) with its real S3 server (versitygw) and kube-controller-manager (the
garbage collector that takes a deleted Run's owned objects): a Run with ttlSecondsAfterFinished 0 is archived,
verified and deleted, and `history` / `describe --archived` show it; the same name recreated keeps both
archives; a store that is down delays the deletion, and the operator restarted with the store back archives
and deletes; without a store the Run is kept with Archived=False (NoStateStore); a NeedsReconciliation Run
never expires.

Each test's operator watches only its namespace (the session's cluster-wide operator is not on this control
plane: conftest.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from agentrun.statestore import BlobStore
from agentrun.statestore import archives as stored
from devcluster import security
from devcluster.cluster import LocalCluster
from devcluster.operator import OperatorProcess
from devcluster.processes import free_port
from devcluster.tickets import TicketServiceProcess
from integration.test_side_effects import side_effects, ticket_run
from integration.test_state_store_worker import cli_with_store
from support.kube import Kube, wait_for
from support.runs import GROUP, VERSION, attempts, create_run, get_run, scenario_run, wait_phase

pytestmark = pytest.mark.cluster


def start_operator(kubeconfig: Path, log: Path, namespace: str, **env: str) -> OperatorProcess:
    process = OperatorProcess(
        kubeconfig,
        log,
        env={"AGENTRUN_METRICS_PORT": str(free_port()), **security.OPERATOR_ENV, **env},
        args=[f"--namespace={namespace}"],
    )
    process.start()
    process.wait_ready()
    return process


def with_store(cluster: LocalCluster, url: str | None = None) -> dict[str, str]:
    """The operator's store settings and its own credentials for it (the whole bucket)."""
    return {**security.state_store_operator_env(url or cluster.state_store_url), **cluster.state_store_env()}


@pytest.fixture
def operator(
    local_cluster: LocalCluster, run_namespace: str, operator_kubeconfig: Path, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The operator for this test's namespace, with the state store."""
    process = start_operator(
        operator_kubeconfig, tmp_path / "operator.log", run_namespace, **with_store(local_cluster)
    )
    try:
        yield process
    finally:
        process.stop()


def store_of(cluster: LocalCluster) -> BlobStore:
    return BlobStore.from_url(cluster.state_store_url, env=cluster.state_store_env())


def gone(kube: Kube, ns: str, name: str, uid: str | None = None) -> bool:
    """The Run (with `uid`, when given) is no longer there."""
    try:
        run = get_run(kube, ns, name)
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return uid is not None and run["metadata"]["uid"] != uid


def wait_deleted(kube: Kube, ns: str, name: str, uid: str, operator: OperatorProcess) -> None:
    try:
        wait_for(lambda: gone(kube, ns, name, uid), timeout=120, what=f"run {name} ({uid}) deleted")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{operator.log_tail()}") from None


def created(kube: Kube, ns: str, body: dict[str, Any]) -> str:
    """Creates the Run; returns its uid (a Run with ttlSecondsAfterFinished 0 may be gone soon after)."""
    made: dict[str, Any] = kube.custom.create_namespaced_custom_object(GROUP, VERSION, ns, "runs", body)
    return str(made["metadata"]["uid"])


def test_an_expired_run_is_archived_verified_and_deleted_and_history_shows_it(
    kube: Kube, local_cluster: LocalCluster, run_namespace: str, operator: OperatorProcess
) -> None:
    ns, name = run_namespace, "echo"
    # expires an hour after it succeeded: status.expiresTime says so; then shortened to 0
    first = created(kube, ns, scenario_run(name, {"steps": 2}, ttlSecondsAfterFinished=3600))
    run = wait_for(
        lambda: (r := get_run(kube, ns, name)).get("status", {}).get("expiresTime") and r,
        timeout=120,
        what="status.expiresTime",
    )
    [ended] = [c for c in run["status"]["conditions"] if c["type"] == "Succeeded"]
    assert run["status"]["expiresTime"] > ended["lastTransitionTime"]
    kube.custom.patch_namespaced_custom_object(
        GROUP, VERSION, ns, "runs", name, {"spec": {"ttlSecondsAfterFinished": 0}}
    )
    wait_deleted(kube, ns, name, first, operator)

    # its archive is in the store, indexed and verified, naming the blobs it needs
    entry, document = asyncio.run(stored.read_archive(store_of(local_cluster), ns, name))
    assert (entry.uid, entry.phase, entry.attempts) == (first, "Succeeded", 1)
    assert entry.key == f"{stored.archives_prefix(store_of(local_cluster))}{ns}/{name}/{first}.json"
    assert document["object"]["metadata"]["uid"] == first
    assert [a["status"]["phase"] for a in document["attempts"]] == ["Succeeded"]
    assert any(told["reason"] == "Succeeded" for told in document["story"])
    # the garbage collector takes what the Run owned
    wait_for(lambda: attempts(kube, ns, name) == [], timeout=120, what="the Run's Attempts collected")

    listed = cli_with_store(kube, local_cluster, ns, "history")
    assert listed.returncode == 0, listed.stderr
    assert first in listed.stdout and "Succeeded" in listed.stdout
    shown = cli_with_store(kube, local_cluster, ns, "describe", "--archived", name)
    assert shown.returncode == 0, shown.stderr
    assert f"uid {first}; sha256 {entry.sha256}, verified" in shown.stdout
    assert "attempt 1 Succeeded" in shown.stdout, shown.stdout
    # the same with the namespace's read-only principal and its bucket's URL: what people hold
    listed = cli_with_store(kube, local_cluster, ns, "history", read_only=True)
    assert listed.returncode == 0 and first in listed.stdout, listed.stderr
    shown = cli_with_store(kube, local_cluster, ns, "describe", "--archived", name, read_only=True)
    assert shown.returncode == 0 and f"uid {first}; sha256 {entry.sha256}, verified" in shown.stdout

    # the same name again: a second archive beside the first, neither hidden nor overwritten
    second = created(kube, ns, scenario_run(name, {"steps": 1}, ttlSecondsAfterFinished=0))
    assert second != first
    wait_deleted(kube, ns, name, second, operator)
    listed = cli_with_store(kube, local_cluster, ns, "history")
    assert listed.returncode == 0, listed.stderr
    assert first in listed.stdout and second in listed.stdout, listed.stdout
    earlier = cli_with_store(kube, local_cluster, ns, "describe", "--archived", name, "--uid", first)
    assert earlier.returncode == 0 and f"uid {first};" in earlier.stdout, earlier.stderr
    latest = cli_with_store(kube, local_cluster, ns, "describe", "--archived", name)
    assert f"uid {second};" in latest.stdout


def test_a_store_that_is_down_delays_the_deletion_and_loses_nothing(
    kube: Kube,
    local_cluster: LocalCluster,
    run_namespace: str,
    operator_kubeconfig: Path,
    tmp_path: Path,
) -> None:
    ns, name = run_namespace, "delayed"
    # the store's endpoint answers nothing: the archive cannot be written
    down = f"s3://agentrun/state?endpoint=http://127.0.0.1:{free_port()}&region=us-east-1"
    log = tmp_path / "operator.log"
    process = start_operator(operator_kubeconfig, log, ns, **with_store(local_cluster, down))
    try:
        uid = created(kube, ns, scenario_run(name, {"steps": 1}, ttlSecondsAfterFinished=0))
        wait_phase(kube, ns, name, {"Succeeded"}, timeout=120)
        wait_for(
            lambda: "state store unavailable" in log.read_text(), timeout=120, what="the archive's failure"
        )
        assert not gone(kube, ns, name), "never deleted before its archive is verified"
        # the store is back (the operator restarted with it): the Run is archived, then deleted
        process.stop()
        process = start_operator(operator_kubeconfig, log, ns, **with_store(local_cluster))
        wait_deleted(kube, ns, name, uid, process)
    finally:
        process.stop()
    entry, _ = asyncio.run(stored.read_archive(store_of(local_cluster), ns, name))
    assert entry.uid == uid


def test_without_a_store_the_run_is_kept_and_says_why(
    kube: Kube, run_namespace: str, operator_kubeconfig: Path, tmp_path: Path
) -> None:
    ns, name = run_namespace, "kept"
    process = start_operator(operator_kubeconfig, tmp_path / "operator.log", ns)
    try:
        create_run(kube, ns, scenario_run(name, {"steps": 1}, ttlSecondsAfterFinished=0))
        wait_phase(kube, ns, name, {"Succeeded"}, timeout=120)

        def archived_condition() -> dict[str, Any] | None:
            conditions = get_run(kube, ns, name)["status"].get("conditions", [])
            return next((c for c in conditions if c["type"] == "Archived"), None)

        condition = wait_for(archived_condition, timeout=120, what="condition Archived")
    finally:
        process.stop()
    assert (condition["status"], condition["reason"]) == ("False", "NoStateStore")
    run = get_run(kube, ns, name)
    assert "expiresTime" not in run["status"], "it will not be deleted"


def test_a_run_that_needs_reconciliation_never_expires(
    kube: Kube,
    local_cluster: LocalCluster,
    run_namespace: str,
    operator: OperatorProcess,
    tickets: TicketServiceProcess,
) -> None:
    ns = run_namespace
    tickets.set_faults(dropCreateRequests=1)
    body = ticket_run("open", tickets, reversible=False)
    body["spec"]["ttlSecondsAfterFinished"] = 0
    create_run(kube, ns, body)
    run = wait_phase(kube, ns, "open", {"NeedsReconciliation", "Succeeded", "Failed"}, timeout=120)
    assert run["status"]["phase"] == "NeedsReconciliation", (run["status"], operator.log_tail())
    # a Run that expires at once, created after: once it is gone, the operator had its turn at both
    sentinel = created(kube, ns, scenario_run("sentinel", {"steps": 1}, ttlSecondsAfterFinished=0))
    wait_deleted(kube, ns, "sentinel", sentinel, operator)
    run = get_run(kube, ns, "open")
    assert run["status"]["phase"] == "NeedsReconciliation"
    assert "expiresTime" not in run["status"]
    assert [e["status"]["state"] for e in side_effects(kube, ns, "open")] == ["Unknown"]
    history = asyncio.run(stored.archived_runs(store_of(local_cluster), ns))
    assert [e.name for e in history] == ["sentinel"]
