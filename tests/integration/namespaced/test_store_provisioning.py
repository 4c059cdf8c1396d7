"""With the bundled server, a Run whose namespace lacks its store Secret has it made by the Run's own table
(the rule StoreCredentialsProvision, the action ProvisionStoreCredentials carried out by the executor),
not while the operator observes it; on the namespaced control plane, where no cluster-wide operator
(without the bundled server) would fail the Run first. The sweep that makes them at opt-in, and takes them
back: tests/integration/test_store_access.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from devcluster import security
from devcluster.cluster import LocalCluster
from integration.test_store_access import own_namespace, provisioning_operator, secrets_made
from support.clusters import opt_in_for_attempts
from support.kube import Kube, wait_for
from support.runs import attempts, create_run, scenario_run, wait_phase

pytestmark = pytest.mark.cluster

__all__ = ["own_namespace"]  # the fixture, shared with test_store_access


def test_a_run_whose_namespace_lost_its_secret_has_it_made_again_by_the_runs_table(
    kube: Kube,
    local_cluster: LocalCluster,
    own_namespace: str,
    operator_kubeconfig: Path,
    tmp_path: Path,
) -> None:
    """The sweep made the Secrets once (at opt-in); one deleted since is made again by the Run that needs
    it, before its first Pod: the Run runs, and does not fail for what the operator can make."""
    ns = own_namespace
    operator = provisioning_operator(operator_kubeconfig, local_cluster, ns, tmp_path / "operator.log")
    try:
        opt_in_for_attempts(kube, ns)
        made = wait_for(lambda: secrets_made(kube, ns), timeout=30, what=f"the store's Secrets in {ns}")
        kube.core.delete_namespaced_secret(security.STATE_STORE_SECRET, ns)
        wait_for(lambda: not secrets_made(kube, ns), timeout=30, what=f"{ns}'s Secret deleted")

        create_run(kube, ns, scenario_run("remade", {"steps": 1}))

        run = wait_phase(kube, ns, "remade", {"Failed", "Succeeded"})
        assert run["status"]["phase"] == "Succeeded", (run["status"], operator.log_tail())
        again = secrets_made(kube, ns)
        read = security.STATE_STORE_SECRET + "-read"
        assert again[read] == made[read], "the Secret still there is kept as it is"
        assert again[security.STATE_STORE_SECRET][1] != made[security.STATE_STORE_SECRET][1], "made anew"
        [attempt] = attempts(kube, ns, "remade")
        assert attempt["status"]["phase"] == "Succeeded"
    finally:
        operator.stop()
        local_cluster.forget_namespace_store(ns)
