"""The agent-state store's credentials per namespace, on a real API server and the real object store: a Run
whose namespace holds no Secret of them fails before any Pod and says what to create; once it is created,
a retry runs. With the bundled server, the operator makes an opted-in namespace's principals (get and
put under its prefix; get only) and their Secrets, idempotently."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import pytest

from agentrun.clock import SystemClock
from agentrun.kubeapi import KubeApi
from agentrun.kubeauth import load_configuration
from agentrun.operator.settings import OperatorSettings
from agentrun.operator.store_credentials import StoreCredentials
from devcluster import security
from devcluster.cluster import LocalCluster
from devcluster.objectstore import Credentials, s3_request
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
        namespace, security.state_store_secret(namespace, local_cluster.namespace_store_env(namespace))
    )
    patch_spec(kube, namespace, "needs-store", {"retryRequest": {"idempotencyKey": "secret-created"}})

    run = wait_phase(kube, namespace, "needs-store", {"Succeeded"})
    assert get_run(kube, namespace, "needs-store")["status"]["phase"] == "Succeeded"


# ---- with the bundled server, the operator makes a namespace's principals -------------------------------


def store_credentials(operator_kubeconfig: Path, cluster: LocalCluster) -> StoreCredentials:
    """The operator's part as its own identity (its RBAC), configured with the bundled server (the
    operator holds the server's root credentials)."""
    config = OperatorSettings(state_store_url=cluster.state_store_url, state_store_provision=True)
    api = KubeApi(load_configuration(str(operator_kubeconfig)))
    return StoreCredentials.for_settings(api, SystemClock(), config, environ=cluster.state_store_env())


def secret_credentials(kube: Kube, namespace: str, name: str) -> tuple[Credentials, str]:
    secret = kube.core.read_namespaced_secret(name, namespace)
    values = {k: base64.b64decode(v).decode() for k, v in secret.data.items()}
    credentials = Credentials(values["AWS_ACCESS_KEY_ID"], values["AWS_SECRET_ACCESS_KEY"])
    return credentials, secret.metadata.resource_version


def put(cluster: LocalCluster, key: str, credentials: Credentials) -> int:
    assert cluster.object_store is not None
    store = cluster.object_store
    path = f"/{store.bucket}/{key}"
    return s3_request("PUT", store.endpoint, path, body=b"state", credentials=credentials)[0]


def test_an_opted_in_namespace_gets_its_own_principals_and_secrets_from_the_operator(
    kube: Kube, local_cluster: LocalCluster, namespace: str, operator_kubeconfig: Path
) -> None:
    other = f"{namespace}-other"
    checks = store_credentials(operator_kubeconfig, local_cluster)

    async def scenario() -> None:
        assert await checks.missing(namespace, opted_in=False)  # not opted in: nothing is made
        assert kube.core.list_namespaced_secret(namespace).items == []
        assert not await checks.missing(namespace, opted_in=True)
        checks.api.close()

    asyncio.run(scenario())

    writer, version = secret_credentials(kube, namespace, security.STATE_STORE_SECRET)
    reader, _ = secret_credentials(kube, namespace, security.STATE_STORE_SECRET + "-read")
    root = local_cluster.state_store_env()["AWS_ACCESS_KEY_ID"]
    assert root not in (writer.access_key, reader.access_key)
    assert put(local_cluster, f"{namespace}/run/sha256/a", writer) == 200
    assert put(local_cluster, f"{other}/run/sha256/a", writer) == 403
    assert put(local_cluster, f"{namespace}/run/sha256/b", reader) == 403

    # again, by a restarted operator (nothing remembered): the Secrets and their credentials are kept
    again = store_credentials(operator_kubeconfig, local_cluster)

    async def rerun() -> None:
        await again.provision(namespace)
        again.api.close()

    asyncio.run(rerun())
    assert secret_credentials(kube, namespace, security.STATE_STORE_SECRET) == (writer, version)
    assert put(local_cluster, f"{namespace}/run/sha256/c", writer) == 200
