"""The security model, enforced by the API server: a hostile agent in the same namespace, a token that is
not bound to a Pod, and Pods that only the operator may create (agentrun.admission)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from agentrun.examples.manifests import IMAGE, agent_run
from devcluster.cluster import LocalCluster
from devcluster.operator import OperatorProcess
from support.agentrun import error_message
from support.hostile_agent import EXPECTED_CAUSES, refusals_missing
from support.kube import Kube, wait_for
from support.runs import (
    FAST_RETRY,
    GROUP,
    VERSION,
    attempts,
    create_run,
    get_run,
    support_agent_run,
    wait_phase,
)

pytestmark = pytest.mark.cluster
TOKEN_CACHE_SECONDS = 10


def start_gated(kube: Kube, ns: str, name: str, release: Path, **spec: Any) -> dict[str, Any]:
    """A Run of the gated agent, Running past its first Checkpoint: it commits once `release` exists."""
    body = support_agent_run(name, "gated_agent", {"releaseFile": str(release)})
    body["spec"] |= spec
    create_run(kube, ns, body)
    running: dict[str, Any] = wait_for(
        lambda: (run := get_run(kube, ns, name)).get("status", {}).get("latestCheckpoint") and run,
        timeout=120,
        what=f"{name} Running past its first checkpoint",
    )
    return running


def test_a_hostile_agent_in_the_same_namespace_is_refused_every_forged_write(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    ns = run_namespace
    release = tmp_path / "release-victim"
    running = start_gated(kube, ns, "victim", release)
    assert running["status"]["phase"] == "Running"

    create_run(
        kube,
        ns,
        support_agent_run("attacker", "hostile_agent", {"victim": "victim", "victimAttempt": "victim-a1"}),
    )
    attacker = wait_phase(kube, ns, "attacker", {"Succeeded", "Failed"}, timeout=120)
    assert attacker["status"]["phase"] == "Succeeded", (attacker["status"], operator.log_tail())
    outcomes = attacker["status"]["result"]["outcomes"]
    assert set(outcomes) == set(EXPECTED_CAUSES)
    assert refusals_missing(outcomes) == {}, json.dumps(outcomes, indent=1)

    # read while the victim still holds it (a finished Run's Lease is deleted)
    lease = kube.coordination.read_namespaced_lease("victim.run.agentrun.dev", ns)
    assert lease.spec.lease_duration_seconds == running["spec"]["lease"]["durationSeconds"]
    release.write_text("go")
    done = wait_phase(kube, ns, "victim", {"Succeeded", "Failed"}, timeout=120)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert done["status"]["result"] == {"by": "victim-a1"}
    assert done["status"]["committedBy"]["attempt"] == "victim-a1"


def _token_not_bound_to_a_pod(kube: Kube, namespace: str) -> str:
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 600},
    }
    answer = kube.core.create_namespaced_service_account_token("default", namespace, request)
    token: str = answer.status.token
    return token


def test_a_token_of_the_agents_service_account_not_bound_to_a_pod_is_refused(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    ns = run_namespace
    release = tmp_path / "release"
    run = start_gated(kube, ns, "plain", release)
    as_agent = kube.with_token(_token_not_bound_to_a_pod(kube, ns))
    patch = {
        "status": {
            "result": {"forged": True},
            "committedBy": {
                "attempt": "plain-a1",
                "leaseEpoch": run["status"]["leaseEpoch"],
                "cancelEpoch": 0,
            },
        }
    }
    with pytest.raises(ApiException) as refused:
        as_agent.custom.patch_namespaced_custom_object_status(
            "agentrun.dev", "v1alpha1", ns, "runs", "plain", patch
        )
    assert refused.value.status == 403
    assert "NotPodBound:" in error_message(refused.value)
    release.write_text("go")
    assert wait_phase(kube, ns, "plain", {"Succeeded", "Failed"})["status"]["result"] == {"by": "plain-a1"}


def test_only_the_operator_creates_pods_labelled_with_a_run(
    kube: Kube, namespace: str, operator_kubeconfig: Path
) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "victim-a1", "labels": {"agentrun.dev/run": "victim"}},
        "spec": {"containers": [{"name": "agent", "image": IMAGE, "command": ["python", "-c", "pass"]}]},
    }
    with pytest.raises(ApiException) as refused:
        kube.core.create_namespaced_pod(namespace, pod)  # as the cluster admin: still not the operator
    assert refused.value.status == 403
    assert "NotOperator:" in error_message(refused.value)


def test_a_superseded_attempts_pod_is_gone_and_its_token_refused_before_the_next_attempt(
    kube: Kube, local_cluster: LocalCluster, run_namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    ns = run_namespace
    release = tmp_path / "release"
    # 10 s, not 5: the second Attempt's worker holds its lease while the test waits out the token cache,
    # and at a 1-min load of 13-15 a real worker process was seen to miss a 5 s lease.
    lease = {"durationSeconds": 10, "renewSeconds": 1}
    start_gated(kube, ns, "zombie", release, lease=lease, retry=FAST_RETRY)
    first = kube.core.read_namespaced_pod("zombie-a1", ns)
    sandbox = local_cluster.state_dir / "node" / "pods" / first.metadata.uid
    token = (sandbox / "serviceaccount" / "token").read_text()  # what a hostile agent could have kept
    as_first = kube.with_token(token)
    assert as_first.custom.get_namespaced_custom_object("agentrun.dev", "v1alpha1", ns, "runs", "zombie")

    pid = int(first.status.container_statuses[0].container_id.removeprefix("process://"))
    os.killpg(pid, signal.SIGSTOP)  # frozen past its lease: the operator takes over
    wait_for(
        lambda: [a for a in attempts(kube, ns, "zombie") if a["spec"]["number"] == 2],
        timeout=120,
        what="Attempt 2 granted",
    )
    assert kube.pod("zombie-a1", ns) is None, "the superseded Pod outlived the grant of its successor"

    def refused() -> int | None:
        try:
            as_first.custom.get_namespaced_custom_object("agentrun.dev", "v1alpha1", ns, "runs", "zombie")
        except ApiException as error:
            return int(error.status)
        return None

    # The API server keeps a token it has accepted in its authentication cache for 10 s
    # (TokenSuccessCacheTTL, not configurable); a token whose Pod is gone is refused once that expires.
    # (bounded generously above that: a loaded API server's answer may take a while)
    assert wait_for(refused, timeout=TOKEN_CACHE_SECONDS + 110, what="the superseded token refused") == 401

    release.write_text("go")
    done = wait_phase(kube, ns, "zombie", {"Succeeded", "Failed"}, timeout=120)
    assert done["status"]["result"] == {"by": "zombie-a2"}


def test_the_operator_itself_writes_only_pods_and_leases_labelled_with_a_run(
    kube: Kube, namespace: str, operator_kubeconfig: Path
) -> None:
    as_operator = Kube(operator_kubeconfig, kube.kubectl_path)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "not-an-attempt"},
        "spec": {"containers": [{"name": "c", "image": IMAGE, "command": ["python", "-c", "pass"]}]},
    }
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "someone-elses"}}
    creates: tuple[Callable[[], object], ...] = (
        lambda: as_operator.core.create_namespaced_pod(namespace, pod),
        lambda: as_operator.coordination.create_namespaced_lease(namespace, lease),
    )
    for create in creates:
        with pytest.raises(ApiException) as refused:
            create()
        assert refused.value.status == 403
        assert "NotOwnRun: the agentrun operator writes only" in error_message(refused.value)
    kube.coordination.create_namespaced_lease(namespace, lease)  # someone else's, made by the admin
    with pytest.raises(ApiException) as refused:
        as_operator.coordination.delete_namespaced_lease("someone-elses", namespace)
    assert refused.value.status == 403


def test_the_operator_changes_nothing_of_a_runs_main_resource_but_its_managed_fields(
    kube: Kube, namespace: str, operator_kubeconfig: Path, agentrun_crds: None
) -> None:
    # RBAC lets the operator patch a Run (to clear a finished one's managedFields); the API server holds
    # it to that one field.
    as_operator = Kube(operator_kubeconfig, kube.kubectl_path)
    create_run(kube, namespace, agent_run("held-to-its-field", "echo", {"n": 1}))
    writes: tuple[dict[str, Any], ...] = (
        {"spec": {"cancelEpoch": 1}},
        {"metadata": {"labels": {"forged": "yes"}}},
        {"metadata": {"annotations": {"forged": "yes"}}},
        {"metadata": {"finalizers": ["agentrun.dev/forged"]}},
    )
    for body in writes:
        with pytest.raises(ApiException) as refused:
            as_operator.custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, "runs", "held-to-its-field", body
            )
        assert refused.value.status == 403, error_message(refused.value)
        assert "NotOperatorField: the agentrun operator changes only metadata.managedFields of runs" in (
            error_message(refused.value)
        )
    cleared = as_operator.custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "runs", "held-to-its-field", {"metadata": {"managedFields": [{}]}}
    )
    assert "managedFields" not in cleared["metadata"]
    assert get_run(kube, namespace, "held-to-its-field")["spec"].get("cancelEpoch", 0) == 0


def refused_start(kubeconfig: Path, log: Path, **env: str) -> str:
    """Starts the operator and waits for it to exit; returns its log (it must refuse, exit code 2)."""
    process = OperatorProcess(
        kubeconfig,
        log,
        env={"AGENTRUN_METRICS_PORT": "0", "AGENTRUN_ADMISSION_POLICY_WAIT_SECONDS": "0", **env},
    )
    process.start()
    assert process.process is not None
    try:
        code = process.process.wait(timeout=120)
    finally:
        process.stop()
    text = log.read_text()
    assert code == 2, text
    return text


def test_the_operator_refuses_to_start_without_the_policies_it_relies_on(
    kube: Kube, namespace: str, operator_kubeconfig: Path, agentrun_crds: None, tmp_path: Path
) -> None:
    """The session's policies exempt agentrun-system/agentrun-operator: an operator that is another
    ServiceAccount finds them installed for someone else; one that may not read them says so. (Every
    other test's operator starts: the check passes against the policies the session installed.)"""
    other = refused_start(
        operator_kubeconfig,
        tmp_path / "other.log",
        AGENTRUN_SERVICE_ACCOUNT="someone-else",
        AGENTRUN_SERVICE_ACCOUNT_NAMESPACE="agentrun-system",
    )
    assert "refusing to start" in other
    assert "does not name this operator (system:serviceaccount:agentrun-system:someone-else)" in other
    assert "--set admission.install=true --set serviceAccount.name=someone-else" in other

    # an identity without the ClusterRole that is installed with the policies cannot read them
    kube.core.create_namespaced_service_account(namespace, {"metadata": {"name": "unread"}})
    token = kube.core.create_namespaced_service_account_token(
        "unread", namespace, {"spec": {"expirationSeconds": 600}}
    ).status.token
    config = yaml.safe_load(kube.kubeconfig.read_text())
    config["users"] = [{"name": "unread", "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = "unread"
    path = tmp_path / "unread.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    unread = refused_start(
        path,
        tmp_path / "unread.log",
        AGENTRUN_SERVICE_ACCOUNT="unread",
        AGENTRUN_SERVICE_ACCOUNT_NAMESPACE=namespace,
    )
    assert "cannot read the admission policies the fences rely on" in unread
    assert "validatingadmissionpolicies" in unread and "forbidden" in unread
