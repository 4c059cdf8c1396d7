"""The Helm chart end to end: lint, server-side dry run, install, a Run through the installed operator,
least privilege of attempt Pods, upgrade with a changed CRD, standby takeover, `helm test`, uninstall.

The chart is installed once per module, namespace-scoped (it watches only its own namespace, which
enforces the restricted Pod Security Standard); the tests after the install run in file order and build
on each other, as an operator's life does: install, use, upgrade, fail over, test, uninstall. On the
local control plane the operator's Pods are run by the node agent under the chart's ServiceAccount, so
the chart's RBAC is what the operator runs with.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import os
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from agentrun.api import crdgen
from agentrun.core.store_buckets import namespace_bucket
from agentrun.deploy import generate
from agentrun.statestore import versitygw
from devcluster.objectstore import Credentials, ObjectStoreProcess, s3_request
from devcluster.processes import free_port
from e2e.conftest import Target
from support.big_state_agent import digest as big_digest
from support.big_state_agent import output as big_output
from support.corpus import REPO
from support.history import previous_chart, previous_sdk
from support.hostile_agent import EXPECTED_CAUSES, refusals_missing
from support.kube import Kube, wait_for
from support.runs import FAST_RETRY, GROUP, VERSION, create_run, get_run, wait_phase

pytestmark = pytest.mark.cluster

CHART = REPO / "charts" / "agentrun"
RELEASE = "agentrun-e2e"  # contains the chart's name, so the full name (object prefix) is the release's
OPERATOR_LABELS = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator"
AGENT_SERVICE_ACCOUNT = "agentrun-agent"
HOSTILE_AGENT = REPO / "tests" / "support" / "hostile_agent.py"
PEERING = "agentrun"
LIFETIME_SECONDS = 15
# The images of the release before the state store, for its upgrade on a cluster other than the local one.
PREVIOUS_OPERATOR_IMAGE_ENV = "AGENTRUN_E2E_PREVIOUS_OPERATOR_IMAGE"
PREVIOUS_AGENT_IMAGE_ENV = "AGENTRUN_E2E_PREVIOUS_AGENT_IMAGE"
E2E_COLUMN = "E2E Generation"  # the printer column the upgraded chart's Run CRD adds
CHART_CRDS = [
    *(crd["metadata"]["name"] for crd in crdgen.custom_resource_definitions()),
    "clusterkopfpeerings.kopf.dev",
    "kopfpeerings.kopf.dev",
]
# restricted Pod Security Standard: what an attempt Pod needs on top of agentrun's defaults
RESTRICTED_POD: dict[str, Any] = {
    "securityContext": {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    },
    "containers": [
        {
            "name": "agent",
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        }
    ],
}


@dataclass
class Release:
    target: Target
    namespace: str
    other_namespace: str  # not watched: another tenant
    health_port: int
    metrics_port: int  # the process node shares one network among all Pods: not the default 8000
    installed: bool = False
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def kube(self) -> Kube:
        return self.target.kube

    def image_values(self) -> list[str]:
        repository, _, tag = self.target.operator_image.rpartition(":")
        if not repository or "/" in tag:  # no tag given (or a registry port): the chart's default tag
            return [f"--set-string=image.repository={self.target.operator_image}"]
        return [f"--set-string=image.repository={repository}", f"--set-string=image.tag={tag}"]

    def store_image_values(self) -> list[str]:
        repository, _, tag = self.target.store_image.rpartition(":")
        return [
            f"--set-string=stateStore.bundled.image.repository={repository}",
            f"--set-string=stateStore.bundled.image.tag={tag}",
        ]

    def operator_pods(self) -> list[dict[str, Any]]:
        pods = self.kube.core.list_namespaced_pod(self.namespace, label_selector=OPERATOR_LABELS).items
        return [self.kube.api_client.sanitize_for_serialization(pod) for pod in pods]

    def running_operator_pods(self, count: int) -> list[dict[str, Any]] | None:
        pods = [
            pod
            for pod in self.operator_pods()
            if pod["status"].get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")
        ]
        return pods if len(pods) == count else None

    def peers(self) -> dict[str, dict[str, Any]]:
        """Every entry of the peering object, fresh or not, by Pod name."""
        try:
            peering = self.kube.custom.get_namespaced_custom_object(
                "kopf.dev", "v1", self.namespace, "kopfpeerings", PEERING
            )
        except ApiException as error:
            if error.status == 404:
                return {}
            raise
        return dict(peering.get("status") or {})

    def live_peers(self) -> dict[str, dict[str, Any]]:
        """The operator replicas with a fresh heartbeat in the peering object, by Pod name."""
        now = time.time()
        return {
            name: peer
            for name, peer in self.peers().items()
            if _timestamp(peer["lastseen"]) + int(peer["lifetime"]) > now
        }

    def operator_log(self, pod: dict[str, Any]) -> str:
        assert self.target.node_pods is not None
        path = self.target.node_pods / pod["metadata"]["uid"] / "operator.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _timestamp(value: str) -> float:
    return datetime.datetime.fromisoformat(value).timestamp()


def _paused(log: str) -> bool:
    """Whether a replica's log says it is paused: kopf starts paused with mandatory peering and logs
    each change ("Resuming operations ...", "Pausing operations ...")."""
    return log.rfind("Pausing operations") >= log.rfind("Resuming operations")


def _create_namespace(kube: Kube, name: str, labels: dict[str, str]) -> None:
    kube.core.create_namespace({"metadata": {"name": name, "labels": {"agentrun.dev/test": "e2e", **labels}}})
    wait_for(
        lambda: kube.core.list_namespaced_service_account(name, field_selector="metadata.name=default").items,
        timeout=120,
        what=f"default service account in {name}",
    )


def _adopt_leftover_crds(kube: Kube, namespace: str) -> None:
    """CRDs outlive `helm uninstall` (resource-policy keep). On a cluster reused between e2e runs (kind),
    the previous run's CRDs are re-annotated for this run's release so that Helm adopts them; CRDs not
    from an e2e run are never touched: the test fails instead."""
    for name in CHART_CRDS:
        try:
            crd = kube.extensions.read_custom_resource_definition(name)
        except ApiException as error:
            if error.status == 404:
                continue
            raise
        owner = (crd.metadata.annotations or {}).get("meta.helm.sh/release-name")
        assert owner == RELEASE, (
            f"CRD {name} exists and is not from an agentrun e2e run (release {owner!r}): "
            "run the e2e tests on a fresh cluster"
        )
        kube.extensions.patch_custom_resource_definition(
            name, {"metadata": {"annotations": {"meta.helm.sh/release-namespace": namespace}}}
        )


@pytest.fixture(scope="module")
def namespaces(kube: Kube) -> Iterator[tuple[str, str]]:
    suffix = uuid.uuid4().hex[:8]
    mine, other = f"e2e-{suffix}", f"e2e-{suffix}-other"
    _create_namespace(kube, mine, {"pod-security.kubernetes.io/enforce": "restricted"})
    _create_namespace(kube, other, {})
    yield mine, other
    for name in (mine, other):
        try:
            kube.core.delete_namespace(name)
        except ApiException as error:
            if error.status != 404:
                raise


# The chart installs its bundled state store by default; a StatefulSet's Pod cannot run on the local control
# plane (nothing provisions its claim; the process node agent runs no images, mounts no volumes), so the
# installs that test other matters say explicitly that they keep agent state inline (the operator reports
# it); test_the_bundled_state_store_is_installed_and_holds_a_large_state installs the store.
NO_STORE = "--set=stateStore.bundled.enabled=false"


@pytest.fixture(scope="module")
def release(e2e_target: Target, namespaces: tuple[str, str]) -> Iterator[Release]:
    namespace, other = namespaces
    installed = Release(e2e_target, namespace, other, health_port=free_port(), metrics_port=free_port())
    _adopt_leftover_crds(e2e_target.kube, namespace)
    started = time.monotonic()
    e2e_target.helm(
        "install",
        RELEASE,
        str(CHART),
        f"--namespace={namespace}",
        f"--set=watchNamespaces={{{namespace}}}",
        # namespace-scoped mode renders nothing cluster-scoped unless asked: the test is the cluster admin
        "--set=crds.install=true",
        "--set=peering.installCrds=true",
        "--set=admission.install=true",
        "--set=replicaCount=1",
        f"--set=health.port={installed.health_port}",
        f"--set=metrics.port={installed.metrics_port}",
        f"--set=peering.lifetimeSeconds={LIFETIME_SECONDS}",
        NO_STORE,
        *installed.image_values(),
        "--wait",
        "--timeout=120s",
    )
    installed.installed = True
    installed.timings["install"] = time.monotonic() - started
    try:
        yield installed
    finally:
        if installed.installed:
            e2e_target.helm("uninstall", RELEASE, f"--namespace={namespace}", "--wait", check=False)


def server_version(kube: Kube) -> str:
    return str(client.VersionApi(kube.api_client).get_code().git_version).lstrip("v")


def echo_run(name: str, image: str, message: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Run",
        "metadata": {"name": name},
        "spec": {
            "agent": {
                "image": image,
                "command": ["python", "-m", "agentrun.examples.echo"],
                "serviceAccountName": AGENT_SERVICE_ACCOUNT,
                "podTemplate": {"spec": RESTRICTED_POD},
            },
            "input": {"message": message},
            "podGC": "Never",  # its Pod is looked at once the Run has succeeded
        },
    }


# --- before installing --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["cluster-wide", "namespace-scoped"])
def test_chart_lints(e2e_target: Target, mode: str) -> None:
    values = ["--set=watchNamespaces={team-a}"] if mode == "namespace-scoped" else []
    result = e2e_target.helm(
        "lint", "--strict", str(CHART), f"--kube-version={server_version(e2e_target.kube)}", *values
    )
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("mode", ["cluster-wide", "namespace-scoped"])
def test_rendered_chart_is_accepted_by_the_api_server(
    e2e_target: Target, namespaces: tuple[str, str], mode: str
) -> None:
    namespace, _ = namespaces
    values = [f"--set=watchNamespaces={{{namespace}}}"] if mode == "namespace-scoped" else []
    rendered = e2e_target.helm(
        "template",
        "dry-run",
        str(CHART),
        f"--namespace={namespace}",
        f"--kube-version={server_version(e2e_target.kube)}",
        "--skip-tests",  # the test Pod's ServiceAccount does not exist yet: `helm test` runs it below
        *values,
    ).stdout
    applied = e2e_target.kube.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered)
    kinds = {line.split("/")[0] for line in applied.stdout.splitlines()}
    assert {"deployment.apps", "serviceaccount"} <= kinds
    cluster_scoped = {
        "customresourcedefinition.apiextensions.k8s.io",
        "clusterrole.rbac.authorization.k8s.io",
    }
    if mode == "cluster-wide":
        assert cluster_scoped <= kinds
    else:  # nothing cluster-scoped unless asked: a namespace administrator can install it
        assert not cluster_scoped & kinds


def test_plain_manifests_are_accepted_by_the_api_server(
    e2e_target: Target, namespaces: tuple[str, str]
) -> None:
    """manifests/ (kustomize), moved to a test namespace: the namespace itself cannot be dry-run created."""
    namespace, _ = namespaces
    built = e2e_target.kube.kubectl("kustomize", str(REPO / "manifests")).stdout
    docs = [doc for doc in yaml.safe_load_all(built) if doc and doc["kind"] != "Namespace"]
    for doc in docs:
        if doc["metadata"].get("namespace") == generate.MANIFEST_NAMESPACE:
            doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects", []):
            subject["namespace"] = namespace
    e2e_target.kube.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(docs))


# --- installed ----------------------------------------------------------------------------------------


def test_operator_runs_under_the_charts_service_account(release: Release) -> None:
    (pod,) = wait_for(lambda: release.running_operator_pods(1), 120, what="the operator Pod running")
    assert pod["spec"]["serviceAccountName"] == RELEASE
    assert pod["spec"]["containers"][0]["command"] == ["python", "-m", "agentrun.operator"]

    def ready() -> bool:
        conditions = release.operator_pods()[0]["status"].get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    wait_for(ready, 120, what="the operator Pod Ready")
    if release.target.local:  # the process node runs no probes: ask the health endpoint ourselves

        def healthz() -> int | None:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{release.health_port}/healthz", timeout=2
                ) as r:
                    return int(r.status)
            except OSError:
                return None

        assert wait_for(healthz, 120, what="the operator's /healthz") == 200
    peers = wait_for(release.live_peers, 120, what="the operator's heartbeat in its peering object")
    assert list(peers) == [pod["metadata"]["name"]]


def test_run_succeeds_through_the_installed_operator(release: Release) -> None:
    started = time.monotonic()
    create_run(release.kube, release.namespace, echo_run("echo", release.target.agent_image, "hello"))
    run = wait_phase(release.kube, release.namespace, "echo", {"Succeeded", "Failed"}, timeout=120)
    release.timings["first run"] = time.monotonic() - started
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert run["status"]["result"] == {"echo": {"message": "hello"}}
    pod = release.kube.pod("echo-a1", release.namespace)
    assert pod is not None
    assert pod["spec"]["serviceAccountName"] == AGENT_SERVICE_ACCOUNT
    service = release.kube.core.read_namespaced_service(f"{RELEASE}-metrics", release.namespace)
    assert service.spec.ports[0].name == "metrics"
    if release.target.local:  # the operator's own metrics and JSON logs, as the chart configures them

        def succeeded_runs() -> str | None:
            url = f"http://127.0.0.1:{release.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=30) as response:
                text = response.read().decode()
            return text if 'agentrun_runs{phase="Succeeded"} 1.0' in text else None

        metrics = wait_for(succeeded_runs, 120, what="the Succeeded Run in the operator's metrics")
        assert 'agentrun_attempts_started_total{failure_class="none",reason="initial"} 1.0' in metrics
        (operator,) = release.operator_pods()
        lines = [json.loads(line) for line in release.operator_log(operator).splitlines() if line.strip()]
        assert any(e.get("run") == "echo" and "Succeeded" in e["message"] for e in lines)


def _shipped_agent(
    kube: Kube, ns: str, name: str, image: str, module: Path, *, input: dict[str, Any]
) -> dict[str, Any]:
    """A Run of one of the tests' own agents, its source shipped in a ConfigMap (the agent image has
    agentrun only, and a command argument is bounded): `python -c` executes it from the environment."""
    source = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-source"},
        "data": {"agent.py": module.read_text()},
    }
    kube.core.create_namespaced_config_map(ns, source)
    run = echo_run(name, image, "")
    ref = {"configMapKeyRef": {"name": f"{name}-source", "key": "agent.py"}}
    run["spec"]["agent"]["env"] = [{"name": "AGENT_SOURCE", "valueFrom": ref}]
    run["spec"]["agent"]["command"] = ["python", "-c", "import os; exec(os.environ['AGENT_SOURCE'])"]
    run["spec"]["input"] = input
    return run


def test_a_hostile_agent_is_refused_by_the_installed_policies(release: Release) -> None:
    """The admission policies the chart installs exempt exactly its operator's ServiceAccount: the Runs
    it drives work, and a hostile agent of the same namespace is refused every forged write."""
    kube, ns, image = release.kube, release.namespace, release.target.agent_image
    scenario = {"steps": 2, "ask": {"atStep": 2, "prompt": "Go on?", "schema": {"type": "object"}}}
    victim = echo_run("victim", image, "")
    victim["spec"]["agent"]["command"] = ["python", "-m", "agentrun.examples.scenario"]
    victim["spec"]["input"] = scenario
    create_run(kube, ns, victim)
    waiting = wait_phase(kube, ns, "victim", {"InputRequired", "Failed", "Succeeded"}, timeout=120)
    assert waiting["status"]["phase"] == "InputRequired", waiting["status"]
    hostile = _shipped_agent(
        kube, ns, "attacker", image, HOSTILE_AGENT, input={"victim": "victim", "victimAttempt": "victim-a1"}
    )
    create_run(kube, ns, hostile)
    attacker = wait_phase(kube, ns, "attacker", {"Succeeded", "Failed"}, timeout=120)
    assert attacker["status"]["phase"] == "Succeeded", attacker["status"]
    outcomes = attacker["status"]["result"]["outcomes"]
    assert set(outcomes) == set(EXPECTED_CAUSES)
    assert refusals_missing(outcomes) == {}, json.dumps(outcomes, indent=1)
    pending = waiting["status"]["pendingRequest"]
    resume = {
        "requestId": pending["requestId"],
        "checkpointId": pending["checkpointId"],
        "value": {},
        "idempotencyKey": "go-on",
    }
    kube.custom.patch_namespaced_custom_object(
        GROUP, VERSION, ns, "runs", "victim", {"spec": {"resume": resume}}
    )
    done = wait_phase(kube, ns, "victim", {"Succeeded", "Failed"}, timeout=120)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert done["status"]["committedBy"]["attempt"] == "victim-a2"


def _as_service_account(kube: Kube, namespace: str, name: str) -> client.ApiClient:
    """An API client that authenticates with a token of the ServiceAccount (and nothing else)."""
    token = kube.kubectl("create", "token", name, "--duration=10m", namespace=namespace).stdout.strip()
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kube.kubeconfig), client_configuration=configuration)
    configuration.cert_file = configuration.key_file = None
    configuration.username = configuration.password = None
    configuration.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(configuration)


def _status(request: Callable[[], object]) -> int:
    try:
        request()
    except ApiException as error:
        return int(error.status)
    return 200


def test_attempt_service_account_is_refused_what_it_does_not_need(release: Release) -> None:
    """As the agents' ServiceAccount (what an attempt Pod authenticates as): its own namespace's Runs,
    yes; Secrets, Pods, ConfigMaps, Run specs, deletes and any other namespace, no.

    RBAC cannot say "only the Run this Pod belongs to": resourceNames are fixed when the Role is written,
    and one ServiceAccount serves every Run of its namespace. So within a namespace the boundary is the
    epoch fence, not RBAC: a status commit whose committedBy epochs are not the Run's is refused by the
    API server's validation rule, which is checked here too. (Per-Run ServiceAccounts and Roles would
    close this; the operator does not create them.)"""
    kube = release.kube
    ns, other = release.namespace, release.other_namespace
    kube.core.create_namespaced_secret(ns, {"metadata": {"name": "e2e-secret"}, "stringData": {"k": "v"}})
    create_run(kube, other, echo_run("elsewhere", release.target.agent_image, "not yours"))
    agent = _as_service_account(kube, ns, AGENT_SERVICE_ACCOUNT)
    custom, core = client.CustomObjectsApi(agent), client.CoreV1Api(agent)

    def status_patch(namespace: str, name: str, status: dict[str, Any]) -> Callable[[], object]:
        return lambda: custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, "runs", name, {"status": status}
        )

    allowed = {
        "get its namespace's Run": lambda: custom.get_namespaced_custom_object(
            GROUP, VERSION, ns, "runs", "echo"
        ),
        "read its Run's status": lambda: custom.get_namespaced_custom_object_status(
            GROUP, VERSION, ns, "runs", "echo"
        ),
    }
    refused = {
        "list Secrets": lambda: core.list_namespaced_secret(ns),
        "get a Secret": lambda: core.read_namespaced_secret("e2e-secret", ns),
        "list ConfigMaps": lambda: core.list_namespaced_config_map(ns),
        "list Pods": lambda: core.list_namespaced_pod(ns),
        "create a Pod": lambda: core.create_namespaced_pod(
            ns, {"metadata": {"name": "sneaky"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
        ),
        "change a Run's spec": lambda: custom.patch_namespaced_custom_object(
            GROUP, VERSION, ns, "runs", "echo", {"spec": {"cancelEpoch": 1}}
        ),
        "delete a Run": lambda: custom.delete_namespaced_custom_object(GROUP, VERSION, ns, "runs", "echo"),
        "create an Attempt": lambda: custom.create_namespaced_custom_object(
            GROUP, VERSION, ns, "attempts", {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Attempt"}
        ),
        "read another namespace's Run": lambda: custom.get_namespaced_custom_object(
            GROUP, VERSION, other, "runs", "elsewhere"
        ),
        "read another namespace's Run status": lambda: custom.get_namespaced_custom_object_status(
            GROUP, VERSION, other, "runs", "elsewhere"
        ),
        "write another namespace's Run status": status_patch(other, "elsewhere", {"message": "mine now"}),
        "list Runs cluster-wide": lambda: custom.list_cluster_custom_object(GROUP, VERSION, "runs"),
        "read Leases of another namespace": lambda: client.CoordinationV1Api(agent).list_namespaced_lease(
            other
        ),
    }
    assert {what: _status(call) for what, call in allowed.items()} == dict.fromkeys(allowed, 200)
    assert {what: _status(call) for what, call in refused.items()} == dict.fromkeys(refused, 403)

    run = get_run(kube, ns, "echo")
    forged = {
        "result": {"forged": True},
        "committedBy": {
            "attempt": "echo-a9",
            "leaseEpoch": run["status"]["leaseEpoch"] + 7,
            "cancelEpoch": 0,
        },
    }
    assert _status(status_patch(ns, "echo", forged)) == 422
    assert get_run(kube, ns, "echo")["status"]["result"] == {"echo": {"message": "hello"}}


def _chart_with_changed_crd(destination: Path) -> Path:
    """The chart as its next version would ship it: the Run CRD gains a (wide) printer column."""
    crds = crdgen.custom_resource_definitions()
    run_crd = next(crd for crd in crds if crd["spec"]["names"]["kind"] == "Run")
    run_crd["spec"]["versions"][0]["additionalPrinterColumns"].append(
        {
            "name": E2E_COLUMN,
            "type": "integer",
            "jsonPath": ".metadata.generation",
            "description": "A column only the e2e test's chart version has.",
            "priority": 1,
        }
    )
    chart = generate.write_chart(CHART, destination / "agentrun", crds)
    chart_yaml = chart / "Chart.yaml"
    chart_yaml.write_text(chart_yaml.read_text().replace("version: 0.1.0", "version: 0.1.1-e2e"))
    return chart


def test_helm_upgrade_applies_a_changed_crd(release: Release, tmp_path: Path) -> None:
    """A new chart version with a changed CRD, upgraded to two replicas. (On the local cluster the
    process node shares the host's network among Pods: the replicas listen on their own Pod IPs.)"""
    kube = release.kube
    before = kube.extensions.read_custom_resource_definition("runs.agentrun.dev")
    assert E2E_COLUMN not in [c.name for c in before.spec.versions[0].additional_printer_columns]
    started = time.monotonic()
    release.target.helm(
        "upgrade",
        RELEASE,
        str(_chart_with_changed_crd(tmp_path)),
        f"--namespace={release.namespace}",
        "--reuse-values",
        "--set=replicaCount=2",
        *(["--set=listenAddress=$(POD_IP)"] if release.target.local else []),
        "--wait",
        "--timeout=120s",
    )
    release.timings["upgrade"] = time.monotonic() - started
    after = kube.extensions.read_custom_resource_definition("runs.agentrun.dev")
    column = next(c for c in after.spec.versions[0].additional_printer_columns if c.name == E2E_COLUMN)
    assert (column.json_path, column.priority) == (".metadata.generation", 1)
    assert after.metadata.uid == before.metadata.uid  # upgraded in place, not recreated
    assert E2E_COLUMN.upper() in kube.kubectl("get", "runs", "-o", "wide", namespace=release.namespace).stdout
    assert get_run(kube, release.namespace, "echo")["status"]["phase"] == "Succeeded"  # the Runs survive
    history = json.loads(
        release.target.helm("history", RELEASE, f"--namespace={release.namespace}", "-o=json").stdout
    )
    assert [entry["chart"] for entry in history] == ["agentrun-0.1.0", "agentrun-0.1.1-e2e"]


def test_one_replica_is_active_and_a_standby_takes_over(release: Release) -> None:
    pods = wait_for(lambda: release.running_operator_pods(2), 120, what="two operator replicas running")
    names = {pod["metadata"]["name"] for pod in pods}

    def peers_are_the_replicas() -> dict[str, dict[str, Any]] | None:
        live = release.live_peers()
        return live if set(live) == names else None

    peers = wait_for(peers_are_the_replicas, 120, what=f"exactly the replicas {sorted(names)} as peers")
    priorities = [peer["priority"] for peer in peers.values()]
    assert len(set(priorities)) == 2, peers  # equal priorities would pause both
    active = max(pods, key=lambda pod: peers[pod["metadata"]["name"]]["priority"])
    standby = next(pod for pod in pods if pod is not active)
    if release.target.local:
        wait_for(lambda: not _paused(release.operator_log(active)), 120, what="the active replica resumed")
        assert _paused(release.operator_log(standby))

    started, deleted_at = time.monotonic(), time.time()
    release.kube.core.delete_namespaced_pod(active["metadata"]["name"], release.namespace)
    create_run(
        release.kube, release.namespace, echo_run("after-takeover", release.target.agent_image, "again")
    )
    run = wait_phase(release.kube, release.namespace, "after-takeover", {"Succeeded", "Failed"}, timeout=120)
    took = time.monotonic() - started
    release.timings["takeover to a succeeded Run"] = took
    assert run["status"]["phase"] == "Succeeded", run["status"]
    # A replica that stops gracefully leaves the peering at once: its entry is gone when its Pod is (not
    # left to run out, which is what a standby would otherwise wait for). How long the takeover took is
    # the machine's pace: recorded above, not bounded.
    active_name = active["metadata"]["name"]
    wait_for(lambda: release.kube.pod(active_name, release.namespace) is None, what="the active Pod gone")
    assert active_name not in release.peers(), release.peers()
    if release.target.local:
        log = release.operator_log(standby)
        assert not _paused(log)
        resumed = next(line for line in reversed(log.splitlines()) if "Resuming operations" in line)
        resumed_at = datetime.datetime.fromisoformat(json.loads(resumed)["time"])  # logFormat json
        release.timings["takeover: the standby resumed"] = resumed_at.timestamp() - deleted_at


def test_helm_test_passes(release: Release) -> None:
    started = time.monotonic()
    result = release.target.helm("test", RELEASE, f"--namespace={release.namespace}", "--timeout=120s")
    release.timings["helm test"] = time.monotonic() - started
    assert "Phase:          Succeeded" in result.stdout, result.stdout


def leftovers(kube: Kube, namespaces: tuple[str, ...]) -> dict[str, list[str]]:
    """What of the release is still there: its objects, and any Pod still running in its namespaces."""
    selector = f"app.kubernetes.io/instance={RELEASE}"
    found: dict[str, list[str]] = {
        "cluster roles": [
            r.metadata.name for r in kube.rbac.list_cluster_role(label_selector=selector).items
        ],
        "cluster role bindings": [
            b.metadata.name for b in kube.rbac.list_cluster_role_binding(label_selector=selector).items
        ],
    }
    for ns in namespaces:
        found |= {
            f"{ns} deployments": [d.metadata.name for d in kube.apps.list_namespaced_deployment(ns).items],
            f"{ns} replicasets": [r.metadata.name for r in kube.apps.list_namespaced_replica_set(ns).items],
            f"{ns} pods of the release": [
                p.metadata.name for p in kube.core.list_namespaced_pod(ns, label_selector=selector).items
            ],
            f"{ns} running pods": [
                p.metadata.name
                for p in kube.core.list_namespaced_pod(ns).items
                if p.status.phase in ("Pending", "Running")
            ],
            f"{ns} services": [
                s.metadata.name for s in kube.core.list_namespaced_service(ns, label_selector=selector).items
            ],
            f"{ns} service accounts": [
                a.metadata.name
                for a in kube.core.list_namespaced_service_account(ns, label_selector=selector).items
            ],
            f"{ns} roles": [
                r.metadata.name for r in kube.rbac.list_namespaced_role(ns, label_selector=selector).items
            ],
            f"{ns} role bindings": [
                b.metadata.name
                for b in kube.rbac.list_namespaced_role_binding(ns, label_selector=selector).items
            ],
        }
    return {what: names for what, names in found.items() if names}


def uninstall_and_wait(release: Release, timing: str) -> None:
    namespaces = (release.namespace, release.other_namespace)
    result = release.target.helm(
        "uninstall", RELEASE, f"--namespace={release.namespace}", "--wait", "--timeout=120s"
    )
    release.installed = False
    assert "runs.agentrun.dev" in result.stdout + result.stderr  # "kept due to the resource policy"
    started = time.monotonic()
    try:
        wait_for(lambda: not leftovers(release.kube, namespaces), interval=0.5, what="an empty namespace")
    except AssertionError:
        raise AssertionError(f"left behind: {leftovers(release.kube, namespaces)}") from None
    release.timings[timing] = time.monotonic() - started
    for name in CHART_CRDS:  # kept on purpose, with the Runs they hold
        release.kube.extensions.read_custom_resource_definition(name)


def test_uninstall_leaves_no_agentrun_workload(release: Release) -> None:
    uninstall_and_wait(release, "uninstall, last Pod gone")
    assert get_run(release.kube, release.namespace, "echo")["status"]["phase"] == "Succeeded"


def test_cluster_wide_release_serves_every_namespace(release: Release) -> None:
    """The default mode, installed for real: a ClusterRole, and Runs served in any namespace. Same release
    name and namespace, so that Helm adopts the CRDs the first release left (see the chart's README).
    The Run of the other namespace has waited since the least-privilege test: nobody served it."""
    kube, other = release.kube, release.other_namespace
    assert "phase" not in (get_run(kube, other, "elsewhere").get("status") or {})
    started = time.monotonic()
    release.target.helm(
        "install",
        RELEASE,
        str(CHART),
        f"--namespace={release.namespace}",
        "--set=replicaCount=1",
        f"--set=agents.namespaces={{{release.namespace},{other}}}",
        f"--set=health.port={release.health_port}",
        f"--set=metrics.port={release.metrics_port}",
        NO_STORE,
        *release.image_values(),
        "--wait",
        "--timeout=120s",
    )
    release.installed = True
    run = wait_phase(kube, other, "elsewhere", {"Succeeded", "Failed"}, timeout=120)
    release.timings["cluster-wide: install to a succeeded Run"] = time.monotonic() - started
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert kube.rbac.read_cluster_role(f"{RELEASE}-attempt").rules is not None
    result = release.target.helm("test", RELEASE, f"--namespace={release.namespace}", "--timeout=120s")
    assert "Phase:          Succeeded" in result.stdout, result.stdout
    uninstall_and_wait(release, "cluster-wide: uninstall, last Pod gone")
    print(f"\ne2e timings (s): {json.dumps({k: round(v, 1) for k, v in release.timings.items()})}")


def test_an_upgrade_from_the_previous_release_resumes_runs_that_wait_for_people(
    release: Release, tmp_path: Path
) -> None:
    """The release before the state store (its chart, and on the local control plane its operator and
    agent SDK: support.history) is installed, two Runs wait for people under it (InputRequired,
    AuthRequired), and `helm upgrade` to this chart keeps them: answered after it, they resume, one with
    the agent image they started with, one with today's. On another cluster the chart is upgraded with
    the images of AGENTRUN_E2E_PREVIOUS_OPERATOR_IMAGE and AGENTRUN_E2E_PREVIOUS_AGENT_IMAGE (default: the
    current ones, so the chart alone is upgraded)."""
    kube, ns, target = release.kube, release.namespace, release.target
    if release.installed:  # run on its own: the module's release goes first (same name: the CRDs' owner)
        uninstall_and_wait(release, "uninstall before the previous release")
    chart = previous_chart(tmp_path / "chart")
    old_sdk = previous_sdk(tmp_path / "sdk") if target.local else None
    old_env = [{"name": "PYTHONPATH", "value": str(old_sdk)}] if old_sdk else []
    previous_images = Release(
        Target(
            target.kube,
            target.helm_path,
            target.helm_home,
            os.environ.get(PREVIOUS_OPERATOR_IMAGE_ENV, target.operator_image),
            os.environ.get(PREVIOUS_AGENT_IMAGE_ENV, target.agent_image),
            target.store_image,
            target.node_pods,
        ),
        ns,
        release.other_namespace,
        release.health_port,
        release.metrics_port,
    )
    values = [
        f"--namespace={ns}",
        f"--set=watchNamespaces={{{ns}}}",
        "--set=crds.install=true",
        "--set=peering.installCrds=true",
        "--set=admission.install=true",
        "--set=replicaCount=1",
        f"--set=health.port={release.health_port}",
        f"--set=metrics.port={release.metrics_port}",
        f"--set=peering.lifetimeSeconds={LIFETIME_SECONDS}",
        "--wait",
        "--timeout=120s",
    ]
    previous_operator = [  # the previous operator's code, first on its Pod's PYTHONPATH (local node)
        f"--set-string=operator.extraEnv[{i}].{key}={value}"
        for i, env in enumerate(old_env)
        for key, value in env.items()
    ]
    started = time.monotonic()
    target.helm("install", RELEASE, str(chart), *values, *previous_operator, *previous_images.image_values())
    release.installed = True
    waiting = {"upgrade-input": "InputRequired", "upgrade-auth": "AuthRequired"}
    for name, phase in waiting.items():
        run = echo_run(name, previous_images.target.agent_image, "")
        run["spec"]["agent"]["command"] = ["python", "-m", "agentrun.examples.scenario"]
        run["spec"]["agent"]["env"] = old_env
        reason = "input_required" if phase == "InputRequired" else "auth_required"
        ask = {"atStep": 2, "reason": reason, "prompt": f"{name}?", "schema": {"type": "object"}}
        run["spec"]["input"] = {"steps": 3, "ask": ask}
        create_run(kube, ns, run)
    pending = {}
    for name, phase in waiting.items():
        run = wait_phase(kube, ns, name, {phase, "Failed", "Succeeded"}, timeout=120)
        assert run["status"]["phase"] == phase, run["status"]
        pending[name] = run["status"]["pendingRequest"]

    # the previous chart had no state store: the upgrade keeps its Runs' state inline, said so explicitly
    target.helm("upgrade", RELEASE, str(CHART), *values, NO_STORE, *release.image_values())
    release.timings["previous release: install, two Runs waiting, upgrade"] = time.monotonic() - started
    started = time.monotonic()
    # one keeps the image it started with, the other moves to today's (spec.agent may change)
    current = {**get_run(kube, ns, "upgrade-auth")["spec"]["agent"], "image": target.agent_image, "env": []}
    kube.custom.patch_namespaced_custom_object(
        GROUP, VERSION, ns, "runs", "upgrade-auth", {"spec": {"agent": current}}
    )
    for name, request in pending.items():
        resume = {
            "requestId": request["requestId"],
            "checkpointId": request["checkpointId"],
            "value": {"answered": name},
            "idempotencyKey": f"{name}-answer",
        }
        answer = {"spec": {"resume": resume}}
        kube.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, "runs", name, answer)
    for name in waiting:
        done = wait_phase(kube, ns, name, {"Succeeded", "Failed", "NeedsReconciliation"}, timeout=120)
        assert done["status"]["phase"] == "Succeeded", (name, done["status"])
        result = done["status"]["result"]
        assert result["answer"] == {"answered": name}
        assert (result["attempt"], result["resumedAt"]) == (f"{name}-a2", 1), "from its checkpoint"
        second = kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, "attempts", f"{name}-a2")
        assert "stateInStore" not in second["spec"], "written inline by the previous release"
    release.timings["after the upgrade: both answered Runs Succeeded"] = time.monotonic() - started
    uninstall_and_wait(release, "uninstall after the upgrade")
    mine = (
        "previous release: install, two Runs waiting, upgrade",
        "after the upgrade: both answered Runs Succeeded",
        "uninstall after the upgrade",
    )
    print(f"\nupgrade e2e timings (s): {json.dumps({k: round(release.timings[k], 1) for k in mine})}")


