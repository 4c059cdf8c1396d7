"""The worker SDK with the state store, on the real control plane and its versitygw: an agent whose state
outgrows the inline threshold is killed and resumes from the blobs, whole; its large result is committed
by reference; a blob replaced behind the Run's back stops the Run with StateUnverifiable for a person
(NeedsReconciliation), never continued from a different state. (The SDK's rules on a memory:// store:
tests/unit/test_worker_blobs.py.)"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import obstore
import pytest
from obstore.store import S3Store

from agentrun.api.budgets import stored_size
from agentrun.core.store_buckets import namespace_bucket
from agentrun.statestore import BlobRef, BlobStore
from agentrun.statestore.principals import Access
from agentrun.worker.blobs import INLINE_THRESHOLD
from devcluster.cluster import LocalCluster
from devcluster.objectstore import REGION
from devcluster.operator import OperatorProcess
from devcluster.security import STATE_STORE_SECRET
from integration.test_cli import argv, cli, env_for
from support.big_state_agent import digest, output
from support.kube import Kube, wait_for
from support.runs import (
    FAST_RETRY,
    GROUP,
    VERSION,
    attempts,
    create_run,
    get_run,
    resume,
    support_agent_run,
    wait_phase,
)

pytestmark = pytest.mark.cluster

ENDED = {"Succeeded", "Failed", "NeedsReconciliation", "Cancelled"}


def big_state_run(name: str, cluster: LocalCluster, **spec: Any) -> dict[str, Any]:
    """The big-state agent, told the cluster's store and its namespace's credentials Secret as the
    operator tells attempt Pods (core.pods.StateStorePodEnv: the same names, the same secretKeyRefs)."""
    body = support_agent_run(name, "big_state_agent", spec)
    body["spec"]["agent"]["env"] += [
        {"name": "AGENTRUN_STATE_STORE_URL", "value": cluster.state_store_url},
        *(
            {"name": key, "valueFrom": {"secretKeyRef": {"name": STATE_STORE_SECRET, "key": key}}}
            for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
        ),
    ]
    body["spec"]["retry"] = FAST_RETRY
    return body


def checkpoints(kube: Kube, ns: str, run: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, ns, "checkpoints", label_selector=f"agentrun.dev/run={run}"
    )["items"]
    return items


def read_blob(cluster: LocalCluster, ref: dict[str, Any]) -> Any:
    """A blob as any reader gets it: through the store, its size and sha256 checked."""
    store = BlobStore.from_url(cluster.state_store_url, env=cluster.state_store_env())
    return json.loads(asyncio.run(store.get(BlobRef.from_json(ref))))


def cli_with_store(
    kube: Kube, cluster: LocalCluster, ns: str, *args: str, read_only: bool = False
) -> subprocess.CompletedProcess[str]:
    """`kubectl agentrun ARGS` for a person who holds the store's URL and credentials; `read_only`: what
    the namespace's read-only Secret holds (its principal and its bucket's URL), not the store's root."""
    env = {**env_for(kube.kubeconfig), "AGENTRUN_STATE_STORE_URL": cluster.state_store_url}
    env |= cluster.state_store_env()
    if read_only:
        assert cluster.object_store is not None
        env |= cluster.object_store.namespace_credentials(ns, Access.READ).env()
        env["AGENTRUN_STATE_STORE_URL"] = cluster.namespace_store_url(ns)
    return subprocess.run(argv(ns, *args), env=env, capture_output=True, text=True, timeout=120, check=False)


