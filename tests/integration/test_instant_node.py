"""The node agent's instant mode (hack/devcluster/nodeagent/instant.py) on a control plane of its own.

An echo Run goes to Succeeded through the real SDK protocol, run inside the node agent's process with the
Pod's service-account kubeconfig: the Lease is renewed by the Attempt, the commit is fenced, the Pod
reports exit code 0 like a process would. A Pod with any other command completes at once with exit 0
(the instant mode of the Job pods in the benchmarks).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import watch
from urllib3.exceptions import ProtocolError

from agentrun.examples.manifests import agent_run
from devcluster import security
from devcluster.operator import OperatorProcess
from devcluster.processes import free_port
from support.clusters import operator_identity, own_cluster
from support.kube import Kube, wait_for
from support.runs import attempts, create_run, wait_phase

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    """Overrides the session's `kube` in this module: a control plane of its own, in instant mode."""
    yield from own_cluster(tmp_path_factory, "instant-cluster", instant=True)


@pytest.fixture(scope="module")
def operator_kubeconfig(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Overrides the session's: the operator's identity and the admission policies on this module's
    control plane."""
    return operator_identity(kube, tmp_path_factory)


@pytest.fixture
def namespaced_operator(
    kube: Kube, run_namespace: str, tmp_path: Path, operator_kubeconfig: Path
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(
        operator_kubeconfig,
        tmp_path / "operator.log",
        env={"AGENTRUN_METRICS_PORT": str(free_port()), **security.OPERATOR_ENV},
        args=[f"--namespace={run_namespace}"],
    )
    process.start()
    process.wait_ready()
    try:
        yield process
    finally:
        process.stop()


def test_echo_run_succeeds_in_the_node_agents_process(
    kube: Kube, run_namespace: str, namespaced_operator: OperatorProcess
) -> None:
    ns = run_namespace
    # Every version of the Run's Lease, from a watch: a finished Run's Lease is deleted (compaction).
    leases: list[Any] = []
    watching = watch.Watch()

    def record() -> None:
        stream = watching.stream(
            kube.coordination.list_namespaced_lease,
            ns,
            field_selector="metadata.name=echo.run.agentrun.dev",
            timeout_seconds=600,  # bounds only a stuck test: the test stops the watch once it has seen enough
        )
        try:
            leases.extend(event["object"].spec for event in stream)
        except ProtocolError:  # the stream cut when the test stops the watch
            return

    recorder = threading.Thread(target=record, daemon=True)
    recorder.start()
    body = agent_run("echo", "echo", {"hello": "instant"})
    body["spec"]["podGC"] = "Never"  # its Pod is read below
    create_run(kube, ns, body)
    run = wait_phase(kube, ns, "echo", {"Succeeded", "Failed"}, timeout=120)
    assert run["status"]["phase"] == "Succeeded", namespaced_operator.log_tail()
    assert run["status"]["result"] == {"echo": {"hello": "instant"}}
    assert run["status"]["committedBy"] == {"attempt": "echo-a1", "leaseEpoch": 1, "cancelEpoch": 0}
    (attempt,) = attempts(kube, ns, "echo")
    assert attempt["status"]["phase"] == "Succeeded"

    pod = kube.wait_pod_phase("echo-a1", ns, ("Succeeded", "Failed"))
    (container,) = pod["status"]["containerStatuses"]
    assert container["containerID"].startswith("instant://")  # no process was started for it
    assert container["state"]["terminated"]["exitCode"] == 0
    assert pod["status"]["phase"] == "Succeeded"

    # the Attempt renewed the Lease it was granted (renew_once before the agent starts), with the Pod's
    # service account: the node's own credentials may not even read a Run
    def renewed() -> bool:
        return any(
            (s.holder_identity, s.lease_transitions) == ("echo-a1", 1) and s.renew_time > s.acquire_time
            for s in list(leases)
        )

    wait_for(renewed, 120, what="a renewal of echo-a1's Lease among its watched versions")
    watching.stop()


def test_other_containers_complete_at_once(kube: Kube, namespace: str) -> None:
    body = {
        "metadata": {"name": "not-run"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "none", "command": ["sh", "-c", "exit 3"]}],
        },
    }
    kube.core.create_namespaced_pod(namespace, body)
    pod = kube.wait_pod_phase("not-run", namespace, ("Succeeded", "Failed"))
    assert pod["status"]["phase"] == "Succeeded"
    (container,) = pod["status"]["containerStatuses"]
    assert container["state"]["terminated"]["exitCode"] == 0