# --- the bundled state store ----------------------------------------------------------------------------

BIG_STATE_AGENT = REPO / "tests" / "support" / "big_state_agent.py"
STORE = f"{RELEASE}-store"


@pytest.mark.parametrize("mode", ["cluster-wide", "namespace-scoped"])
def test_the_chart_with_the_bundled_store_lints_and_is_accepted_by_the_api_server(
    e2e_target: Target, namespaces: tuple[str, str], mode: str
) -> None:
    namespace, _ = namespaces
    values = ["--set=stateStore.bundled.enabled=true"]
    if mode == "namespace-scoped":  # and its cluster administrator lets it read its namespaces
        values += [f"--set=watchNamespaces={{{namespace}}}", "--set=stateStore.bundled.readNamespaces=true"]
    version = f"--kube-version={server_version(e2e_target.kube)}"
    linted = e2e_target.helm("lint", "--strict", str(CHART), version, *values)
    assert "0 chart(s) failed" in linted.stdout
    rendered = e2e_target.helm(
        "template", "dry-run", str(CHART), f"--namespace={namespace}", version, "--skip-tests", *values
    ).stdout
    applied = e2e_target.kube.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered).stdout
    names = {line.split(" ")[0] for line in applied.splitlines()}
    assert {
        "statefulset.apps/dry-run-agentrun-store",
        "service/dry-run-agentrun-store",
        "secret/dry-run-agentrun-store-root",
    } <= names, applied
    if mode == "namespace-scoped":
        assert "clusterrole.rbac.authorization.k8s.io/dry-run-agentrun-namespaces" in names, applied


