"""The agent-state store's credentials per namespace, on a real API server and the real object store: a Run
whose namespace holds no Secret of them fails before any Pod and says what to create; once it is created,
a retry runs. With the bundled server, the operator makes an opted-in namespace's principals (get and
put under its prefix; get only) and their Secrets, idempotently, when the namespace opts in (before any
Run), and takes them back from the server once the namespace is gone, even if it was down then."""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrun.clock import SystemClock
from agentrun.core.store_buckets import namespace_bucket
from agentrun.kubeapi import KubeApi
from agentrun.kubeauth import load_configuration
from agentrun.operator.settings import OperatorSettings
from agentrun.operator.store_credentials import StoreCredentials
from agentrun.statestore import parse_store_url
from agentrun.statestore.principals import Access, BundledStore, access_key
from devcluster import security
from devcluster.cluster import LocalCluster
from devcluster.objectstore import Credentials, s3_request
from devcluster.operator import OperatorProcess
from devcluster.processes import free_port
from support.clusters import opt_in_for_attempts
from support.kube import Kube, wait_for
from support.runs import GROUP, VERSION, attempts, create_run, get_run, patch_spec, scenario_run, wait_phase

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


def secret_values(kube: Kube, namespace: str, name: str) -> dict[str, str]:
    secret = kube.core.read_namespaced_secret(name, namespace)
    return {k: base64.b64decode(v).decode() for k, v in secret.data.items()}


def secret_credentials(kube: Kube, namespace: str, name: str) -> tuple[Credentials, str]:
    secret = kube.core.read_namespaced_secret(name, namespace)
    values = secret_values(kube, namespace, name)
    credentials = Credentials(values["AWS_ACCESS_KEY_ID"], values["AWS_SECRET_ACCESS_KEY"])
    return credentials, secret.metadata.resource_version


def put(cluster: LocalCluster, key: str, credentials: Credentials, bucket: str | None = None) -> int:
    """A PUT of `key` in `bucket`, by default the bucket of its namespace (its first segment)."""
    assert cluster.object_store is not None
    store = cluster.object_store
    path = f"/{bucket or namespace_bucket(store.bucket, key.split('/', maxsplit=1)[0])}/{key}"
    return s3_request("PUT", store.endpoint, path, body=b"state", credentials=credentials)[0]


def test_an_opted_in_namespace_gets_its_own_principals_and_secrets_from_the_operator(
    kube: Kube, local_cluster: LocalCluster, namespace: str, operator_kubeconfig: Path
) -> None:
    other = f"{namespace}-other"
    local_cluster.namespace_store_env(other)  # another namespace's bucket and principals on the server
    checks = store_credentials(operator_kubeconfig, local_cluster)

    async def scenario() -> None:
        assert await checks.missing(namespace)  # looking for the Secret makes nothing
        assert kube.core.list_namespaced_secret(namespace).items == []
        assert await checks.provision(namespace)  # what a Run's table asks for (ProvisionStoreCredentials)
        assert not await checks.missing(namespace)
        checks.api.close()

    asyncio.run(scenario())

    writer, version = secret_credentials(kube, namespace, security.STATE_STORE_SECRET)
    reader, _ = secret_credentials(kube, namespace, security.STATE_STORE_SECRET + "-read")
    root = local_cluster.state_store_env()["AWS_ACCESS_KEY_ID"]
    assert root not in (writer.access_key, reader.access_key)
    assert put(local_cluster, f"{namespace}/run/sha256/a", writer) == 200
    assert put(local_cluster, f"{other}/run/sha256/a", writer) == 403  # in its bucket
    own = namespace_bucket("agentrun", namespace)
    assert put(local_cluster, f"{other}/run/sha256/a", writer, bucket=own) == 403  # another prefix
    assert put(local_cluster, f"{namespace}/run/sha256/b", reader) == 403
    # both Secrets name the namespace's own bucket: what people set to read with the read-only one
    for name in (security.STATE_STORE_SECRET, security.STATE_STORE_SECRET + "-read"):
        url = secret_values(kube, namespace, name)["AGENTRUN_STATE_STORE_URL"]
        assert url == local_cluster.namespace_store_url(namespace)
        assert parse_store_url(url).bucket == namespace_bucket("agentrun", namespace)

    # again, by a restarted operator (nothing remembered): the Secrets and their credentials are kept
    again = store_credentials(operator_kubeconfig, local_cluster)

    async def rerun() -> None:
        await again.provision(namespace)
        again.api.close()

    asyncio.run(rerun())
    assert secret_credentials(kube, namespace, security.STATE_STORE_SECRET) == (writer, version)
    assert put(local_cluster, f"{namespace}/run/sha256/c", writer) == 200
    for made in (namespace, other):  # as an operator would once the namespaces are gone
        local_cluster.forget_namespace_store(made)


# ---- ... when the namespace opts in, and back from the server when it is gone ---------------------------


