"""A hostile Pod of the same namespace writes against the state store with its own Pod's credentials (those
of the namespace: get and put, no delete): it replaces a victim's state blob with other bytes of the same
size, truncates it, or plants garbage at the predictable address of the victim's next state. The store
lets the overwrite through (the namespace's principal may put); the victim never continues from it: its
next Attempt stops as StateUnverifiable naming the blob, the Run waits for a person (NeedsReconciliation,
never retried on its own) with its earlier verified checkpoint kept, and a retryRequest from that
checkpoint finishes the Run with the state it saved, whole. The operator puts an overwritten blob back from
the version the store kept (versioning on), says so on the Run and retries nothing; a retryRequest from the
very checkpoint whose blob was forged then finishes too, also when the blob is a LangGraph channel blob that
only the checkpoint's manifest names. (docs/security.md, "The state store".)"""

from __future__ import annotations

import asyncio
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentrun.statestore import BlobRef, BlobStore, StateUnverifiable
from agentrun.statestore.documents import document_refs, refs_in
from devcluster.cluster import LocalCluster
from devcluster.operator import OperatorProcess
from integration.test_state_store_worker import ENDED, big_state_run, read_blob
from support.big_state_agent import digest, output
from support.kube import Kube, wait_for
from support.langgraph_reader import summary
from support.runs import (
    FAST_RETRY,
    GROUP,
    VERSION,
    attempts,
    create_run,
    get_run,
    patch_spec,
    resume,
    support_agent_run,
    wait_phase,
)

pytestmark = pytest.mark.cluster

STEPS, SIZE = 3, 20_000


def checkpoint(kube: Kube, ns: str, name: str) -> dict[str, Any] | None:
    found: list[dict[str, Any]] = kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, ns, "checkpoints", field_selector=f"metadata.name={name}"
    )["items"]
    return found[0] if found else None


def attack(kube: Kube, ns: str, name: str, victim: str, store: dict[str, Any]) -> dict[str, Any]:
    """The hostile agent's store writes, run as a Run of the victim's namespace: what the store answered."""
    create_run(kube, ns, support_agent_run(name, "hostile_agent", {"victim": victim, "store": store}))
    run = wait_phase(kube, ns, name, ENDED, timeout=120)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    result: dict[str, Any] = run["status"]["result"]
    return result


