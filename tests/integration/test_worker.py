"""The worker SDK on the real control plane: interrupts and resume, fenced commits, cancel."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from devcluster.operator import OperatorProcess
from support.kube import Kube, wait_for
from support.runs import (
    PRIORITY,
    attempts,
    create_run,
    get_run,
    patch_spec,
    resume_patch,
    scenario_run,
    support_agent_run,
    wait_attempt_phase,
    wait_phase,
)

pytestmark = pytest.mark.cluster


def controls(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["idempotencyKey"]: c for c in run["status"].get("controls", [])}


def test_interrupt_then_resume_continues_from_the_checkpoint_with_the_value(
    kube: Kube, run_namespace: str, operator: OperatorProcess
) -> None:
    ns = run_namespace
    scenario = {"steps": 3, "ask": {"atStep": 2, "prompt": "Which priority?", "schema": PRIORITY}}
    create_run(kube, ns, scenario_run("ask", scenario))
    waiting = wait_phase(kube, ns, "ask", {"InputRequired", "Failed", "Succeeded"})
    assert waiting["status"]["phase"] == "InputRequired", operator.log_tail()
    pending = waiting["status"]["pendingRequest"]
    assert pending["prompt"] == "Which priority?"
    assert pending["acceptedSchema"] == PRIORITY
    assert pending["checkpointId"] == waiting["status"]["latestCheckpoint"] == "ask-a1-s1"
    [first] = attempts(kube, ns, "ask")
    assert first["status"]["phase"] == "Interrupted"
    wait_for(lambda: (pod := kube.pod("ask-a1", ns)) is None or pod["status"]["phase"] == "Succeeded")

    # refused: the wrong request, then a value the schema does not accept — the Run stays as it was
    patch_spec(kube, ns, "ask", resume_patch({**pending, "requestId": "nope"}, {"priority": "high"}, "k1"))
    wait_for(lambda: "k1" in controls(get_run(kube, ns, "ask")), what="k1 processed")
    patch_spec(kube, ns, "ask", resume_patch(pending, {"priority": "urgent"}, "k2"))
    wait_for(lambda: "k2" in controls(get_run(kube, ns, "ask")), what="k2 processed")
    run = get_run(kube, ns, "ask")
    assert controls(run)["k1"]["outcome"] == "Rejected"
    assert controls(run)["k1"]["reason"] == "UnknownRequest"
    assert (controls(run)["k2"]["outcome"], controls(run)["k2"]["reason"]) == ("Rejected", "SchemaMismatch")
    assert "urgent" in controls(run)["k2"]["message"]
    assert run["status"]["phase"] == "InputRequired"
    assert run["status"]["pendingRequest"] == pending
    assert len(attempts(kube, ns, "ask")) == 1

    patch_spec(kube, ns, "ask", resume_patch(pending, {"priority": "high"}, "k3"))
    done = wait_phase(kube, ns, "ask", {"Succeeded", "Failed"})
    assert done["status"]["phase"] == "Succeeded", operator.log_tail()
    assert done["status"]["result"]["answer"] == {"priority": "high"}
    assert done["status"]["result"]["resumedAt"] == 1, "continued from the interrupt's checkpoint"
    assert "pendingRequest" not in done["status"]
    [recorded] = done["status"]["inputs"]
    assert (recorded["requestId"], recorded["idempotencyKey"]) == (pending["requestId"], "k3")
    second = attempts(kube, ns, "ask")[1]
    assert second["spec"]["reason"] == f"resume:{pending['requestId']}"
    assert second["spec"]["input"] == {"priority": "high"}
    assert second["spec"]["resumeFrom"] == "ask-a1-s1"


ZOMBIE_COMMIT = textwrap.dedent(
    """
    import asyncio, json, sys
    from agentrun.kubeapi import KubeApi
    from agentrun.worker.errors import FenceRejected
    from agentrun.worker.identity import Identity
    from agentrun.worker.session import Session

    async def main():
        session = Session(KubeApi(), Identity.from_env())
        try:
            await session.commit({"late": True})
        except FenceRejected as exc:
            print(json.dumps({"rejected": exc.reason}))
            return
        print(json.dumps({"rejected": None}))

    asyncio.run(main())
    """
)


def zombie_commit(kube: Kube, namespace: str, run: str, attempt: dict[str, Any]) -> str | None:
    """A worker of `attempt` that outlived it (a partitioned node, a frozen process) tries to commit."""
    env = {
        **os.environ,
        "KUBECONFIG": str(kube.kubeconfig),
        "AGENTRUN_RUN": run,
        "AGENTRUN_NAMESPACE": namespace,
        "AGENTRUN_ATTEMPT": attempt["metadata"]["name"],
        "AGENTRUN_LEASE_EPOCH": str(attempt["spec"]["leaseEpoch"]),
        "AGENTRUN_CANCEL_EPOCH": str(attempt["spec"]["cancelEpoch"]),
    }
    out = subprocess.run(
        [sys.executable, "-c", ZOMBIE_COMMIT], env=env, capture_output=True, text=True, check=True, timeout=60
    )
    rejected: str | None = json.loads(out.stdout.strip().splitlines()[-1])["rejected"]
    return rejected


def test_cancel_stops_the_agent_inside_a_step_and_fences_late_commits(
    kube: Kube, run_namespace: str, operator: OperatorProcess
) -> None:
    ns = run_namespace
    create_run(kube, ns, scenario_run("stop", {"steps": 1, "fail": {"how": "hang"}}))
    wait_for(lambda: (kube.pod("stop-a1", ns) or {}).get("status", {}).get("phase") == "Running", timeout=120)
    patch_spec(kube, ns, "stop", {"cancelEpoch": 1})
    run = wait_phase(kube, ns, "stop", {"Cancelled"}, timeout=120)
    assert run["status"]["observedCancelEpoch"] == 1
    attempt = wait_attempt_phase(kube, ns, "stop", 1, {"Aborted"})
    wait_for(lambda: kube.pod("stop-a1", ns) is None, timeout=120, what="the attempt pod gone")

    assert zombie_commit(kube, ns, "stop", attempt) == "stale_after_cancel"
    after = get_run(kube, ns, "stop")
    assert "result" not in after["status"]
    assert after["status"]["phase"] == "Cancelled"
    recorded = attempts(kube, ns, "stop")[0]["status"]
    assert recorded["rejectedCommit"]["reason"] == "stale_after_cancel"


def test_a_superseded_worker_cannot_commit(kube: Kube, run_namespace: str, operator: OperatorProcess) -> None:
    ns = run_namespace
    retry = {"maxAttempts": 3, "backoff": {"initialSeconds": 1, "factor": 1.0, "maxSeconds": 1}}
    scenario = {"steps": 2, "fail": {"attempts": [1], "atStep": 2, "how": "crash"}}
    create_run(kube, ns, scenario_run("zombie", scenario, retry=retry))
    run = wait_phase(kube, ns, "zombie", {"Succeeded", "Failed"})
    assert run["status"]["committedBy"]["attempt"] == "zombie-a2"
    first = attempts(kube, ns, "zombie")[0]

    assert zombie_commit(kube, ns, "zombie", first) == "stale_worker"
    after = get_run(kube, ns, "zombie")
    assert after["status"]["result"] == run["status"]["result"], "the late result is not visible"
    assert after["status"]["committedBy"]["attempt"] == "zombie-a2"
    assert attempts(kube, ns, "zombie")[0]["status"]["rejectedCommit"]["reason"] == "stale_worker"


@pytest.mark.parametrize("skew", [-3600, 3600], ids=["an hour behind", "an hour ahead"])
def test_a_request_expires_on_the_operators_clock_whatever_the_workers_clock_says(
    kube: Kube, run_namespace: str, operator: OperatorProcess, skew: int
) -> None:
    ns, name = run_namespace, f"skew{'-behind' if skew < 0 else '-ahead'}"
    scenario = {"steps": 2, "ask": {"atStep": 2, "schema": PRIORITY, "expiresInSeconds": 600}}
    body = support_agent_run(name, "skewed_clock_agent", scenario)
    body["spec"]["agent"]["env"].append({"name": "AGENT_CLOCK_SKEW_SECONDS", "value": str(skew)})
    create_run(kube, ns, body)
    waiting = wait_phase(kube, ns, name, {"InputRequired", "Failed", "Succeeded"})
    assert waiting["status"]["phase"] == "InputRequired", waiting["status"]
    pending = waiting["status"]["pendingRequest"]
    assert pending["expiresInSeconds"] == 600
    expires_at = datetime.datetime.fromisoformat(pending["expiresAt"].replace("Z", "+00:00"))
    left = (expires_at - datetime.datetime.now(datetime.UTC)).total_seconds()
    # The operator's now + 600 s, read a while later (how long is the machine's pace, not bounded here): a
    # worker's clock an hour off would put it an hour out of this range.
    assert 0 < left <= 600, f"expiresAt {pending['expiresAt']} is not the operator's now + 600 s"
    patch_spec(kube, ns, name, resume_patch(pending, {"priority": "low"}, "k1"))
    done = wait_phase(kube, ns, name, {"Succeeded", "Failed"})
    assert done["status"]["phase"] == "Succeeded", done["status"]
