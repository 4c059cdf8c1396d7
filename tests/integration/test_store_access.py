"""The agent-state store's credentials per namespace, on a real API server with the operator running:
a Run whose namespace holds no Secret of them fails before any Pod and says what to create; once it is
created, a retry runs."""

from __future__ import annotations

import pytest

from devcluster import security
from devcluster.cluster import LocalCluster
from devcluster.operator import OperatorProcess
from support.clusters import opt_in_for_attempts
from support.kube import Kube
from support.runs import attempts, create_run, get_run, patch_spec, scenario_run, wait_phase

pytestmark = pytest.mark.cluster


def test_a_run_without_store_credentials_fails_before_any_pod_and_runs_once_they_exist(
    kube: Kube, local_cluster: LocalCluster, namespace: str, operator: OperatorProcess
) -> None:
    opt_in_for_attempts(kube, namespace)  # everything but the Secret
    create_run(kube, namespace, scenario_run("needs-store", {"steps": 1}))

    run = wait_phase(kube, namespace, "needs-store", {"Failed", "Succeeded"})
    failure = run["status"]["failure"]
    assert (run["status"]["phase"], failure["reason"]) == ("Failed", "StateStoreCredentialsMissing")
    create = (
        f"kubectl create secret generic {security.STATE_STORE_SECRET} -n {namespace} "
        "--from-literal=AWS_ACCESS_KEY_ID=... --from-literal=AWS_SECRET_ACCESS_KEY=..."
    )
    assert create in run["status"]["message"]
    assert attempts(kube, namespace, "needs-store") == []
    assert kube.core.list_namespaced_pod(namespace, label_selector="agentrun.dev/run=needs-store").items == []

    kube.core.create_namespaced_secret(
        namespace, security.state_store_secret(namespace, local_cluster.state_store_env())
    )
    patch_spec(kube, namespace, "needs-store", {"retryRequest": {"idempotencyKey": "secret-created"}})

    run = wait_phase(kube, namespace, "needs-store", {"Succeeded"})
    assert get_run(kube, namespace, "needs-store")["status"]["phase"] == "Succeeded"
