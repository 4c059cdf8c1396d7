"""What a real kubelet reports, and the failure class each gets (docs/runs.md, "What the kubelet reports"):
an agent OOM-killed at its memory limit, an image that is not there or cannot be pulled, a Secret that is
missing (then created, or never), a container killed by the runtime, a Pod deleted with its grace period,
and a pause and a cancel in a real container.

The chart is installed as test_helm installs it (its `release` fixture: namespace-scoped, restricted Pod
Security). The process node agent reports none of the kubelet's waiting reasons and enforces no memory
limit: this module needs a cluster that runs images (AGENTRUN_E2E_KUBECONFIG, `make e2e-kind`)."""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from e2e.test_helm import AGENT_SERVICE_ACCOUNT, RESTRICTED_POD, Release, namespaces, release
from support.kube import wait_for
from support.runs import (
    FAST_RETRY,
    GROUP,
    VERSION,
    attempts,
    create_run,
    get_run,
    patch_spec,
    resume,
    wait_phase,
)

pytestmark = [pytest.mark.cluster, pytest.mark.kind]
__all__ = ["namespaces", "release"]  # the module's fixtures: a release of its own, as test_helm's

ENDED = {"Succeeded", "Failed", "Cancelled", "NeedsReconciliation"}


@pytest.fixture
def kind(release: Release) -> Release:
    if release.target.local:
        pytest.fail("the process node agent is no kubelet: run this module on kind (make e2e-kind)")
    return release