@pytest.fixture
def own_namespace(kube: Kube) -> Iterator[str]:
    """A fresh namespace that the test deletes itself (deleted at the end if it did not)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    kube.core.create_namespace({"metadata": {"name": name, "labels": {"agentrun.dev/test": "true"}}})
    try:
        yield name
    finally:
        if kube.core.list_namespace(field_selector=f"metadata.name={name}").items:
            kube.core.delete_namespace(name)


def provisioning_operator(
    operator_kubeconfig: Path, cluster: LocalCluster, namespace: str, log: Path
) -> OperatorProcess:
    """An operator of `namespace` only, administering the bundled server (its root credentials)."""
    process = OperatorProcess(
        operator_kubeconfig,
        log,
        env={
            "AGENTRUN_METRICS_PORT": str(free_port()),
            **security.OPERATOR_ENV,
            **security.state_store_operator_env(cluster.state_store_url),
            **cluster.state_store_env(),
            "AGENTRUN_STATE_STORE_PROVISION": "versitygw",
        },
        args=[f"--namespace={namespace}"],
    )
    process.start()
    process.wait_ready()
    return process


def server_principals(cluster: LocalCluster) -> BundledStore:
    assert cluster.object_store is not None
    return BundledStore(parse_store_url(cluster.state_store_url), cluster.object_store.credentials)


def named_on_server(cluster: LocalCluster, namespace: str) -> set[str]:
    """The namespace's principals the server holds, as users or in its bucket's policy."""
    held = server_principals(cluster).principals()
    return {access_key(namespace, a) for a in Access} & (held.users | held.granted)


def secrets_made(kube: Kube, namespace: str) -> dict[str, tuple[Credentials, str]]:
    names = (security.STATE_STORE_SECRET, security.STATE_STORE_SECRET + "-read")
    found = {s.metadata.name for s in kube.core.list_namespaced_secret(namespace).items}
    return {name: secret_credentials(kube, namespace, name) for name in names} if set(names) <= found else {}


def namespace_gone(kube: Kube, namespace: str) -> bool:
    return not kube.core.list_namespace(field_selector=f"metadata.name={namespace}").items


@pytest.mark.usefixtures("agentrun_crds")  # an operator process: it waits for the CRDs
def test_an_opted_in_namespace_gets_its_secrets_before_any_run_and_its_principals_go_with_it(
    kube: Kube,
    local_cluster: LocalCluster,
    own_namespace: str,
    operator_kubeconfig: Path,
    tmp_path: Path,
) -> None:
    ns = own_namespace
    operator = provisioning_operator(operator_kubeconfig, local_cluster, ns, tmp_path / "operator.log")
    try:
        assert named_on_server(local_cluster, ns) == set()
        opt_in_for_attempts(kube, ns)  # the label on its agents' ServiceAccount: no Run anywhere

        made = wait_for(lambda: secrets_made(kube, ns), timeout=30, what=f"the store's Secrets in {ns}")
        assert kube.custom.list_namespaced_custom_object(GROUP, VERSION, ns, "runs")["items"] == []
        writer, _ = made[security.STATE_STORE_SECRET]
        assert put(local_cluster, f"{ns}/run/sha256/a", writer) == 200
        local_cluster.namespace_store_env(f"{ns}-other")  # another namespace's bucket on the server
        assert put(local_cluster, f"{ns}-other/run/sha256/a", writer) == 403
        local_cluster.forget_namespace_store(f"{ns}-other")
        assert named_on_server(local_cluster, ns) == {access_key(ns, a) for a in Access}

        kube.core.delete_namespace(ns)

        wait_for(
            lambda: not named_on_server(local_cluster, ns),
            timeout=60,
            interval=0.5,
            what=f"{ns}'s principals taken back from the server",
        )
        assert put(local_cluster, f"{ns}/run/sha256/b", writer) == 403
    finally:
        operator.stop()
    log = operator.log_path.read_text()
    assert f"took back namespace {ns}'s principals" in log and "sweep failed" not in log


@pytest.mark.usefixtures("agentrun_crds")  # an operator process: it waits for the CRDs
def test_an_operator_down_while_a_namespace_is_deleted_takes_its_principals_back_when_it_starts(
    kube: Kube,
    local_cluster: LocalCluster,
    own_namespace: str,
    operator_kubeconfig: Path,
    tmp_path: Path,
) -> None:
    ns, log = own_namespace, tmp_path / "operator.log"
    operator = provisioning_operator(operator_kubeconfig, local_cluster, ns, log)
    try:
        opt_in_for_attempts(kube, ns)
        wait_for(lambda: secrets_made(kube, ns), timeout=30, what=f"the store's Secrets in {ns}")
    finally:
        operator.stop()

    kube.core.delete_namespace(ns)
    wait_for(lambda: namespace_gone(kube, ns), timeout=60, interval=0.5, what=f"{ns} deleted")
    assert named_on_server(local_cluster, ns) == {access_key(ns, a) for a in Access}  # nobody took them

    operator = provisioning_operator(operator_kubeconfig, local_cluster, ns, log)
    try:
        wait_for(
            lambda: not named_on_server(local_cluster, ns),
            timeout=60,
            interval=0.5,
            what=f"{ns}'s principals taken back by the restarted operator",
        )
    finally:
        operator.stop()
