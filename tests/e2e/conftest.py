"""End-to-end fixtures: the Helm chart installed on a cluster of its own.

By default the e2e tests start their own local control plane (the same LocalCluster as the session's
`local_cluster`, but a second one): the chart's cluster-scoped objects (CRDs kept on uninstall, peering
CRDs) and its operator never meet the session's `operator` fixture or the CRDs `agentrun_crds` applies,
so e2e and integration tests can share a pytest session.

With AGENTRUN_E2E_KUBECONFIG set, the same tests run against that cluster instead (e.g. kind, with the
images of Dockerfile and Dockerfile.agent loaded; name them with AGENTRUN_E2E_OPERATOR_IMAGE and
AGENTRUN_E2E_AGENT_IMAGE, and the bundled state store's with AGENTRUN_E2E_STORE_IMAGE; `make e2e-kind`
does all of this). kubectl and helm come from $KUBECTL/$HELM, the binary cache, or PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentrun.deploy.generate import find_helm
from agentrun.statestore import versitygw
from devcluster.cluster import LocalCluster, binary_dir
from support.corpus import REPO
from support.kube import Kube

KUBECONFIG_ENV = "AGENTRUN_E2E_KUBECONFIG"


@dataclass
class Target:
    """The cluster the e2e tests install the chart on, and how to reach it."""

    kube: Kube
    helm_path: str
    helm_home: Path
    operator_image: str
    agent_image: str
    store_image: str  # the bundled state store's (by default the chart's: upstream's, of the pinned version)
    node_pods: Path | None  # the local node agent's Pod sandboxes (their logs); None on a real cluster

    @property
    def local(self) -> bool:
        """True on the local control plane, whose node agent runs Pods as processes on this machine."""
        return self.node_pods is not None

    def helm(self, *args: str, check: bool = True, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "HELM_CACHE_HOME": str(self.helm_home / "cache"),
            "HELM_CONFIG_HOME": str(self.helm_home / "config"),
            "HELM_DATA_HOME": str(self.helm_home / "data"),
        }
        argv = [self.helm_path, f"--kubeconfig={self.kube.kubeconfig}", *args]
        result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result


def _tool(name: str) -> Path:
    if explicit := os.environ.get(name.upper()):
        return Path(explicit)
    cached = binary_dir() / name
    if os.access(cached, os.X_OK):
        return cached
    if found := shutil.which(name):
        return Path(found)
    raise AssertionError(f"{name} not found: run `make binaries` or set {name.upper()}")


@pytest.fixture(scope="session")
def e2e_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    helm_home = tmp_path_factory.mktemp("helm")
    images = {
        "operator_image": os.environ.get("AGENTRUN_E2E_OPERATOR_IMAGE", "agentrun/operator:e2e"),
        "agent_image": os.environ.get("AGENTRUN_E2E_AGENT_IMAGE", "agentrun/agent:e2e"),
        "store_image": os.environ.get("AGENTRUN_E2E_STORE_IMAGE", f"{versitygw.IMAGE}:{versitygw.VERSION}"),
    }
    if external := os.environ.get(KUBECONFIG_ENV):
        kube = Kube(Path(external), _tool("kubectl"))
        yield Target(kube, str(find_helm(REPO)), helm_home, node_pods=None, **images)
        return
    cluster = LocalCluster(state_dir=tmp_path_factory.mktemp("e2e-cluster"))
    try:
        cluster.start()
        kube = Kube(cluster.kubeconfig, Path(cluster.binary("kubectl")))
        helm = cluster.binary("helm")
        yield Target(kube, helm, helm_home, node_pods=cluster.state_dir / "node" / "pods", **images)
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kube(e2e_target: Target) -> Kube:
    """Overrides the session's `kube`: in tests/e2e, the e2e cluster."""
    return e2e_target.kube
