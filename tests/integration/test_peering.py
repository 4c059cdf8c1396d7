"""Operator replicas with peering, as real processes on a control plane of this module's own: the one of
highest priority acts, a replica standing by does nothing at all (kopf pauses its Run watch; agentrun's
runtime pauses its informers, reconcile workers, timers and notification senders), and a standby takes
over when the active replica leaves, or gives way when one of higher priority comes.

Each replica is told apart by its own metrics endpoint and log: what it reconciled is counted there
(agentrun_reconciles_total, agentrun_operator_active) and logged with the Run's name (JSON lines).
Everything is waited for as an event: a log line, a Run's phase; no fixed delay.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from agentrun.api.peering import peering_crds
from agentrun.examples.manifests import agent_run
from devcluster import security
from devcluster.operator import OperatorProcess
from devcluster.processes import free_port
from support.clusters import operator_identity, opt_in_for_attempts, own_cluster
from support.kube import Kube, wait_for
from support.runs import create_run, wait_phase

pytestmark = pytest.mark.cluster
PEERING = "agentrun"


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    """Overrides the session's `kube`: a control plane of its own (the session's cluster-wide operator
    would reconcile these Runs too), with the agentrun CRDs and kopf's peering CRDs."""
    for cluster in own_cluster(tmp_path_factory, "peering-cluster"):
        for crd in peering_crds():
            try:
                cluster.extensions.create_custom_resource_definition(crd)
            except ApiException as exc:
                if exc.status != 409:
                    raise
        yield cluster


@pytest.fixture(scope="module")
def operator_kubeconfig(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Overrides the session's: the operator's identity and the admission policies on this cluster."""
    return operator_identity(kube, tmp_path_factory)


class Replica:
    """One operator process of the peering, named `name` among its peers (POD_ID, as in a Pod)."""

    def __init__(self, name: str, priority: int, kubeconfig: Path, namespace: str, log_dir: Path) -> None:
        self.name, self.port = name, free_port()
        self.process = OperatorProcess(
            kubeconfig,
            log_dir / f"{name}.log",
            env={
                "AGENTRUN_METRICS_PORT": str(self.port),
                "AGENTRUN_PEERING": PEERING,
                "AGENTRUN_PRIORITY": str(priority),
                "POD_ID": name,
                **security.OPERATOR_ENV,
            },
            args=[f"--namespace={namespace}", "--log-format=json"],
        )

    def start(self) -> Replica:
        self.process.start()
        self.process.wait_ready()
        return self

    def entries(self) -> list[dict[str, Any]]:
        text = self.process.log_path.read_text(errors="replace")
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

    def standing(self) -> str | None:
        """The last standing it logged: "active: ..." or "standing by: ..." (None before the first)."""
        said = [
            e["message"] for e in self.entries() if e["message"].startswith(("active: ", "standing by: "))
        ]
        return said[-1] if said else None

    def wait_standing(self, prefix: str, mentioning: str = "") -> str:
        def said() -> str | None:
            last = self.standing()
            return last if last and last.startswith(prefix) and mentioning in last else None

        return wait_for(said, 120, what=f"{self.name}: {prefix!r} {mentioning!r}\n{self.process.log_tail()}")

    def lines_about(self, run: str) -> list[dict[str, Any]]:
        return [e for e in self.entries() if e.get("run") == run]

    def metric(self, name: str) -> float:
        """The sum of a metric's samples on this replica's endpoint."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=30) as response:
            text = response.read().decode()
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name
        )

    def reconciles(self) -> float:
        return self.metric("agentrun_reconciles_total")


@pytest.fixture
def replicas(
    kube: Kube, namespace: str, operator_kubeconfig: Path, tmp_path: Path
) -> Iterator[dict[str, Replica]]:
    opt_in_for_attempts(kube, namespace)
    made = {
        name: Replica(name, priority, operator_kubeconfig, namespace, tmp_path)
        for name, priority in (("replica-a", 20), ("replica-b", 10), ("replica-c", 30))
    }
    try:
        yield made
    finally:
        for replica in made.values():
            replica.process.stop()


def peers(kube: Kube, namespace: str) -> set[str]:
    """The replicas named in the peering object's status (kopf's entries, whether fresh or not)."""
    peering = kube.custom.get_namespaced_custom_object("kopf.dev", "v1", namespace, "kopfpeerings", PEERING)
    return set(peering.get("status") or {})


def echo(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    create_run(kube, namespace, agent_run(name, "echo", {"hello": name}))
    run = wait_phase(kube, namespace, name, {"Succeeded", "Failed"}, timeout=120)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    return run


def test_a_replica_standing_by_does_nothing_and_takes_over_when_the_active_one_leaves(
    kube: Kube, namespace: str, replicas: dict[str, Replica]
) -> None:
    a, b, c = replicas["replica-a"].start(), replicas["replica-b"], replicas["replica-c"]
    a.wait_standing("active: ")
    b.start()
    b.wait_standing("standing by: ", "replica-a (priority 20)")

    echo(kube, namespace, "first")

    # the standby did nothing: no listing, no reconcile, not a line about the Run
    assert b.metric("agentrun_operator_active") == 0
    assert b.reconciles() == 0, b.process.log_tail()
    assert b.lines_about("first") == []
    assert not [e for e in b.entries() if e["message"].startswith("listed ")]
    assert a.metric("agentrun_operator_active") == 1 and a.reconciles() > 0
    assert a.lines_about("first")

    # the active replica leaves (kopf says goodbye in the peering): the standby takes over at once, not
    # once a's heartbeat has run out (its entry is gone by the time it has exited)
    a.process.stop()
    assert "replica-a" not in peers(kube, namespace), a.process.log_tail()
    b.wait_standing("active: ")
    echo(kube, namespace, "second")
    assert b.lines_about("second") and b.metric("agentrun_operator_active") == 1

    # a replica of higher priority comes: b gives way, and stays still while c carries a Run
    c.start()
    b.wait_standing("standing by: ", "replica-c (priority 30)")
    before = b.reconciles()
    echo(kube, namespace, "third")
    assert c.lines_about("third")
    assert b.reconciles() == before and b.lines_about("third") == []
    assert b.metric("agentrun_operator_active") == 0

    # ... and takes over again when it leaves: informers, workers and timers start anew
    c.process.stop()
    assert "replica-c" not in peers(kube, namespace), c.process.log_tail()
    b.wait_standing("active: ")
    echo(kube, namespace, "fourth")
    assert b.lines_about("fourth") and b.reconciles() > before
