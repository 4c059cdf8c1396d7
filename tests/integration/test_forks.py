"""Forks (spec.forkFrom) on the real control plane: a fork resumes at its source's checkpoint, sharing its
state, and never sends again what its source confirmed before that checkpoint; bad sources fail the
fork before any Attempt; the API server keeps forkFrom as it was created."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from agentrun.core.ledger import side_effect_name
from agentrun.statestore import BlobRef, BlobStore
from agentrun.statestore.checkpoint_index import as_checkpoint, decode_index
from devcluster.cluster import LocalCluster
from devcluster.operator import OperatorProcess
from devcluster.security import STATE_STORE_SECRET
from integration.test_cli import cli
from support.kube import Kube, wait_for
from support.runs import (
    GROUP,
    VERSION,
    attempts,
    create_run,
    get_run,
    patch_spec,
    support_agent_run,
    wait_phase,
)

pytestmark = pytest.mark.cluster

# Over the inline threshold: the checkpoint's state is in the state store, and the fork shares the blob.
PAD = 20_000


def fork_agent_run(
    name: str, sent: Path, first: str, second: str, cluster: LocalCluster | None = None, **spec: Any
) -> dict[str, Any]:
    """The fork agent; with `cluster`, told its state store (the namespace's credentials) as the operator
    tells attempt Pods, so that its large state goes there."""
    scenario = {"dir": str(sent), "first": first, "second": second, "pad": PAD}
    body = support_agent_run(name, "fork_agent", scenario)
    if cluster is not None:
        body["spec"]["agent"]["env"] += [
            {"name": "AGENTRUN_STATE_STORE_URL", "value": cluster.state_store_url},
            *(
                {"name": key, "valueFrom": {"secretKeyRef": {"name": STATE_STORE_SECRET, "key": key}}}
                for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
            ),
        ]
    body["spec"].update(spec)
    return body


def checkpoints(kube: Kube, ns: str, run: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, ns, "checkpoints", label_selector=f"agentrun.dev/run={run}"
    )["items"]
    return sorted(items, key=lambda c: c["spec"]["sequence"])


def side_effect(kube: Kube, ns: str, run: str, key: str) -> dict[str, Any]:
    record: dict[str, Any] = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, ns, "sideeffects", side_effect_name(run, key)
    )
    return record


def succeeded_source(
    kube: Kube, ns: str, sent: Path, operator: OperatorProcess, cluster: LocalCluster | None = None
) -> dict[str, Any]:
    create_run(kube, ns, fork_agent_run("source", sent, "first-key", "second-key", cluster))
    run = wait_phase(kube, ns, "source", {"Succeeded", "Failed", "NeedsReconciliation"})
    assert run["status"]["phase"] == "Succeeded", operator.log_tail()

    def compacted() -> dict[str, Any] | None:
        """Its Checkpoint index written and its superseded Checkpoints deleted: the operator is done
        with it (a Checkpoint made by hand before that could be deleted unindexed)."""
        done = get_run(kube, ns, "source")
        latest = done["status"].get("latestCheckpoint")
        left = [c["spec"]["id"] for c in checkpoints(kube, ns, "source")]
        return done if done["status"].get("checkpointIndex") and left == [latest] else None

    compacted_run: dict[str, Any] = wait_for(compacted, timeout=120, what="the source compacted")
    return compacted_run


def indexed_checkpoints(cluster: LocalCluster, run: dict[str, Any]) -> list[dict[str, Any]]:
    """A compacted Run's Checkpoints as its index records them (read as the operator reads it)."""
    store = BlobStore.from_url(cluster.state_store_url, env=cluster.state_store_env())
    ref = BlobRef.from_json(run["status"]["checkpointIndex"])
    name, ns = run["metadata"]["name"], run["metadata"]["namespace"]
    return [as_checkpoint(e, name, ns) for e in decode_index(asyncio.run(store.get(ref)))]


def test_a_fork_resumes_at_the_middle_checkpoint_and_never_sends_again_what_its_source_confirmed(
    kube: Kube, local_cluster: LocalCluster, run_namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    ns = run_namespace
    source = succeeded_source(kube, ns, tmp_path, operator, local_cluster)
    indexed = indexed_checkpoints(local_cluster, source)
    middle = next(c for c in indexed if c["spec"]["step"] == "first-sent")
    assert middle["spec"]["ledgerMark"] == 1  # the first record was opened before it, the second after

    fork_from = {"run": "source", "checkpointId": middle["spec"]["id"]}
    branch = fork_agent_run("branch", tmp_path, "first-key", "other", local_cluster, forkFrom=fork_from)
    create_run(kube, ns, branch)
    fork = wait_phase(kube, ns, "branch", {"Succeeded", "Failed", "NeedsReconciliation"})
    assert fork["status"]["phase"] == "Succeeded", operator.log_tail()

    # It resumed where the source had sent the first effect: the ledger reused it, never sent it again.
    assert fork["status"]["result"] == {
        "resumedAt": 2,
        "first": {"reference": "first-key", "executedNow": False, "inherited": True},
        "second": {"reference": "other", "executedNow": True, "inherited": False},
    }
    # one send each (a second send of a key would have failed to create its file)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first-key", "other", "second-key"]
    inherited = side_effect(kube, ns, "branch", "first-key")
    assert inherited["status"]["inheritedFrom"] == {
        "run": "source",
        "uid": source["metadata"]["uid"],
        "record": side_effect_name("source", "first-key"),
    }
    assert [s["attempt"] for s in inherited["status"]["sends"]] == ["source-a1"]
    with pytest.raises(ApiException) as missing:  # the source's second effect came after the mark
        side_effect(kube, ns, "branch", "second-key")
    assert missing.value.status == 404

    # The fork's first Checkpoint is the source's, copied: the same blob, under the source's prefix.
    copy = checkpoints(kube, ns, "branch")[0]
    assert copy["spec"]["copiedFrom"]["run"] == "source"
    assert copy["spec"]["stateRef"] == middle["spec"]["stateRef"]
    assert f"/{source['metadata']['uid']}/sha256/" in copy["spec"]["stateRef"]["key"]
    [first_attempt] = attempts(kube, ns, "branch")
    assert first_attempt["spec"]["resumeFrom"] == copy["spec"]["id"]
    assert fork["status"]["fork"]["inherited"] == 1

    # The report says whose the inherited effect is.
    report = wait_for(
        lambda: get_run(kube, ns, "branch")["status"].get("report", {}).get("effects"),
        timeout=120,
        what="the fork's report",
    )
    inherited_name = side_effect_name("branch", "first-key")
    assert {e["name"]: e.get("inherited", False) for e in report} == {
        inherited_name: True,
        side_effect_name("branch", "other"): False,
    }
    happened = get_run(kube, ns, "branch")["status"]["report"]["happened"]
    assert happened == [side_effect_name("branch", "other")]

    # The same from the command line: the source's agent and settings, another input.
    scenario = {"dir": str(tmp_path), "first": "first-key", "second": "third", "pad": PAD}
    args = ["fork", "source", "--checkpoint", middle["spec"]["id"], "--name", "by-cli"]
    done = cli(kube, ns, *args, "--input", json.dumps(scenario))
    assert done.returncode == 0, done.stderr
    assert "run by-cli created: forked from run source at checkpoint" in done.stdout
    by_cli = wait_phase(kube, ns, "by-cli", {"Succeeded", "Failed", "NeedsReconciliation"})
    assert by_cli["status"]["phase"] == "Succeeded", operator.log_tail()
    reused = {"reference": "first-key", "executedNow": False, "inherited": True}
    assert by_cli["status"]["result"]["first"] == reused
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first-key", "other", "second-key", "third"]


def failed_fork(kube: Kube, ns: str, name: str, fork_from: dict[str, str], tmp_path: Path) -> dict[str, Any]:
    create_run(kube, ns, fork_agent_run(name, tmp_path, "a", "b", forkFrom=fork_from))
    run = wait_phase(kube, ns, name, {"Failed", "Running", "Succeeded"})
    assert attempts(kube, ns, name) == []  # failed before any Attempt
    return run


def test_forks_from_a_missing_run_or_checkpoint_or_a_writes_checkpoint_fail_before_any_attempt(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    ns = run_namespace
    sent = tmp_path / "source"
    sent.mkdir()
    source = succeeded_source(kube, ns, sent, operator)
    writes = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Checkpoint",
        "metadata": {
            "name": "source-writes",
            "labels": {"agentrun.dev/run": "source"},
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "Run",
                    "name": "source",
                    "uid": source["metadata"]["uid"],
                }
            ],
        },
        "spec": {
            "runName": "source",
            "id": "source-writes",
            "sequence": 2,
            "parent": "source-a1-s2",
            "attempt": "source-a1",
            "leaseEpoch": 1,
            "kind": "Writes",
            "state": {},
        },
    }
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, ns, "checkpoints", writes)

    cases = [
        ("no-run", {"run": "nowhere", "checkpointId": "x"}, "ForkSourceNotFound", "no Run nowhere"),
        ("no-ckpt", {"run": "source", "checkpointId": "nope"}, "ForkSourceNotFound", "no checkpoint nope"),
        ("writes", {"run": "source", "checkpointId": "source-writes"}, "ForkSourceInvalid", "a Writes"),
    ]
    for name, fork_from, reason, says in cases:
        run = failed_fork(kube, ns, name, fork_from, tmp_path)
        assert run["status"]["phase"] == "Failed", run["status"]
        assert run["status"]["failure"]["reason"] == reason
        assert says in run["status"]["message"]