def waiting_at_its_question(
    kube: Kube, ns: str, body: dict[str, Any], operator: OperatorProcess
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Creates the Run and waits for its question: (the Run waiting, the Checkpoint it waits at)."""
    name = body["metadata"]["name"]
    create_run(kube, ns, body)
    waiting = wait_phase(kube, ns, name, {"InputRequired", *ENDED}, timeout=120)
    assert waiting["status"]["phase"] == "InputRequired", (waiting["status"], operator.log_tail())
    saved = checkpoint(kube, ns, waiting["status"]["pendingRequest"]["checkpointId"])
    assert saved is not None
    return waiting, saved


def retry_to_success(
    kube: Kube, ns: str, name: str, operator: OperatorProcess, *, key: str, from_checkpoint: str
) -> dict[str, Any]:
    """A person's retryRequest from `from_checkpoint`: the Run once its third Attempt, which continued
    from there, has ended, and Succeeded."""
    patch_spec(kube, ns, name, {"retryRequest": {"idempotencyKey": key, "fromCheckpoint": from_checkpoint}})

    def retried_and_ended() -> dict[str, Any] | None:
        run = get_run(kube, ns, name)
        status = run.get("status") or {}
        return run if status.get("attempts", 0) >= 3 and status.get("phase") in ENDED else None

    final = wait_for(retried_and_ended, 120, what=f"{name}'s retry to end")
    assert final["status"]["phase"] == "Succeeded", (final["status"], operator.log_tail())
    third = attempts(kube, ns, name)[-1]
    assert (third["spec"]["number"], third["spec"]["resumeFrom"]) == (3, from_checkpoint)
    return final


@pytest.mark.parametrize("mode", ["replace", "truncate", "plant"])
def test_a_hostile_pods_blob_write_stops_the_victim_and_a_retry_from_the_earlier_checkpoint_finishes(
    kube: Kube, local_cluster: LocalCluster, run_namespace: str, operator: OperatorProcess, mode: str
) -> None:
    ns, name = run_namespace, f"victim-{mode}"
    # replace/truncate: the victim waits after its second checkpoint, whose blob is then overwritten;
    # plant: it waits after its first, and its next state's address is taken before it saves it
    ask_at = 0 if mode == "plant" else 1
    body = big_state_run(name, local_cluster, steps=STEPS, outputBytes=SIZE, askAt=ask_at, stampAttempt=True)
    waiting, saved = waiting_at_its_question(kube, ns, body, operator)
    pending = waiting["status"]["pendingRequest"]
    if mode == "plant":
        earlier = saved["spec"]["id"]
        store: dict[str, Any] = {
            "mode": "plant",
            "bigState": {"outputs": 2, "outputBytes": SIZE, "by": f"{name}-a2"},  # the answer's Attempt
        }
    else:
        earlier = saved["spec"]["parent"]
        store = {"mode": mode, "checkpoint": pending["checkpointId"]}

    result = attack(kube, ns, f"hostile-{mode}", name, store)
    [key] = result["tampered"]
    assert key.startswith(f"{ns}/{waiting['metadata']['uid']}/sha256/")
    assert result["storeWrites"][f"{mode} {key}"] == "accepted", "the namespace's principal may put"
    assert result["storeWrites"][f"delete {key}"].startswith("refused"), "... and may not delete"

    resume(kube, ns, name, pending, {"go": True}, key="carry-on")
    stopped = wait_phase(kube, ns, name, {"NeedsReconciliation", "Succeeded", "Failed", "Cancelled"}, 120)
    status = stopped["status"]
    assert status["phase"] == "NeedsReconciliation", status
    assert status["failure"]["reason"] == "StateUnverifiable"
    assert key in status["failure"]["message"], "the blob is named"
    second = attempts(kube, ns, name)
    assert [a["status"]["phase"] for a in second] == ["Interrupted", "Failed"], second
    assert second[1]["status"]["failure"]["reason"] == "StateUnverifiable"
    assert second[1]["status"]["failure"]["class"] == "deterministic"
    assert "result" not in status
    assert "resultRef" not in status
    # the Run waits for a person: not compacted, its earlier verified checkpoint kept, no new Attempt
    assert status.get("checkpointIndex") is None
    assert checkpoint(kube, ns, earlier) is not None
    # the operator answers the failure on its own, without a retry: an overwritten blob is put back from
    # the version the store kept; a planted one is referenced by nothing, so there is nothing to put back
    said = wait_for(
        lambda: condition(get_run(kube, ns, name), "StateRestored"), 120, what=f"{name}'s StateRestored"
    )
    expected = ("False", "NotReferenced") if mode == "plant" else ("True", "BlobsRestored")
    assert (said["status"], said["reason"]) == expected, said
    assert key in said["message"]
    assert len(attempts(kube, ns, name)) == 2

    final = retry_to_success(kube, ns, name, operator, key="from-verified", from_checkpoint=earlier)
    result = final["status"]["result"]
    full_state = {"outputs": [output(i, SIZE) for i in range(STEPS)], "fetched": None, "by": f"{name}-a3"}
    assert result["complete"] is True
    assert result["stateDigest"] == digest(full_state), "the state it saved, whole, not the forged one"


def restored_blobs(operator: OperatorProcess) -> float:
    """The operator's count of blobs it restored from a version the store kept."""
    port = operator.env["AGENTRUN_METRICS_PORT"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "agentrun_state_store_overwritten_blobs_total"
        and sample.labels["outcome"] == "restored"
    )


def condition(run: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in run.get("status", {}).get("conditions") or [] if c["type"] == kind), None)


def answer_into_unverifiable(
    kube: Kube, ns: str, name: str, pending: dict[str, Any], operator: OperatorProcess, *, key: str
) -> None:
    """The person answers; the Attempt that continues reads the forged blob and the Run stops for a person
    (StateUnverifiable), the failure naming the blob."""
    resume(kube, ns, name, pending, {"go": True}, key="carry-on")
    stopped = wait_phase(kube, ns, name, {"NeedsReconciliation", "Succeeded", "Failed", "Cancelled"}, 120)
    assert stopped["status"]["phase"] == "NeedsReconciliation", (stopped["status"], operator.log_tail())
    assert stopped["status"]["failure"]["reason"] == "StateUnverifiable"
    assert key in stopped["status"]["failure"]["message"], "the blob is named"


