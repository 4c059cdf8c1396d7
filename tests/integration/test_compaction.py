"""A finished Run leaves the API server lighter, on the real control plane with its versitygw: its
Checkpoint index goes to the store and its superseded Checkpoints and Lease are deleted (describe and
state still find them), the Pod of each ended Attempt is deleted after the tail of its log was kept
(`kubectl agentrun logs` shows it; podGC Never keeps the Pod), and an operator that dies between the
index and the deletions finishes the job when it comes back. (Every crash point, in memory:
tests/unit/test_core_runs_simulation.py; the rules: tests/unit/test_core_runs_compaction.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from agentrun.api import lease_name
from devcluster.cluster import LocalCluster
from devcluster.operator import OperatorProcess
from devcluster.security import OPERATOR_SERVICE_ACCOUNT, STATE_STORE_SECRET
from integration.test_cli import cli
from integration.test_state_store_worker import cli_with_store, read_blob
from support.kube import Kube, wait_for
from support.runs import GROUP, VERSION, attempts, create_run, get_run, support_agent_run, wait_phase

pytestmark = pytest.mark.cluster

ENDED = {"Succeeded", "Failed", "Cancelled", "NeedsReconciliation"}
KINDS = ("runs", "attempts", "checkpoints", "sideeffects")


def finishing_run(name: str, cluster: LocalCluster, **spec: Any) -> dict[str, Any]:
    """The finishing agent (support/finishing_agent.py), with the cluster's store for its states."""
    podgc = spec.pop("podGC", None)
    body = support_agent_run(name, "finishing_agent", spec)
    body["spec"]["agent"]["env"] += [
        {"name": "AGENTRUN_STATE_STORE_URL", "value": cluster.state_store_url},
        *(
            {"name": key, "valueFrom": {"secretKeyRef": {"name": STATE_STORE_SECRET, "key": key}}}
            for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
        ),
    ]
    if podgc:
        body["spec"]["podGC"] = podgc
    return body


def owned(kube: Kube, ns: str, kind: str, run: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, ns, kind, label_selector=f"agentrun.dev/run={run}"
    )["items"]
    return items


def lease(kube: Kube, ns: str, run: str) -> dict[str, Any] | None:
    return kube.get("lease", lease_name(run), ns)


def stored_bytes(kube: Kube, ns: str, run: str) -> int:
    """What the Run keeps in the API server: the JSON of its objects as `kubectl get -o json
    --show-managed-fields` prints them (runs, attempts, checkpoints, sideeffects, its lease)."""
    total = len(json.dumps(kube.get("run", run, ns)))
    for kind in KINDS[1:]:
        total += sum(len(json.dumps(o)) for o in owned(kube, ns, kind, run))
    held = lease(kube, ns, run)
    return total + (len(json.dumps(held)) if held else 0)


def compacted(kube: Kube, ns: str, name: str, keep: int = 1) -> dict[str, Any]:
    """The Run once its index is recorded, its Lease gone and only `keep` Checkpoints left."""

    def probe() -> dict[str, Any] | None:
        run = get_run(kube, ns, name)
        done = "checkpointIndex" in run.get("status", {}) and lease(kube, ns, name) is None
        return run if done and len(owned(kube, ns, "checkpoints", name)) == keep else None

    return wait_for(probe, 120, interval=0.2, what=f"Run {name} compacted")