def test_a_large_state_killed_mid_way_resumes_whole_from_the_store_and_commits_its_result_by_reference(
    kube: Kube, local_cluster: LocalCluster, run_namespace: str, operator: OperatorProcess
) -> None:
    ns, name, steps, size = run_namespace, "big", 5, 20_000
    create_run(
        kube,
        ns,
        big_state_run(name, local_cluster, steps=steps, outputBytes=size, killAt=3, resultBytes=40_000),
    )
    run = wait_phase(kube, ns, name, ENDED, timeout=180)
    assert run["status"]["phase"] == "Succeeded", (run["status"], operator.log_tail())
    assert [a["status"]["phase"] for a in attempts(kube, ns, name)] == ["Failed", "Succeeded"]

    # the result is over the inline threshold: committed by reference under the commit fence
    status = run["status"]
    assert "result" not in status
    assert status["committedBy"]["attempt"] == f"{name}-a2"
    ref = status["resultRef"]
    assert ref["key"].startswith(f"{ns}/{run['metadata']['uid']}/sha256/")
    result = read_blob(local_cluster, ref)
    full_state = {"outputs": [output(i, size) for i in range(steps)], "fetched": f"{name}-a1"}
    assert result["complete"] is True, "the resumed Attempt saw every output, each whole"
    assert result["stateDigest"] == digest(full_state)
    assert result["fetchedBy"] == f"{name}-a1", "the journaled fetch was replayed from the store"
    assert result["attempt"] == f"{name}-a2"
    assert len(result["padding"]) == 40_000

    # etcd holds references: every state and the journaled document went to the store. The finished Run
    # is compacted: its Checkpoint index (status.checkpointIndex) names every Checkpoint it saved.
    def indexed() -> dict[str, Any] | None:
        found: dict[str, Any] | None = get_run(kube, ns, name)["status"].get("checkpointIndex")
        return found

    index = wait_for(indexed, 120, what=f"{name}'s Checkpoint index")
    saved = [{"spec": entry} for entry in read_blob(local_cluster, index)["checkpoints"]]
    states = [c for c in saved if c["spec"].get("kind", "State") == "State"]
    journal = [c for c in saved if c["spec"].get("kind") == "Journal"]
    assert states
    assert journal
    for checkpoint in [*states, *journal]:
        spec = checkpoint["spec"]
        assert "stateRef" in spec, spec.get("id")
        assert stored_size(spec.get("state")) <= INLINE_THRESHOLD
    [entry] = journal
    assert read_blob(local_cluster, entry["spec"]["stateRef"])["result"]["by"] == f"{name}-a1"
    latest = next(c for c in states if c["spec"]["id"] == status["latestCheckpoint"])
    assert read_blob(local_cluster, latest["spec"]["stateRef"]) == full_state

    # people read them with the CLI: describe names the blob, state fetches and verifies it
    described = cli(kube, ns, "describe", name)
    assert described.returncode == 0, described.stderr
    assert f"Result:        in the state store at {ref['key']} ({ref['size']} bytes" in described.stdout
    shown = cli_with_store(kube, local_cluster, ns, "state", name, "--result", "-o", "json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == result
    assert "verified" in shown.stderr
    shown = cli_with_store(kube, local_cluster, ns, "state", name, "-o", "json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == full_state
    without_store = cli(kube, ns, "state", name, "--result")
    assert without_store.returncode == 1
    assert "set AGENTRUN_STATE_STORE_URL" in without_store.stderr
    assert f"namespace {ns} has no Secret {READ_SECRET}" in without_store.stderr
    no_history = cli(kube, ns, "history")
    assert no_history.returncode == 1
    assert "the history of archived Runs is in the state store" in no_history.stderr
    assert "set AGENTRUN_STATE_STORE_URL" in no_history.stderr

    # With the namespace's read-only Secret (as the operator makes it on its bundled store: the namespace's
    # URL and a principal that only reads), the CLI reads the store with the user's own credentials alone.
    kube.core.create_namespaced_secret(ns, read_only_secret(local_cluster, ns))
    alone = cli(kube, ns, "state", name, "--result", "-o", "json")
    assert alone.returncode == 0, alone.stderr
    assert json.loads(alone.stdout) == result
    # Someone who may read the Run but not get that Secret is told which Secret and which RBAC verb.
    refused = cli(kube, ns, "state", name, "--result", kubeconfig=run_reader(kube, ns))
    assert refused.returncode == 1, refused.stdout
    assert (
        f"read with the Secret {READ_SECRET} of namespace {ns}, which you may not get: ask for RBAC verb "
        f"`get` on secrets, resource name {READ_SECRET}, in namespace {ns}"
    ) in refused.stderr


READ_SECRET = f"{STATE_STORE_SECRET}-read"


def read_only_secret(cluster: LocalCluster, ns: str) -> dict[str, Any]:
    """The namespace's read-only Secret as the operator makes it (operator.store_credentials)."""
    assert cluster.object_store is not None
    values = cluster.object_store.namespace_credentials(ns, Access.READ).env()
    values["AGENTRUN_STATE_STORE_URL"] = cluster.namespace_store_url(ns)
    return {"metadata": {"name": READ_SECRET, "namespace": ns}, "type": "Opaque", "stringData": values}


def run_reader(kube: Kube, ns: str) -> Path:
    """A kubeconfig for a ServiceAccount of `ns` that may read Runs there and nothing else."""
    kube.core.create_namespaced_service_account(ns, {"metadata": {"name": "run-reader"}})
    kube.rbac.create_namespaced_role(
        ns,
        {
            "metadata": {"name": "run-reader"},
            "rules": [{"apiGroups": ["agentrun.dev"], "resources": ["runs"], "verbs": ["get", "list"]}],
        },
    )
    kube.rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": "run-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "run-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "run-reader", "namespace": ns}],
        },
    )
    return kube.account_kubeconfig(ns, "run-reader")