def test_the_api_server_refuses_a_fork_of_itself_and_any_change_of_fork_from(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    ns = run_namespace
    with pytest.raises(ApiException) as refused_self:
        itself = {"run": "selfish", "checkpointId": "c"}
        itself_body = fork_agent_run("selfish", tmp_path, "a", "b", forkFrom=itself)
        create_run(kube, ns, itself_body)
    assert refused_self.value.status == 422
    assert "spec.forkFrom.run names this Run itself" in str(refused_self.value.body)

    fixed = fork_agent_run("fixed", tmp_path, "a", "b", forkFrom={"run": "gone", "checkpointId": "c"})
    create_run(kube, ns, fixed)
    for change in ({"forkFrom": {"run": "other", "checkpointId": "c"}}, {"forkFrom": None}):
        with pytest.raises(ApiException) as refused:
            patch_spec(kube, ns, "fixed", change)
        assert refused.value.status == 422
        assert "spec.forkFrom is immutable" in str(refused.value.body)
    create_run(kube, ns, fork_agent_run("plain", tmp_path, "a", "b"))
    with pytest.raises(ApiException) as added:
        patch_spec(kube, ns, "plain", {"forkFrom": {"run": "fixed", "checkpointId": "c"}})
    assert "spec.forkFrom is immutable" in str(added.value.body)


def test_a_fork_that_inherits_an_open_effect_stops_for_a_person_then_reuses_what_they_resolved(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    ns, sends = run_namespace, tmp_path / "sends"
    sends.mkdir()
    source = fork_agent_run("held", sends, "first-key", "second-key")
    source["spec"]["input"]["holdFirst"] = str(
        tmp_path / "gate"
    )  # never opened: the first send never answers
    create_run(kube, ns, source)

    def saved_in_flight() -> dict[str, Any] | None:
        saved = checkpoints(kube, ns, "held")
        return next((c for c in saved if c["spec"]["step"] == "first-in-flight"), None)

    in_flight = wait_for(
        saved_in_flight,
        timeout=120,
        what="the checkpoint saved while the first send is in flight",
    )
    assert in_flight["spec"]["ledgerMark"] == 1  # the record in flight was opened before it
    patch_spec(kube, ns, "held", {"cancelEpoch": 1})
    wait_phase(kube, ns, "held", {"Cancelled"})
    wait_for(
        lambda: side_effect(kube, ns, "held", "first-key")["status"]["state"] == "Unknown",
        what="the source's record in flight marked Unknown",
    )

    fork_from = {"run": "held", "checkpointId": in_flight["spec"]["id"]}
    create_run(kube, ns, fork_agent_run("careful", sends, "first-key", "other", forkFrom=fork_from))
    run = wait_phase(kube, ns, "careful", {"NeedsReconciliation", "Running", "Succeeded", "Failed"})
    assert run["status"]["phase"] == "NeedsReconciliation", run["status"]
    assert run["status"]["failure"]["reason"] == "InheritedUnknown"
    assert attempts(kube, ns, "careful") == []  # stopped before any send
    record = side_effect(kube, ns, "careful", "first-key")
    assert record["status"]["state"] == "Unknown"
    assert record["status"]["inheritedFrom"]["run"] == "held"

    # A person establishes that it happened; the retry resumes from the copy and reuses it.
    found = {"reference": "first-key"}
    resolution = {"status": {"state": "Confirmed", "resolvedBy": "alice", "result": found}}
    kube.impersonating("alice").custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, ns, "sideeffects", record["metadata"]["name"], resolution
    )
    patch_spec(kube, ns, "careful", {"retryRequest": {"idempotencyKey": "retry-1", "reason": "resolved"}})
    [control] = wait_for(
        lambda: get_run(kube, ns, "careful")["status"].get("controls"), what="the retry judged"
    )
    assert control["outcome"] == "Accepted", control
    run = wait_phase(kube, ns, "careful", {"Succeeded", "Failed"})
    assert run["status"]["phase"] == "Succeeded", operator.log_tail()
    assert run["status"]["result"]["resumedAt"] == 2
    assert run["status"]["result"]["first"] == {**found, "executedNow": False, "inherited": True}
    assert sorted(p.name for p in sends.iterdir()) == ["other"]  # the held send never got through
