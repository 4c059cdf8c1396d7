"""Version skew between the operator and agent images, on the real control plane with its versitygw: the
agent SDK as it was before the state store (built from this repository's history into a temporary
directory and put first on the attempt Pod's PYTHONPATH) against today's operator with a store.

What that old SDK does with a reference, found out (tests/unit can't: it is another package): it reads a
Checkpoint whose state is a stateRef as a validation error (its StateRef wants a `uri`: loud, but an
ordinary deterministic failure that retries), and a SideEffect whose result is a resultRef as a result of
None (silent). So it is never given such a Run: it stops before it sends a request (its Pod has no
AGENTRUN_NAMESPACE), and the Run stops for a person with reason AgentSDKTooOld. Runs it writes stay
inline, resumable by it and by today's SDK."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentrun.api.budgets import stored_size
from agentrun.worker.blobs import INLINE_THRESHOLD
from devcluster.cluster import LocalCluster
from devcluster.operator import OperatorProcess
from support.big_state_agent import digest, output
from support.history import previous_sdk
from support.kube import PERSON, Kube, wait_for
from support.runs import (
    GROUP,
    TESTS_DIR,
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

ENDED = {"Succeeded", "Failed", "NeedsReconciliation", "Cancelled"}


@pytest.fixture(scope="module")
def old_sdk(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agent SDK of the release before the state store, extracted from git, for PYTHONPATH."""
    package = previous_sdk(tmp_path_factory.mktemp("old-sdk"))
    assert (package / "agentrun" / "worker" / "main.py").exists()
    return package


def with_sdk(body: dict[str, Any], sdk: Path | None) -> dict[str, Any]:
    """The Run's agent with the old SDK first on its PYTHONPATH (None: today's SDK)."""
    body["spec"]["agent"]["env"] = agent_env(sdk)
    return body


def agent_env(sdk: Path | None) -> list[dict[str, str]]:
    path = f"{sdk}:{TESTS_DIR}" if sdk else str(TESTS_DIR)
    return [{"name": "PYTHONPATH", "value": path}]


def use_sdk(kube: Kube, ns: str, name: str, sdk: Path | None) -> None:
    """spec.agent is mutable: the image (here, its SDK) is changed under a waiting Run."""
    run = get_run(kube, ns, name)
    agent = {**run["spec"]["agent"], "env": agent_env(sdk)}
    patch_spec(kube, ns, name, {"agent": agent})


def checkpoint(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, "checkpoints", name)
    return found


def waiting_for_input(kube: Kube, ns: str, name: str, operator: OperatorProcess) -> dict[str, Any]:
    run = wait_phase(kube, ns, name, {"InputRequired", *ENDED}, timeout=120)
    assert run["status"]["phase"] == "InputRequired", (run["status"], operator.log_tail())
    pending: dict[str, Any] = run["status"]["pendingRequest"]
    return pending


OLD_SDK_READS = """
import json, sys
from agentrun.api import Checkpoint, SideEffect
ref = {"key": "team/uid/sha256/" + "a" * 64, "sha256": "a" * 64, "size": 20000}
spec = {"runName": "r", "id": "r-c1", "sequence": 1, "attempt": "r-a1", "leaseEpoch": 1, "stateRef": ref}
try:
    Checkpoint.model_validate({"metadata": {"name": "r-c1"}, "spec": spec})
    checkpoint = "read"
except Exception as exc:
    checkpoint = type(exc).__name__ + ": " + str(exc)
effect = SideEffect.model_validate({
    "metadata": {"name": "sfx"},
    "spec": {"runName": "r", "tool": "t", "idempotencyKey": "k", "requestDigest": "sha256:" + "d" * 64},
    "status": {"state": "Confirmed", "resultRef": ref},
})
print(json.dumps({"checkpoint": checkpoint, "effectResult": effect.status.result, "module": sys.modules[
    "agentrun"].__file__}))
"""