def test_a_state_blob_replaced_behind_the_runs_back_stops_the_next_attempt_as_unverifiable(
    kube: Kube, local_cluster: LocalCluster, run_namespace: str, operator: OperatorProcess
) -> None:
    ns, name = run_namespace, "tampered"
    create_run(kube, ns, big_state_run(name, local_cluster, steps=3, outputBytes=20_000, askAt=1))
    waiting = wait_phase(kube, ns, name, {"InputRequired", *ENDED}, timeout=120)
    assert waiting["status"]["phase"] == "InputRequired", (waiting["status"], operator.log_tail())
    pending = waiting["status"]["pendingRequest"]
    checkpoint = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, ns, "checkpoints", pending["checkpointId"]
    )
    ref = checkpoint["spec"]["stateRef"]

    # a writer with the namespace's credentials overwrites the blob: same size, other content
    store = local_cluster.object_store
    assert store is not None
    raw = S3Store(
        namespace_bucket(store.bucket, ns),
        config={
            "endpoint": store.endpoint,
            "region": REGION,
            "access_key_id": store.credentials.access_key,
            "secret_access_key": store.credentials.secret_key,
        },
        client_options={"allow_http": True},
    )
    original = bytes(obstore.get(raw, ref["key"]).bytes())
    forged = original.replace(b"output 0: a", b"output 0: Z", 1)
    assert forged != original
    assert len(forged) == len(original)
    obstore.put(raw, ref["key"], forged)
    # read while the blob is forged: once the Run stops over it, the operator puts the kept version back
    shown = cli_with_store(kube, local_cluster, ns, "state", name, "--checkpoint", pending["checkpointId"])
    assert shown.returncode == 1
    assert f"state blob {ref['key']} cannot be verified" in shown.stderr

    resume(kube, ns, name, pending, {"go": True}, key="carry-on-1")

    def second_attempt_ended() -> dict[str, Any] | None:
        found = [a for a in attempts(kube, ns, name) if a["spec"]["number"] == 2]
        ended = found and found[0].get("status", {}).get("phase") in {"Failed", "Succeeded"}
        return found[0] if ended else None

    second = wait_for(second_attempt_ended, 120, what=f"{name}'s second Attempt to end")
    failure = second["status"]["failure"]
    assert second["status"]["phase"] == "Failed"
    assert failure["reason"] == "StateUnverifiable"
    assert failure["class"] == "deterministic"
    assert ref["key"] in failure["message"]
    # the Run stops for a person: never retried on its own, never continued from other state
    final = wait_phase(kube, ns, name, ENDED, timeout=120)
    assert final["status"]["phase"] == "NeedsReconciliation", final["status"]
    assert final["status"]["failure"]["reason"] == "StateUnverifiable"
    assert len(attempts(kube, ns, name)) == 2
    assert "result" not in final["status"]
    assert "resultRef" not in final["status"]
