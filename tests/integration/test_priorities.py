"""API Priority and Fairness on the real API server (agentrun.priorities, installed with the operator's
identity as the chart does in cluster-wide mode): the API server says in every answer which priority
level served the request (the X-Kubernetes-PF-PriorityLevel-UID header), so the test asks it directly:
the operator's requests and an attempt Pod's Lease renewals are served by agentrun-control, what the
Pod reads and writes of agentrun.dev by agentrun-steps, and another ServiceAccount's other requests stay
in the API server's own levels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from agentrun import priorities
from agentrun.api import GROUP, VERSION
from support.console import token_of
from support.kube import Kube

pytestmark = pytest.mark.cluster
LEVEL_HEADER = "X-Kubernetes-PF-PriorityLevel-UID"


def levels(kube: Kube) -> dict[str, str]:
    """Priority level UID -> name, as the API server holds them."""
    api = client.FlowcontrolApiserverV1Api(kube.api_client)
    return {str(p.metadata.uid): str(p.metadata.name) for p in api.list_priority_level_configuration().items}


def served_by(kube: Kube, answer: tuple[Any, int, dict[str, str]], expected: int = 200) -> str:
    _, status, headers = answer
    assert status == expected
    return levels(kube)[headers[LEVEL_HEADER]]


def as_kubeconfig(kube: Kube, kubeconfig: Path) -> Kube:
    return Kube(kubeconfig, kube.kubectl_path)


def test_the_operator_and_lease_renewals_come_before_agents_steps(
    kube: Kube, agentrun_crds: None, operator_kubeconfig: Path, run_namespace: str
) -> None:
    ns = run_namespace
    lease = {"metadata": {"name": "r.run.agentrun.dev"}, "spec": {"holderIdentity": "r-a1"}}
    kube.coordination.create_namespaced_lease(ns, lease)

    operator = as_kubeconfig(kube, operator_kubeconfig)
    answer = operator.custom.list_namespaced_custom_object_with_http_info(GROUP, VERSION, ns, "runs")
    assert served_by(kube, answer) == priorities.CONTROL_LEVEL

    pod = kube.with_token(token_of(kube, ns, "default"))  # the attempt Pods' account (opted in)
    renewal = pod.coordination.read_namespaced_lease_with_http_info("r.run.agentrun.dev", ns)
    assert served_by(kube, renewal) == priorities.CONTROL_LEVEL
    steps = pod.custom.list_namespaced_custom_object_with_http_info(GROUP, VERSION, ns, "checkpoints")
    assert served_by(kube, steps) == priorities.STEPS_LEVEL
    # Anything else the account asks stays where the API server puts every ServiceAccount.
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    other = client.AuthenticationV1Api(pod.api_client).create_self_subject_review_with_http_info(review)
    assert served_by(kube, other, 201) not in {priorities.CONTROL_LEVEL, priorities.STEPS_LEVEL}