def test_what_the_sdk_before_the_store_makes_of_a_reference(old_sdk: Path, tmp_path: Path) -> None:
    """Why it must never be given one: a Checkpoint whose state is in the store does not parse (loud, but
    an ordinary deterministic failure, retried by the retry policy), and a SideEffect whose result is in
    the store parses with no result: the agent would reuse the action's result as None, silently."""
    found = subprocess.run(
        [sys.executable, "-c", OLD_SDK_READS],
        env={**os.environ, "PYTHONPATH": str(old_sdk)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    read = json.loads(found.stdout)
    assert read["module"].startswith(str(old_sdk)), "the old package, not today's"
    assert read["checkpoint"].startswith("ValidationError"), read
    assert "stateRef.uri" in read["checkpoint"], read
    assert read["effectResult"] is None, "a result in the store reads as no result"


def test_an_sdk_that_predates_the_store_is_never_given_a_run_whose_state_is_there(
    kube: Kube, local_cluster: LocalCluster, run_namespace: str, operator: OperatorProcess, old_sdk: Path
) -> None:
    ns, name, steps, size = run_namespace, "skew-refs", 3, 20_000
    inputs = {"steps": steps, "outputBytes": size, "askAt": 1}
    create_run(kube, ns, support_agent_run(name, "big_state_agent", inputs))
    pending = waiting_for_input(kube, ns, name, operator)
    saved = checkpoint(kube, ns, pending["checkpointId"])
    assert "stateRef" in saved["spec"] and "state" not in saved["spec"], "today's SDK used the store"
    [first] = attempts(kube, ns, name)
    assert first["status"]["sdkReads"] == ["BlobRefs"], "stated at its start, before it read any state"

    # the image is rolled back to one whose SDK predates the store, and the question answered
    use_sdk(kube, ns, name, old_sdk)
    resume(kube, ns, name, pending, {"go": True}, key="carry-on-1")
    stopped = wait_phase(kube, ns, name, ENDED, timeout=120)
    assert stopped["status"]["phase"] == "NeedsReconciliation", (stopped["status"], operator.log_tail())
    assert stopped["status"]["failure"]["reason"] == "AgentSDKTooOld"
    assert "spec.agent" in stopped["status"]["message"]
    second = attempts(kube, ns, name)[1]
    assert second["spec"]["stateInStore"] is True
    assert "sdkReads" not in second["status"]
    failure = second["status"]["failure"]
    assert (second["status"]["phase"], failure["reason"]) == ("Failed", "AgentSDKTooOld")
    # the old SDK stopped at its first line, before any request: its own words end the message
    assert "NotInAttemptPod: AGENTRUN_NAMESPACE not set" in failure["message"], failure["message"]
    assert len(attempts(kube, ns, name)) == 2, "never retried on its own: the same image stops again"
    written_by_second = kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, ns, "checkpoints", label_selector=f"agentrun.dev/run={name}"
    )["items"]
    assert all(c["spec"]["attempt"] != f"{name}-a2" for c in written_by_second)

    # a person sets the image back and asks for a retry: today's SDK resumes the whole state
    use_sdk(kube, ns, name, None)
    patch_spec(
        kube.impersonating(PERSON),
        ns,
        name,
        {"retryRequest": {"idempotencyKey": "newer-image", "requestedBy": PERSON}},
    )

    def third_ended() -> dict[str, Any] | None:
        run = get_run(kube, ns, name)
        status = run.get("status", {})
        return run if status.get("attempts", 0) >= 3 and status.get("phase") in ENDED else None

    done = wait_for(third_ended, 120, what=f"{name}'s third Attempt to end the Run")
    assert done["status"]["phase"] == "Succeeded", (done["status"], operator.log_tail())
    third = attempts(kube, ns, name)[2]
    assert third["spec"]["stateInStore"] is True
    assert third["status"]["sdkReads"] == ["BlobRefs"]
    assert done["status"]["committedBy"]["attempt"] == f"{name}-a3"
    result = done["status"]["result"]
    assert result["complete"] is True, "every output, each whole"
    full = {"outputs": [output(i, size) for i in range(steps)], "fetched": None}
    assert result["stateDigest"] == digest(full)


def test_runs_an_old_sdk_writes_stay_inline_and_resume_under_an_operator_with_a_store(
    kube: Kube, local_cluster: LocalCluster, run_namespace: str, operator: OperatorProcess, old_sdk: Path
) -> None:
    """The old image keeps working after the operator's upgrade (its Runs hold no reference, so it is
    started as before), and its inline checkpoint resumes under today's SDK, which then uses the store."""
    ns, size = run_namespace, 6_000  # two outputs fit inline (16 KiB), the third goes to the store
    inputs = {"steps": 3, "outputBytes": size, "askAt": 1}
    for name, resumed_by in (("skew-old-old", old_sdk), ("skew-old-new", None)):
        create_run(kube, ns, with_sdk(support_agent_run(name, "big_state_agent", inputs), old_sdk))
        pending = waiting_for_input(kube, ns, name, operator)
        saved = checkpoint(kube, ns, pending["checkpointId"])
        assert "stateRef" not in saved["spec"] and stored_size(saved["spec"]["state"]) <= INLINE_THRESHOLD
        [first] = attempts(kube, ns, name)
        assert "sdkReads" not in first["status"], "the old SDK states nothing"

        use_sdk(kube, ns, name, resumed_by)
        resume(kube, ns, name, pending, {"go": True}, key="carry-on-1")
        done = wait_phase(kube, ns, name, ENDED, timeout=120)
        assert done["status"]["phase"] == "Succeeded", (name, done["status"], operator.log_tail())
        second = attempts(kube, ns, name)[1]
        assert "stateInStore" not in second["spec"], "nothing of the Run was in the store"
        result = done["status"]["result"]
        assert result["complete"] is True, "every output, each whole"
        full = {"outputs": [output(i, size) for i in range(3)], "fetched": None}
        assert result["stateDigest"] == digest(full)
        assert result["attempt"] == f"{name}-a2"
        latest = checkpoint(kube, ns, done["status"]["latestCheckpoint"])
        if resumed_by is None:  # today's SDK, given the store by the operator, put the larger state there
            assert second["status"]["sdkReads"] == ["BlobRefs"]
            assert "stateRef" in latest["spec"] and "state" not in latest["spec"]
        else:
            assert "sdkReads" not in second["status"]
            assert latest["spec"]["state"] == full, "the old SDK keeps everything inline"