def _store_pod_waits_for_its_volume(kube: Kube, ns: str) -> dict[str, Any] | None:
    """The StatefulSet's Pod, once the scheduler has said why it cannot place it (local control plane)."""
    pod = kube.pod(f"{STORE}-0", ns)
    conditions = (pod or {}).get("status", {}).get("conditions") or []
    scheduled = [c for c in conditions if c["type"] == "PodScheduled" and c["status"] == "False"]
    return pod if scheduled else None


def test_the_bundled_state_store_is_installed_and_holds_a_large_state(
    release: Release, tmp_path: Path
) -> None:
    """stateStore.bundled.enabled, installed for real (cluster-wide, the agents' namespace restricted): the
    StatefulSet with its claim template, the Service, the root Secret the chart made, the operator told
    to administer the server. The operator creates the bucket with versioning on at its start, makes the
    agents' namespace its principals' Secrets, and a Run whose state outgrows the inline threshold, killed
    half-way, resumes whole from the store and succeeds; its blobs are in the bucket.

    On the local control plane the StatefulSet's own Pod cannot run: nothing provisions volumes (its
    claim stays Pending, so the scheduler does not place the Pod), and the node agent runs commands as
    local processes, without images or volumes. So the test starts the same server (the pinned versitygw
    binary, the arguments agentrun.statestore.versitygw gives both, without its bucket) on loopback with
    the root credentials the chart generated, and points the operator at it with stateStore.url. On
    another cluster (AGENTRUN_E2E_KUBECONFIG) the StatefulSet's server is the one used."""
    kube, ns, target = release.kube, release.namespace, release.target
    if release.installed:  # the module's release goes first (same name: the CRDs' owner)
        uninstall_and_wait(release, "uninstall before the bundled store")
    server: ObjectStoreProcess | None = None
    values = [
        f"--namespace={ns}",
        "--set=replicaCount=1",
        f"--set=agents.namespaces={{{ns}}}",
        f"--set=health.port={release.health_port}",
        f"--set=metrics.port={release.metrics_port}",
        "--set=stateStore.bundled.enabled=true",
        "--set=stateStore.bundled.storage.size=1Gi",
        *release.image_values(),
        *release.store_image_values(),
    ]
    if target.local:
        subprocess.run(["bash", str(REPO / "hack/build-versitygw.sh")], check=True, timeout=1800)
        port = free_port()
        local_url = f"s3://{versitygw.BUCKET}?endpoint=http://127.0.0.1:{port}&region={versitygw.REGION}"
        values.append(f"--set-string=stateStore.url={local_url}")
    started = time.monotonic()
    # no --wait: on the local control plane the StatefulSet never becomes ready (see above)
    waits = [] if target.local else ["--wait", "--timeout=300s"]
    target.helm("install", RELEASE, str(CHART), *values, *waits)
    release.installed = True
    try:
        # what the chart installed: the server, its Service and volume, the root credentials it made
        sts = kube.apps.read_namespaced_stateful_set(STORE, ns)
        assert sts.spec.replicas == 1
        (container,) = sts.spec.template.spec.containers
        assert container.image == target.store_image
        assert container.args == versitygw.server_args(listen=f":{versitygw.PORT}", data_dir="/data")
        (claim,) = sts.spec.volume_claim_templates
        assert claim.spec.resources.requests == {"storage": "1Gi"}
        assert kube.core.read_namespaced_service(STORE, ns).spec.ports[0].port == versitygw.PORT
        secret = kube.core.read_namespaced_secret(f"{STORE}-root", ns)
        root = Credentials(
            base64.b64decode(secret.data["AWS_ACCESS_KEY_ID"]).decode(),
            base64.b64decode(secret.data["AWS_SECRET_ACCESS_KEY"]).decode(),
        )
        # the StatefulSet controller made its Pod (it passed the restricted Pod Security Standard) and claim
        volume = wait_for(
            lambda: kube.get("persistentvolumeclaim", f"data-{STORE}-0", ns), 120, what="the server's claim"
        )
        assert volume["spec"]["resources"]["requests"]["storage"] == "1Gi"
        if target.local:
            pod = wait_for(
                lambda: _store_pod_waits_for_its_volume(kube, ns), 120, what="the server's Pod, unschedulable"
            )
            (unscheduled,) = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
            why = f"{unscheduled.get('reason')}: {unscheduled.get('message')}"
            print(f"\nthe bundled server's Pod on the local control plane: {why}")
            assert "PersistentVolumeClaim" in why, why  # unbound: nothing provisions volumes here
            claimed = kube.get("persistentvolumeclaim", f"data-{STORE}-0", ns) or {}
            assert claimed["status"]["phase"] == "Pending"
            # the same server, started as the chart starts it (without its bucket), with the chart's root
            server = ObjectStoreProcess(
                tmp_path / "store",
                tmp_path / "versitygw.log",
                port=port,
                credentials=root,
                prepare_at_start=False,
            )
            server.start()

        (operator,) = wait_for(lambda: release.running_operator_pods(1), 120, what="the operator Pod running")
        env = {e["name"]: e.get("value") for e in operator["spec"]["containers"][0]["env"]}
        assert env["AGENTRUN_STATE_STORE_PROVISION"] == "versitygw"
        if not target.local:
            assert env["AGENTRUN_STATE_STORE_URL"] == (
                f"s3://{versitygw.BUCKET}?endpoint=http://{STORE}.{ns}.svc:{versitygw.PORT}&region={versitygw.REGION}"
            )

        # the operator made the agents' namespace its principals: their Secrets, not the root
        def made_secret() -> dict[str, Any] | None:
            return kube.get("secret", "agentrun-state-store", ns)

        made = wait_for(made_secret, 120, what="the agents' store Secret the operator makes")
        assert made["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "agentrun"
        assert base64.b64decode(made["data"]["AWS_ACCESS_KEY_ID"]).decode() != root.access_key
        # made after the first, in its own request: waited for as its own event
        wait_for(
            lambda: kube.get("secret", "agentrun-state-store-read", ns),
            120,
            what="the agents' read-only Secret",
        )
        url = base64.b64decode(made["data"]["AGENTRUN_STATE_STORE_URL"]).decode()
        assert url.startswith(f"s3://{namespace_bucket(versitygw.BUCKET, ns)}?")  # the namespace's bucket

        # a large state, killed half-way, resumed whole from the store
        steps, size = 4, 20_000
        run = _shipped_agent(
            kube,
            ns,
            "big",
            target.agent_image,
            BIG_STATE_AGENT,
            input={"steps": steps, "outputBytes": size, "killAt": 2, "resultBytes": 0},
        )
        run["spec"]["retry"] = FAST_RETRY
        create_run(kube, ns, run)
        done = wait_phase(kube, ns, "big", {"Succeeded", "Failed", "NeedsReconciliation"}, timeout=180)
        release.timings["bundled store: install to a large Run succeeded"] = time.monotonic() - started
        assert done["status"]["phase"] == "Succeeded", done["status"]
        result = done["status"]["result"]
        full_state = {"outputs": [big_output(i, size) for i in range(steps)], "fetched": "big-a1"}
        assert (result["complete"], result["attempt"], result["fetchedBy"]) == (True, "big-a2", "big-a1")
        assert result["stateDigest"] == big_digest(full_state)
        refs = [
            c["spec"]["stateRef"]
            for c in kube.custom.list_namespaced_custom_object(
                GROUP, VERSION, ns, "checkpoints", label_selector="agentrun.dev/run=big"
            )["items"]
            if "stateRef" in c["spec"]
        ]
        assert refs, "the state went to the store"
        if server is not None:  # read the blobs back from the namespace's bucket as the root, and versioning
            own = namespace_bucket(versitygw.BUCKET, ns)
            for ref in refs:
                status, blob = s3_request("GET", server.endpoint, f"/{own}/{ref['key']}", credentials=root)
                assert status == 200
                assert (len(blob), hashlib.sha256(blob).hexdigest()) == (ref["size"], ref["sha256"])
                assert ref["key"].startswith(f"{ns}/{done['metadata']['uid']}/sha256/")
            for bucket in (versitygw.BUCKET, own):
                status, versioning = s3_request(
                    "GET", server.endpoint, f"/{bucket}", query="versioning=", credentials=root
                )
                assert status == 200 and b"<Status>Enabled</Status>" in versioning
            log = release.operator_log(operator)
            said = f"state store bucket {versitygw.BUCKET} at {server.endpoint} is there with versioning"
            assert said in log, log[-3000:]
        uninstall_and_wait(release, "bundled store: uninstall")
        # the volume outlives the release: the agents' state is kept
        assert kube.get("persistentvolumeclaim", f"data-{STORE}-0", ns) is not None
    finally:
        if server is not None:
            server.stop()
    timings = {k: round(v, 1) for k, v in release.timings.items()}
    print(f"\nbundled store e2e timings (s): {json.dumps(timings)}")