def expect_restored(
    kube: Kube, ns: str, name: str, operator: OperatorProcess, *, key: str, forged_at: str, before: float
) -> None:
    """The operator restored blob `key` on its own and told the person (condition, Event, metric), and
    started nothing: a person decides, the Run still waits with its two Attempts."""

    def restored() -> dict[str, Any] | None:
        run = get_run(kube, ns, name)
        return run if condition(run, "StateRestored") is not None else None

    run = wait_for(restored, 120, what=f"{name}'s blob restored")
    said = condition(run, "StateRestored")
    assert said is not None
    assert (said["status"], said["reason"]) == ("True", "BlobsRestored"), (said, operator.log_tail())
    assert key in said["message"]
    assert f"a retryRequest from checkpoint {forged_at}" in said["message"]
    assert run["status"]["phase"] == "NeedsReconciliation"
    assert run["status"]["attempts"] == 2
    assert len(attempts(kube, ns, name)) == 2

    # The operator writes the condition, then the Event, then counts the restore: each is waited for.
    def told() -> bool:
        events = kube.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
        return any(e.reason == "StateRestored" and key in (e.message or "") for e in events)

    wait_for(told, 120, what=f"the StateRestored Event of {name}")
    wait_for(lambda: restored_blobs(operator) > before, 120, what="the restore counted")
    assert restored_blobs(operator) == before + 1


@pytest.mark.parametrize("mode", ["replace", "truncate"])
def test_the_operator_restores_an_overwritten_blob_and_a_retry_from_that_same_checkpoint_finishes(
    kube: Kube, local_cluster: LocalCluster, run_namespace: str, operator: OperatorProcess, mode: str
) -> None:
    """The forged blob is the very state the Run waits at: the writer never overwrites (put-if-absent), so
    only the operator can bring it back, from the version the store kept (versioning on). It does so on its
    own, tells the person, and retries nothing; the person's retry from that checkpoint then finishes."""
    ns, name = run_namespace, f"restored-{mode}"
    body = big_state_run(name, local_cluster, steps=STEPS, outputBytes=SIZE, askAt=1, stampAttempt=True)
    waiting, saved = waiting_at_its_question(kube, ns, body, operator)
    pending = waiting["status"]["pendingRequest"]
    forged_at = pending["checkpointId"]
    ref = saved["spec"]["stateRef"]
    genuine = read_blob(local_cluster, ref)
    restored_before = restored_blobs(operator)

    result = attack(kube, ns, f"hostile-restored-{mode}", name, {"mode": mode, "checkpoint": forged_at})
    assert result["tampered"] == [ref["key"]]
    with pytest.raises(StateUnverifiable):  # the store holds the forged bytes now
        read_blob(local_cluster, ref)

    answer_into_unverifiable(kube, ns, name, pending, operator, key=ref["key"])
    expect_restored(kube, ns, name, operator, key=ref["key"], forged_at=forged_at, before=restored_before)
    # what the store holds at the key now is the genuine state, read and verified as any reader does
    assert read_blob(local_cluster, ref) == genuine

    final = retry_to_success(kube, ns, name, operator, key="from-restored", from_checkpoint=forged_at)
    result = final["status"]["result"]
    full_state = {"outputs": [output(i, SIZE) for i in range(STEPS)], "fetched": None, "by": f"{name}-a3"}
    assert result["complete"] is True
    assert result["stateDigest"] == digest(full_state), "the state it saved, whole"
    assert condition(final, "StateRestored") is None, "a phase change leaves the answered condition behind"


CALLS, ASK_AT = 4, 2