def test_a_finished_run_shrinks_and_stays_readable(
    kube: Kube, local_cluster: LocalCluster, run_namespace: str, operator: OperatorProcess
) -> None:
    ns, name = run_namespace, "shrinks"
    create_run(kube, ns, finishing_run(name, local_cluster, checkpoints=6, stateBytes=20_000, effects=2))
    run = wait_phase(kube, ns, name, ENDED, timeout=120)
    assert run["status"]["phase"] == "Succeeded", (run["status"], operator.log_tail())

    run = compacted(kube, ns, name)
    [kept] = owned(kube, ns, "checkpoints", name)
    assert kept["spec"]["id"] == run["status"]["latestCheckpoint"]
    index = run["status"]["checkpointIndex"]
    assert index["links"] is True
    assert index["key"].startswith(f"{ns}/{run['metadata']['uid']}/sha256/")
    entries = read_blob(local_cluster, index)["checkpoints"]
    assert [e["step"] for e in entries] == [f"step-{n}" for n in range(1, 7)]
    assert all("state" not in e and "stateRef" in e for e in entries), "the index holds references only"
    assert stored_bytes(kube, ns, name) <= 24 * 1024
    assert len(owned(kube, ns, "sideeffects", name)) == 2  # the ledger stays with the Run

    # the Pod went once its log tail was kept, and the tail is what `logs` shows
    assert len(attempts(kube, ns, name)) == 1
    wait_for(lambda: kube.pod(f"{name}-a1", ns) is None, 120, interval=0.2, what="the Pod collected")
    assert "ref" in get_attempt(kube, ns, f"{name}-a1")["status"]["logTail"]
    shown = cli_with_store(kube, local_cluster, ns, "logs", name)
    assert shown.returncode == 0, shown.stderr
    assert f"{name}-a1: step 6 of 6" in shown.stdout

    # describe lists every Checkpoint from the index; state reads a superseded one's state, verified
    described = cli_with_store(kube, local_cluster, ns, "describe", name)
    assert described.returncode == 0, described.stderr
    for n in range(1, 7):
        assert f"{name}-a1-s{n}" in described.stdout
    first = next(e for e in entries if e["step"] == "step-1")
    state = cli_with_store(kube, local_cluster, ns, "state", name, "--checkpoint", first["id"], "-o", "json")
    assert state.returncode == 0, state.stderr
    assert json.loads(state.stdout)["step"] == 1
    without_store = cli(kube, ns, "describe", name)
    assert without_store.returncode == 0, without_store.stderr
    assert "set AGENTRUN_STATE_STORE_URL" in without_store.stderr


def get_attempt(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, "attempts", name)
    return found


def test_a_failed_attempts_pod_is_gone_and_its_log_tail_stays(
    kube: Kube, local_cluster: LocalCluster, run_namespace: str, operator: OperatorProcess
) -> None:
    ns, name, marker = run_namespace, "fails", "marker-7f3a"
    create_run(
        kube, ns, finishing_run(name, local_cluster, checkpoints=2, failAttempts=[1], failMarker=marker)
    )
    run = wait_phase(kube, ns, name, ENDED, timeout=120)
    assert run["status"]["phase"] == "Failed", (run["status"], operator.log_tail())

    wait_for(
        lambda: kube.pod(f"{name}-a1", ns) is None, 120, interval=0.2, what="the failed Attempt's Pod gone"
    )
    tail = get_attempt(kube, ns, f"{name}-a1")["status"]["logTail"]
    assert "ref" in tail
    shown = cli_with_store(kube, local_cluster, ns, "logs", name, "--attempt", "1")
    assert shown.returncode == 0, shown.stderr
    assert marker in shown.stdout
    assert "RuntimeError" in shown.stdout  # the traceback, written to stderr, is in the log
    assert "kept when its Pod was deleted" in shown.stderr


def test_pod_gc_never_keeps_the_pod(
    kube: Kube, local_cluster: LocalCluster, run_namespace: str, operator: OperatorProcess
) -> None:
    ns, name = run_namespace, "keeps-pod"
    create_run(kube, ns, finishing_run(name, local_cluster, checkpoints=2, podGC="Never"))
    run = wait_phase(kube, ns, name, ENDED, timeout=120)
    assert run["status"]["phase"] == "Succeeded", (run["status"], operator.log_tail())

    compacted(kube, ns, name)  # the decisions after the end have been made: the Pod is kept
    pod = kube.pod(f"{name}-a1", ns)
    assert pod is not None and pod["status"]["phase"] == "Succeeded"
    assert "logTail" not in get_attempt(kube, ns, f"{name}-a1")["status"]
    shown = cli(kube, ns, "logs", name)  # the live Pod's log, through the node's containerLogs
    assert shown.returncode == 0, shown.stderr
    assert f"{name}-a1: step 2 of 2" in shown.stdout


def may_delete_checkpoints(kube: Kube, allowed: bool) -> None:
    """Gives the operator's ClusterRole the Checkpoint delete verb, or takes it away."""
    role = json.loads(kube.kubectl("get", "clusterrole", OPERATOR_SERVICE_ACCOUNT, "-o", "json").stdout)
    for rule in role["rules"]:
        if "checkpoints" in rule.get("resources", []):
            verbs = [v for v in rule["verbs"] if v != "delete"]
            rule["verbs"] = [*verbs, "delete"] if allowed else verbs
    kube.rbac.patch_cluster_role(OPERATOR_SERVICE_ACCOUNT, {"rules": role["rules"]})


