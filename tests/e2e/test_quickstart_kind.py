"""The README's Helm quickstart on a real cluster (`make e2e-kind`): the chart installed with its default
values but the images (those loaded into the cluster), then the quickstart's commands after its `helm
install`, unchanged, in real Pods, in the namespace `agents` under restricted Pod Security: the example
manifests, `kubectl wait`, and the `kubectl agentrun` plugin (this checkout's, on PATH).

The release is named like the e2e suite's (test_helm.RELEASE), so that Helm adopts the CRDs an earlier e2e
test left (they outlive `helm uninstall`). On the local control plane the README's blocks run in
tests/integration/test_quickstart.py; this module needs a cluster that runs images (AGENTRUN_E2E_KUBECONFIG):
`make test` runs it in its kind stage (`make e2e-kind`), and leaves it out of the local run (marker kind)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.conftest import KUBECONFIG_ENV, Target
from e2e.test_helm import CHART, RELEASE, _adopt_leftover_crds, _create_namespace
from integration.test_quickstart import quickstarts
from support.corpus import REPO

pytestmark = pytest.mark.kind

NAMESPACE = "agentrun-system"  # the README's
AGENTS = "agents"  # examples/agents.yaml's


def _image_values(target: Target) -> list[str]:
    repository, _, tag = target.operator_image.rpartition(":")
    store_repository, _, store_tag = target.store_image.rpartition(":")
    return [
        f"--set-string=image.repository={repository}",
        f"--set-string=image.tag={tag}",
        f"--set-string=stateStore.bundled.image.repository={store_repository}",
        f"--set-string=stateStore.bundled.image.tag={store_tag}",
    ]


def _install(target: Target) -> None:
    """The README's helm install (bundled state store on, by default), with the images loaded; --wait: the
    operator replicas are Ready only once the store accepted their root credentials."""
    target.helm(
        "install",
        RELEASE,
        str(CHART),
        f"--namespace={NAMESPACE}",
        "--create-namespace",
        "--set=stateStore.bundled.enabled=true",
        *_image_values(target),
        "--wait",
        "--timeout=300s",
    )


@pytest.fixture
def installed(e2e_target: Target) -> Iterator[Target]:
    if not os.environ.get(KUBECONFIG_ENV):
        pytest.fail(f"{KUBECONFIG_ENV} is not set: Pods here run from images; run it with make e2e-kind")
    kube = e2e_target.kube
    _adopt_leftover_crds(kube, NAMESPACE)
    # the namespace examples/agents.yaml declares, made first so that it enforces restricted Pod Security
    _create_namespace(kube, AGENTS, {"pod-security.kubernetes.io/enforce": "restricted"})
    _install(e2e_target)
    try:
        yield e2e_target
    finally:
        kube.kubectl("delete", "namespace", AGENTS, "--wait=true", "--timeout=180s", check=False)
        e2e_target.helm(
            "uninstall", RELEASE, f"--namespace={NAMESPACE}", "--wait", "--timeout=180s", check=False
        )


def _sh(target: Target, script: list[str], timeout: float = 900) -> str:
    tools = [str(Path(target.kube.kubectl_path).parent), str(Path(sys.executable).parent)]
    env = {
        **os.environ,
        "KUBECONFIG": str(target.kube.kubeconfig),
        "PATH": os.pathsep.join([*tools, os.environ.get("PATH", "")]),
    }
    lines = ["set -euo pipefail"]
    for command in script:
        lines += [f"echo {shlex.quote('$ ' + command)}", command]
    done = subprocess.run(
        ["bash", "-c", "\n".join(lines)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, f"the quickstart failed ({done.returncode}):\n{log[-6000:]}"
    return log


def _json(target: Target, *args: str) -> Any:
    return json.loads(target.kube.kubectl(*args, "-o", "json").stdout)


@pytest.mark.timeout(1500)
def test_the_readme_helm_quickstart_runs_unchanged_in_real_pods(installed: Target) -> None:
    commands = quickstarts()["helm"]
    assert commands[2].startswith("helm install agentrun charts/agentrun -n agentrun-system")
    examples = commands[3:]  # after the install: unchanged
    log = _sh(installed, examples)

    approved = _json(installed, "get", "run", "-n", AGENTS, "pydantic-ai-ticket")
    assert approved["status"]["phase"] == "Succeeded", approved["status"]
    assert "Opened T-1." in json.dumps(approved["status"]["result"])
    effects = _json(
        installed, "get", "sideeffects", "-n", AGENTS, "-l", "agentrun.dev/run=pydantic-ai-ticket"
    )
    tickets = [e for e in effects["items"] if e["spec"]["tool"] == "create_ticket"]
    assert [(e["status"]["state"], e["status"].get("externalReference")) for e in tickets] == [
        ("Confirmed", "T-1")
    ]
    assert "T-1" in log  # the report was shown
    # the ticket service (a Deployment in its own Pod) opened that one ticket: asked through the API server
    raw = installed.kube.kubectl(
        "get", "--raw", f"/api/v1/namespaces/{AGENTS}/services/tickets:8088/proxy/tickets"
    )
    assert [(t["id"], t["status"]) for t in json.loads(raw.stdout)] == [("T-1", "open")]
    cancelled = _json(installed, "get", "run", "-n", AGENTS, "langgraph-ticket")
    assert cancelled["status"]["phase"] == "Cancelled", cancelled["status"]

    # the other example Runs, unchanged, in the same namespace: every example manifest runs in real Pods
    _sh(
        installed,
        [
            "kubectl apply -n agents -f examples/run-minimal.yaml",
            "kubectl apply -n agents -f examples/run-with-retry-and-lease.yaml",
            "kubectl wait -n agents --for=jsonpath='{.status.phase}'=Succeeded run/echo run/echo-resilient "
            "--timeout=600s",
        ],
    )
    for name in ("echo", "echo-resilient"):
        assert _json(installed, "get", "run", "-n", AGENTS, name)["status"]["phase"] == "Succeeded"

    # the attempt Pods ran as the restricted standard requires (the namespace would have refused others)
    ns = _json(installed, "get", "namespace", AGENTS)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


@pytest.mark.timeout(900)
def test_an_install_after_an_uninstall_finds_the_bundled_stores_data(installed: Target) -> None:
    """`helm uninstall` keeps the store's volume and the root Secret that owns its buckets: installing again
    reads the same credentials back (with new ones, the server refuses the operator its bucket)."""
    secret = f"{RELEASE}-store-root"
    before = installed.kube.core.read_namespaced_secret(secret, NAMESPACE).data
    installed.helm("uninstall", RELEASE, f"--namespace={NAMESPACE}", "--wait", "--timeout=180s")
    assert installed.kube.core.read_namespaced_secret(secret, NAMESPACE).data == before

    _install(installed)
    _sh(
        installed,
        [
            "kubectl apply -f examples/agents.yaml",
            "kubectl apply -n agents -f examples/run-minimal.yaml",
            "kubectl wait -n agents --for=jsonpath='{.status.phase}'=Succeeded run/echo --timeout=600s",
        ],
    )
    assert installed.kube.core.read_namespaced_secret(secret, NAMESPACE).data == before