def direct_refs(kube: Kube, ns: str, name: str) -> set[str]:
    """The keys the Run's own objects record (Checkpoints, SideEffects, Attempts, the Run)."""
    label = f"agentrun.dev/run={name}"
    bodies: list[Any] = [get_run(kube, ns, name)]
    for plural in ("checkpoints", "sideeffects", "attempts"):
        listed = kube.custom.list_namespaced_custom_object(GROUP, VERSION, ns, plural, label_selector=label)
        bodies += listed["items"]
    return {ref.key for body in bodies for ref in refs_in(body)}


def manifest_refs(local_cluster: LocalCluster, ref: dict[str, Any]) -> list[BlobRef]:
    """The blobs a LangGraph manifest names, read through the store (verified)."""
    store = BlobStore.from_url(local_cluster.state_store_url, env=local_cluster.state_store_env())
    return document_refs(asyncio.run(store.get(BlobRef.from_json(ref))))


def read_bytes(local_cluster: LocalCluster, ref: BlobRef) -> bytes:
    store = BlobStore.from_url(local_cluster.state_store_url, env=local_cluster.state_store_env())
    return asyncio.run(store.get(ref))


def test_the_operator_restores_an_overwritten_langgraph_channel_blob_a_manifest_names(
    kube: Kube, local_cluster: LocalCluster, run_namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    """A LangGraph agent's state is a manifest per checkpoint naming its channel blobs: no object of the
    Run records a channel blob itself. One is overwritten while the graph waits for a person; the next
    Attempt stops as StateUnverifiable naming it; the operator finds it through the documents the Run's
    checkpoints reach, restores it from the version the store kept, and a retry from that same checkpoint
    finishes the graph with its whole state, no tool run twice."""
    ns, name, log = run_namespace, "lg-restored", tmp_path / "tools.log"
    body = support_agent_run(name, "langgraph_reader", {"calls": CALLS, "outputBytes": SIZE, "askAt": ASK_AT})
    body["spec"]["agent"]["env"].append({"name": "AGENTRUN_TOOL_LOG", "value": str(log)})
    body["spec"]["retry"] = FAST_RETRY
    waiting, saved = waiting_at_its_question(kube, ns, body, operator)
    pending = waiting["status"]["pendingRequest"]
    forged_at = pending["checkpointId"]
    manifest = saved["spec"]["stateRef"]
    assert manifest["links"] is True, "the checkpoint names a manifest"
    # the channel blob no object records, only the manifest: the `files` channel's value after two calls
    # (the largest; the tool outputs are also their pending writes' blobs, which Writes objects record)
    recorded = direct_refs(kube, ns, name)
    assert manifest["key"] in recorded
    only_named = [r for r in manifest_refs(local_cluster, manifest) if r.key not in recorded]
    channel = max(only_named, key=lambda r: r.size)
    assert channel.size > ASK_AT * SIZE, only_named
    genuine = read_bytes(local_cluster, channel)
    restored_before = restored_blobs(operator)

    result = attack(kube, ns, "hostile-lg", name, {"mode": "replace", "key": channel.key})
    assert result["tampered"] == [channel.key]
    assert result["storeWrites"][f"replace {channel.key}"] == "accepted"
    with pytest.raises(StateUnverifiable):  # the store holds the forged bytes now
        read_bytes(local_cluster, channel)

    answer_into_unverifiable(kube, ns, name, pending, operator, key=channel.key)
    second = attempts(kube, ns, name)
    assert [a["status"]["phase"] for a in second] == ["Interrupted", "Failed"], second
    expect_restored(kube, ns, name, operator, key=channel.key, forged_at=forged_at, before=restored_before)
    assert read_bytes(local_cluster, channel) == genuine

    final = retry_to_success(kube, ns, name, operator, key="from-restored", from_checkpoint=forged_at)
    assert final["status"]["result"] == summary(CALLS, SIZE), "the whole state: every output, every file"
    lines = [line.split() for line in log.read_text().splitlines()]
    assert Counter(int(call) for _, event, call in lines if event == "end") == Counter(range(CALLS))
    assert [(a.rsplit("-", 1)[1], int(c)) for a, e, c in lines if e == "start"] == [
        *(("a1", c) for c in range(ASK_AT)),
        *(("a3", c) for c in range(ASK_AT, CALLS)),
    ], "every tool once: before the question in the first Attempt, after it in the retry"
    assert condition(final, "StateRestored") is None