@pytest.fixture
def checkpoints_undeletable(kube: Kube) -> Iterator[None]:
    """The operator may not delete Checkpoints until the test gives the verb back: a compaction stops,
    for certain, between its index and its deletions."""
    may_delete_checkpoints(kube, allowed=False)
    try:
        yield
    finally:
        may_delete_checkpoints(kube, allowed=True)


def test_an_operator_restarted_mid_compaction_finishes_it(
    kube: Kube,
    local_cluster: LocalCluster,
    run_namespace: str,
    operator: OperatorProcess,
    checkpoints_undeletable: None,
) -> None:
    ns, name = run_namespace, "restarted"
    create_run(kube, ns, finishing_run(name, local_cluster, checkpoints=4, stateBytes=20_000))
    run = wait_phase(kube, ns, name, ENDED, timeout=120)
    assert run["status"]["phase"] == "Succeeded", (run["status"], operator.log_tail())

    def half_done() -> dict[str, Any] | None:
        found = get_run(kube, ns, name)
        return found if "checkpointIndex" in found["status"] and lease(kube, ns, name) is None else None

    index = wait_for(half_done, 120, interval=0.2, what="the index written, the Lease deleted")["status"]
    assert len(owned(kube, ns, "checkpoints", name)) == 4  # the deletions were refused
    operator.kill()  # dies half-way; it comes back allowed to finish
    may_delete_checkpoints(kube, allowed=True)
    operator.start()
    operator.wait_ready()

    run = compacted(kube, ns, name)
    assert run["status"]["checkpointIndex"] == index["checkpointIndex"], "written again, it is the same blob"
    assert len(read_blob(local_cluster, run["status"]["checkpointIndex"])["checkpoints"]) == 4


def managed(kube: Kube, ns: str, name: str) -> list[str]:
    """The Run's objects (the Run, its Attempts, Checkpoints and SideEffects) that carry managedFields."""
    objects = [get_run(kube, ns, name), *(o for kind in KINDS[1:] for o in owned(kube, ns, kind, name))]
    return [f"{o['kind']}/{o['metadata']['name']}" for o in objects if o["metadata"].get("managedFields")]


def test_a_compacted_run_keeps_no_managed_fields_even_after_a_later_write(
    kube: Kube, local_cluster: LocalCluster, run_namespace: str, operator: OperatorProcess
) -> None:
    ns, name = run_namespace, "unmanaged"
    create_run(kube, ns, finishing_run(name, local_cluster, checkpoints=3, stateBytes=20_000, effects=2))
    run = wait_phase(kube, ns, name, ENDED, timeout=120)
    assert run["status"]["phase"] == "Succeeded", (run["status"], operator.log_tail())
    compacted(kube, ns, name)
    wait_for(lambda: kube.pod(f"{name}-a1", ns) is None, 120, interval=0.2, what="the Pod collected")
    before = {kind: owned(kube, ns, kind, name) for kind in KINDS[1:]}

    wait_for(lambda: not managed(kube, ns, name), 120, interval=0.2, what="every managedFields cleared")
    run = get_run(kube, ns, name)
    # what a person reads is all there: nothing but the managedFields went
    assert run["status"]["phase"] == "Succeeded" and "checkpointIndex" in run["status"]
    assert run["status"]["report"] and run["status"]["conditions"]
    for kind in KINDS[1:]:
        after = {o["metadata"]["name"]: o for o in owned(kube, ns, kind, name)}
        for o in before[kind]:
            kept = after[o["metadata"]["name"]]
            assert (kept.get("spec"), kept.get("status")) == (o.get("spec"), o.get("status")), kind

    # A plain write does not start the record again (the API server tracks no fields on an update of an
    # object that has none); a server-side apply does, and the operator, back, clears it again.
    kube.kubectl("annotate", f"runs.{GROUP}/{name}", "team=blue", namespace=ns)
    assert not managed(kube, ns, name)
    operator.kill()
    annotated = {"name": name, "annotations": {"owner": "alice"}}
    applied = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Run", "metadata": annotated}
    kube.kubectl(
        "apply", "--server-side", "--field-manager=alice", "-f", "-", input=json.dumps(applied), namespace=ns
    )
    assert managed(kube, ns, name) == [f"Run/{name}"]
    operator.start()
    operator.wait_ready()
    wait_for(lambda: not managed(kube, ns, name), 120, interval=0.2, what="the new entries cleared")
    annotations = get_run(kube, ns, name)["metadata"]["annotations"]
    assert (annotations["team"], annotations["owner"]) == ("blue", "alice")
