"""The security set-up of an agentrun install on the local control plane, as the chart makes it: the
operator runs as its own ServiceAccount (RBAC from agentrun.rbac) and the admission policies of
agentrun.admission exempt exactly that identity. Used by the test fixtures, the demo and the benchmarks,
so that everything they run meets the same API server rules as a Helm install."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import yaml

from agentrun.admission import admission_policies, policy_reader_rules, service_account_user
from agentrun.priorities import api_priorities
from agentrun.rbac import OPERATOR_RULES, STATE_STORE_PROVISION_RULES

from .kubeconfig import write_kubeconfig

if TYPE_CHECKING:
    from .cluster import LocalCluster

OPERATOR_NAMESPACE: Final = "agentrun-system"
OPERATOR_SERVICE_ACCOUNT: Final = "agentrun-operator"
OPERATOR_USER: Final = service_account_user(OPERATOR_NAMESPACE, OPERATOR_SERVICE_ACCOUNT)
# The operator's own account, which attempt Pods must never run as: the chart's Deployment passes it from
# the downward API; an operator started as a process here is told.
OPERATOR_ENV: Final = {
    "AGENTRUN_SERVICE_ACCOUNT": OPERATOR_SERVICE_ACCOUNT,
    "AGENTRUN_SERVICE_ACCOUNT_NAMESPACE": OPERATOR_NAMESPACE,
}
TOKEN_DURATION: Final = "48h"  # longer than any test session or benchmark
# The Secret in each agent namespace that holds the namespace's credentials for the agent-state store
# (the operator's AGENTRUN_STATE_STORE_SECRET, its default); attempt Pods take them by secretKeyRef.
STATE_STORE_SECRET: Final = "agentrun-state-store"


def state_store_operator_env(store_url: str) -> dict[str, str]:
    """What the operator is told about the state store: its URL and the Secret name (no credential)."""
    return {"AGENTRUN_STATE_STORE_URL": store_url, "AGENTRUN_STATE_STORE_SECRET": STATE_STORE_SECRET}


def local_store_operator_env(cluster: LocalCluster, *, provision: bool) -> dict[str, str]:
    """The operator's configuration for the object store a local control plane runs, for every path that
    starts an operator on one (`make operator`, `make demo`, the tests): its URL, the namespaces' Secret
    name and the operator's own credentials (the store's root: it writes checkpoint indexes, log tails
    and archives, and collects). `provision`: it also makes each opted-in namespace's bucket, principals
    and Secrets (AGENTRUN_STATE_STORE_PROVISION, as the chart's operator does with its bundled server);
    without it, whoever sets a namespace up makes them (LocalCluster.namespace_store_env)."""
    env = {**state_store_operator_env(cluster.state_store_url), **cluster.state_store_env()}
    if provision:
        env["AGENTRUN_STATE_STORE_PROVISION"] = "versitygw"
    return env


def state_store_secret(namespace: str, credentials: dict[str, str]) -> dict[str, Any]:
    """The namespace's state-store Secret, holding `credentials` (the AWS_* variables, by name): those of
    the namespace's own principal (LocalCluster.namespace_store_env: get and put under its prefix only),
    never the gateway's root (docs/state-store.md)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": STATE_STORE_SECRET, "namespace": namespace},
        "type": "Opaque",
        "stringData": dict(credentials),
    }


class SecurityError(RuntimeError):
    pass


@dataclass(frozen=True)
class Kubectl:
    binary: str
    kubeconfig: Path

    def __call__(self, *args: str, input: str | None = None) -> str:
        out = subprocess.run(
            [self.binary, f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            raise SecurityError(f"kubectl {' '.join(args)} failed: {out.stderr.strip()}")
        return out.stdout

    def apply(self, docs: list[dict[str, Any]]) -> None:
        self(
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=agentrun-devcluster",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}),
        )


def operator_identity_docs() -> list[dict[str, Any]]:
    """The operator's namespace, ServiceAccount and cluster-wide RBAC (the chart's cluster mode, with the
    reading of the admission policies it checks at start-up, and, as this control plane runs the bundled
    object store, the making of namespaces' store Secrets an operator told AGENTRUN_STATE_STORE_PROVISION
    does)."""
    meta = {"name": OPERATOR_SERVICE_ACCOUNT}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {**meta, "namespace": OPERATOR_NAMESPACE}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": meta,
            "rules": [*OPERATOR_RULES, *policy_reader_rules(), *STATE_STORE_PROVISION_RULES],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", **meta},
            "subjects": [
                {"kind": "ServiceAccount", "name": OPERATOR_SERVICE_ACCOUNT, "namespace": OPERATOR_NAMESPACE}
            ],
        },
    ]


def _policies_enforced(kubectl: Kubectl) -> bool:
    """A dry-run create of a labelled Pod by someone other than the operator is refused by the policy."""
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "policy-probe", "namespace": "default", "labels": {"agentrun.dev/run": "probe"}},
        "spec": {"containers": [{"name": "probe", "image": "probe"}]},
    }
    try:
        kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(probe))
    except SecurityError as refused:
        if "NotOperator" in str(refused):
            return True
        if 'serviceaccount "default" not found' in str(refused):
            # On a fresh control plane the ServiceAccount admission plugin refuses every Pod until the
            # controller-manager has created the namespace's default account: not an answer yet.
            return False
        raise
    return False


def install(
    kubectl_binary: str, admin_kubeconfig: Path, operator_kubeconfig: Path, timeout_seconds: float = 120.0
) -> Path:
    """Creates the operator's identity, applies the admission policies and the API priorities (as the
    chart does in cluster-wide mode) and waits until the API server enforces the policies; returns a
    kubeconfig that authenticates as the operator's ServiceAccount."""
    kubectl = Kubectl(kubectl_binary, admin_kubeconfig)
    kubectl.apply(operator_identity_docs())
    kubectl.apply(admission_policies(OPERATOR_USER))
    kubectl.apply(api_priorities(OPERATOR_NAMESPACE, OPERATOR_SERVICE_ACCOUNT))
    token = kubectl(
        "create",
        "token",
        OPERATOR_SERVICE_ACCOUNT,
        f"--namespace={OPERATOR_NAMESPACE}",
        f"--duration={TOKEN_DURATION}",
    ).strip()
    admin = _cluster_of(admin_kubeconfig)
    token_file = operator_kubeconfig.with_suffix(".token")
    token_file.parent.mkdir(parents=True, exist_ok=True)
    token_file.write_text(token)
    token_file.chmod(0o600)
    write_kubeconfig(
        operator_kubeconfig,
        admin["server"],
        Path(admin["certificate-authority"]),
        OPERATOR_USER,
        token_file=token_file,
    )
    deadline = time.monotonic() + timeout_seconds
    while not _policies_enforced(kubectl):
        if time.monotonic() > deadline:
            raise SecurityError(f"the admission policies were not enforced within {timeout_seconds}s")
        time.sleep(0.1)
    return operator_kubeconfig


def _cluster_of(kubeconfig: Path) -> dict[str, str]:
    config = yaml.safe_load(kubeconfig.read_text())
    cluster: dict[str, str] = config["clusters"][0]["cluster"]
    return cluster