def agent_run(
    release: Release,
    name: str,
    command: list[str],
    *,
    input: dict[str, Any] | None = None,
    container: dict[str, Any] | None = None,
    image: str | None = None,
    resources: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A Run in the release's namespace under restricted Pod Security; `container` adds to the agent
    container of the pod template (imagePullPolicy, envFrom)."""
    pod = copy.deepcopy(RESTRICTED_POD)
    pod["containers"][0] |= container or {}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Run",
        "metadata": {"name": name},
        "spec": {
            "agent": {
                "image": image or release.target.agent_image,
                "command": command,
                "serviceAccountName": AGENT_SERVICE_ACCOUNT,
                "podTemplate": {"spec": pod},
                **({"resources": resources} if resources else {}),
            },
            "input": input or {},
            "podGC": "Never",  # its Pod is looked at once the Run has ended
            **spec,
        },
    }


ECHO = ["python", "-m", "agentrun.examples.echo"]
SCENARIO = ["python", "-m", "agentrun.examples.scenario"]


def failure_of(run: dict[str, Any]) -> dict[str, Any]:
    failure: dict[str, Any] = run["status"]["failure"]
    return failure


def kept_waiting(release: Release, pod: str, reason: str) -> Callable[[], bool]:
    """Whether the kubelet says it keeps the Pod's agent container waiting for `reason`."""

    def probe() -> bool:
        found = release.kube.pod(pod, release.namespace)
        statuses = ((found or {}).get("status") or {}).get("containerStatuses") or []
        return any((s.get("state") or {}).get("waiting", {}).get("reason") == reason for s in statuses)

    return probe


def at_checkpoint(release: Release, run: str, checkpoint: str) -> None:
    wait_for(
        lambda: (
            get_run(release.kube, release.namespace, run).get("status", {}).get("latestCheckpoint")
            == checkpoint
        ),
        180,
        what=f"{run} at {checkpoint}",
    )


# ---- containers that never start --------------------------------------------------------------------------


def test_an_image_that_can_never_be_pulled_fails_at_once_and_is_not_retried(kind: Release) -> None:
    absent = "agentrun/absent:0"
    body = agent_run(kind, "never-pulled", ECHO, image=absent, container={"imagePullPolicy": "Never"})
    create_run(kind.kube, kind.namespace, body)

    run = wait_phase(kind.kube, kind.namespace, "never-pulled", ENDED)
    assert run["status"]["phase"] == "Failed", run["status"]
    failure = failure_of(run)
    assert (failure["class"], failure["reason"]) == ("deterministic", "ImageNotFound"), failure
    assert absent in failure["message"] and "ErrImageNeverPull" in failure["message"]
    assert len(attempts(kind.kube, kind.namespace, "never-pulled")) == 1


def test_an_image_pull_that_keeps_failing_fails_after_the_start_timeout(kind: Release) -> None:
    unreachable = "registry.invalid/agentrun/none:1"  # .invalid never resolves (RFC 2606)
    create_run(
        kind.kube,
        kind.namespace,
        agent_run(kind, "pull-failing", ECHO, image=unreachable, startTimeoutSeconds=20),
    )

    run = wait_phase(kind.kube, kind.namespace, "pull-failing", ENDED)
    assert run["status"]["phase"] == "Failed", run["status"]
    failure = failure_of(run)
    assert (failure["class"], failure["reason"]) == ("deterministic", "ImagePullFailed"), failure
    assert unreachable in failure["message"] and "startTimeoutSeconds (20s)" in failure["message"]
    assert len(attempts(kind.kube, kind.namespace, "pull-failing")) == 1


def test_a_missing_secret_is_waited_for_and_the_run_goes_on_once_it_exists(kind: Release) -> None:
    keys = {"envFrom": [{"secretRef": {"name": "late-keys"}}]}
    body = agent_run(
        kind, "late-secret", ECHO, input={"message": "hi"}, container=keys, startTimeoutSeconds=900
    )
    create_run(kind.kube, kind.namespace, body)
    waiting = kept_waiting(kind, "late-secret-a1", "CreateContainerConfigError")
    wait_for(waiting, 180, what="the kubelet keeping the container waiting for its Secret")
    assert get_run(kind.kube, kind.namespace, "late-secret")["status"]["phase"] == "Running"

    kind.kube.core.create_namespaced_secret(
        kind.namespace, {"metadata": {"name": "late-keys"}, "stringData": {"MODEL_KEY": "k"}}
    )
    run = wait_phase(kind.kube, kind.namespace, "late-secret", ENDED)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert len(attempts(kind.kube, kind.namespace, "late-secret")) == 1


def test_a_secret_that_stays_missing_fails_after_the_start_timeout_naming_it(kind: Release) -> None:
    keys = {"envFrom": [{"secretRef": {"name": "never-made"}}]}
    create_run(
        kind.kube, kind.namespace, agent_run(kind, "no-secret", ECHO, container=keys, startTimeoutSeconds=15)
    )

    run = wait_phase(kind.kube, kind.namespace, "no-secret", ENDED)
    assert run["status"]["phase"] == "Failed", run["status"]
    failure = failure_of(run)
    assert (failure["class"], failure["reason"]) == ("deterministic", "ConfigMissing"), failure
    assert 'secret "never-made" not found' in failure["message"]


# ---- containers stopped from outside ----------------------------------------------------------------------


def test_an_agent_oom_killed_at_its_limit_is_infrastructure_and_the_same_oom_twice_stops(
    kind: Release,
) -> None:
    hog = ["python", "-c", 'blocks = [b"x" * (16 << 20) for _ in range(64)]']  # 1 GiB, written
    retry = {**FAST_RETRY, "sameErrorLimit": 2}
    body = agent_run(kind, "hog", hog, resources={"limits": {"memory": "48Mi"}}, retry=retry)
    create_run(kind.kube, kind.namespace, body)

    run = wait_phase(kind.kube, kind.namespace, "hog", ENDED)
    assert run["status"]["phase"] == "Failed", run["status"]
    assert failure_of(run)["reason"] == "RepeatedFailure", failure_of(run)
    tried = attempts(kind.kube, kind.namespace, "hog")
    assert len(tried) == 2
    for attempt in tried:
        failure = attempt["status"]["failure"]
        assert failure["class"] == "infrastructure", failure
        assert failure["message"] == "the agent container was OOMKilled at its memory limit of 48Mi"


def scenario_hanging_at_step_2(kind: Release, name: str, **spec: Any) -> None:
    """A Run whose first Attempt checkpoints step 1, then hangs (a later Attempt runs through)."""
    scenario = {"steps": 3, "fail": {"attempts": [1], "atStep": 2, "how": "hang"}}
    create_run(
        kind.kube, kind.namespace, agent_run(kind, name, SCENARIO, input=scenario, retry=FAST_RETRY, **spec)
    )
    at_checkpoint(kind, name, f"{name}-a1-s1")


def test_a_container_killed_by_the_runtime_continues_from_its_checkpoint(kind: Release) -> None:
    scenario_hanging_at_step_2(kind, "runtime-killed")

    def started() -> dict[str, Any] | None:  # the kubelet may post the container's id after it wrote
        pod = kind.kube.pod("runtime-killed-a1", kind.namespace)
        statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or [{}]
        return pod if statuses[0].get("containerID") else None

    pod = wait_for(started, 120, what="the kubelet's container id of the attempt Pod")
    node = pod["spec"]["nodeName"]  # a kind node is the Docker container of its name
    container = pod["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    subprocess.run(
        ["docker", "exec", node, "crictl", "stop", "--timeout", "0", container], check=True, timeout=60
    )

    run = wait_phase(kind.kube, kind.namespace, "runtime-killed", ENDED)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    first, second = attempts(kind.kube, kind.namespace, "runtime-killed")
    assert first["status"]["failure"]["class"] == "infrastructure", first["status"]
    assert first["status"]["failure"]["exitCode"] == 137
    assert second["spec"]["resumeFrom"] == "runtime-killed-a1-s1"
    assert run["status"]["result"]["resumedAt"] == 1


def test_a_pod_deleted_with_its_grace_period_stops_its_sdk_and_continues(kind: Release) -> None:
    scenario_hanging_at_step_2(kind, "drained")
    kind.kube.core.delete_namespaced_pod("drained-a1", kind.namespace)  # SIGTERM, then its grace period

    run = wait_phase(kind.kube, kind.namespace, "drained", ENDED)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    first, second = attempts(kind.kube, kind.namespace, "drained")
    failure = first["status"]["failure"]
    assert failure["class"] == "infrastructure", failure
    assert failure["message"].startswith("the attempt Pod was stopped (SIGTERM"), failure
    assert failure["exitCode"] != 137  # the SDK stopped on SIGTERM: not killed at the grace period's end
    assert second["spec"]["resumeFrom"] == "drained-a1-s1"


def test_a_pause_and_a_cancel_keep_their_promises_in_a_real_container(kind: Release) -> None:
    # pause: the agent waits before its second step until a file exists in its container, so the pause is
    # asked for while the Run is mid-way however slow the machine
    scenario = {"steps": 6, "gate": {"file": "/tmp/gate", "atStep": 2}}
    create_run(kind.kube, kind.namespace, agent_run(kind, "pausable", SCENARIO, input=scenario))
    at_checkpoint(kind, "pausable", "pausable-a1-s1")
    patch_spec(
        kind.kube, kind.namespace, "pausable", {"pause": {"requestId": "upgrade-1", "reason": "upgrade"}}
    )
    kind.kube.kubectl(
        "exec", "pausable-a1", "-c", "agent", "--", "touch", "/tmp/gate", namespace=kind.namespace
    )
    paused = wait_phase(kind.kube, kind.namespace, "pausable", {"Paused", *ENDED})
    assert paused["status"]["phase"] == "Paused", paused["status"]
    pending = paused["status"]["pendingRequest"]
    assert pending["checkpointId"] == paused["status"]["latestCheckpoint"]
    steps_done = int(pending["checkpointId"].rsplit("-s", 1)[1])
    assert steps_done < 6, "paused before the end"
    resume(kind.kube, kind.namespace, "pausable", pending, {}, key="go-on")
    done = wait_phase(kind.kube, kind.namespace, "pausable", ENDED)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert done["status"]["result"]["resumedAt"] == steps_done

    # cancel: the Pod is deleted (SIGTERM reaches the SDK) and nothing it does after changes the Run
    scenario_hanging_at_step_2(kind, "cancellable")
    patch_spec(kind.kube, kind.namespace, "cancellable", {"cancelEpoch": 1})
    cancelled = wait_phase(kind.kube, kind.namespace, "cancellable", ENDED)
    assert cancelled["status"]["phase"] == "Cancelled", cancelled["status"]
    wait_for(lambda: kind.kube.pod("cancellable-a1", kind.namespace) is None, 120, what="the Pod gone")
    (attempt,) = attempts(kind.kube, kind.namespace, "cancellable")
    assert attempt["status"]["phase"] == "Aborted", attempt["status"]
    assert "result" not in get_run(kind.kube, kind.namespace, "cancellable")["status"]
