"""`make cluster` + `make operator` as a person runs them (`python -m devcluster up`, then `install`, on a
state directory of the test's own): the operator runs with the object store the cluster runs, says so
(its log, its metric, each Run's status.stateStore), and makes an opted-in namespace's bucket and Secrets;
what `make cluster` prints for an operator started by hand is exactly what that operator runs with; a
Run whose state outgrows the inline threshold finishes through the store and is archived, and the CLI
reads the archive with the namespace's read-only Secret alone (no store variable in its environment).

It starts its own control plane (not the session's), so it does not use the `local_cluster` fixture."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster.processes import free_port
from integration.test_cli import argv
from support.big_state_agent import output
from support.clusters import opt_in_for_attempts
from support.corpus import REPO
from support.kube import Kube, wait_for
from support.runs import FAST_RETRY, GROUP, VERSION, create_run, get_run, support_agent_run

pytestmark = pytest.mark.cluster

NAMESPACE = "agents-store"


def devcluster(state_dir: Path, command: str, **env: str) -> str:
    """`python -m devcluster COMMAND` as `make` runs it; its output (it must succeed)."""
    done = subprocess.run(
        [sys.executable, "-m", "devcluster", command, f"--state-dir={state_dir}"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO / "hack"), **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"devcluster {command} failed:\n{done.stdout}{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, str, int]]:
    """The state directory, what `make cluster` and `make operator` printed, the operator's metrics port."""
    state_dir = tmp_path_factory.mktemp("devcluster-store")
    metrics_port = free_port()
    try:
        up = devcluster(state_dir, "up")
        installed = devcluster(state_dir, "install", AGENTRUN_METRICS_PORT=str(metrics_port))
        yield state_dir, up, installed, metrics_port
    finally:
        subprocess.run(
            [sys.executable, "-m", "devcluster", "down", f"--state-dir={state_dir}"],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO / "hack")},
            capture_output=True,
            check=False,
        )


@pytest.fixture(scope="module")
def kube(made: tuple[Path, str, str, int]) -> Kube:
    state_dir = made[0]
    binaries = json.loads((state_dir / "state.json").read_text())["binDir"]
    return Kube(state_dir / "kubeconfig", Path(binaries) / "kubectl")


def exported(path: Path) -> dict[str, str]:
    """The variables a file exports, as bash reads it (`source`), without those bash sets itself."""

    def environment(script: str) -> dict[str, str]:
        shown = subprocess.run(["bash", "-c", script], env={}, capture_output=True, check=True, timeout=60)
        return dict(item.split("=", 1) for item in shown.stdout.decode().split("\0") if "=" in item)

    bare = environment("env -0")
    return {k: v for k, v in environment(f'source "{path}" && env -0').items() if k not in bare}


def process_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode()
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def test_what_make_cluster_prints_is_what_the_operator_of_make_operator_runs_with(
    made: tuple[Path, str, str, int],
) -> None:
    state_dir, up, installed, metrics_port = made
    # no advice to hand a namespace the store's root credentials in a Secret without its bucket
    assert "kubectl create secret generic" not in up
    [printed] = re.findall(r"an operator started by hand takes the same: source (\S+)", up)
    told = exported(Path(printed))
    assert told["AGENTRUN_STATE_STORE_PROVISION"] == "versitygw"
    assert set(told) >= {"AGENTRUN_STATE_STORE_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    pid = json.loads((state_dir / "operator.json").read_text())["pid"]
    running = process_env(pid)
    assert {name: running.get(name) for name in told} == told
    assert "state store: Bundled" in installed

    # the operator says where it keeps agent state: its start-up log and its metric
    log = (state_dir / "logs" / "operator.log").read_text()
    assert f"state store: Bundled, the bundled server at {told['AGENTRUN_STATE_STORE_URL']}" in log
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as response:
        metrics = response.read().decode()
    assert 'agentrun_state_store_mode{mode="bundled"} 1.0' in metrics
    assert 'agentrun_state_store_mode{mode="inline"} 0.0' in metrics


def secret(kube: Kube, namespace: str, name: str) -> Any:
    found = kube.core.list_namespaced_secret(namespace, field_selector=f"metadata.name={name}").items
    return found[0] if found else None


def test_an_opted_in_namespace_runs_through_the_store_and_reads_its_archive_with_its_read_only_secret(
    made: tuple[Path, str, str, int], kube: Kube
) -> None:
    kube.core.create_namespace({"metadata": {"name": NAMESPACE}})
    wait_for(
        lambda: (
            kube.core.list_namespaced_service_account(NAMESPACE, field_selector="metadata.name=default").items
        ),
        timeout=60,
        what="the namespace's default service account",
    )
    opt_in_for_attempts(kube, NAMESPACE)
    # the operator makes the namespace's Secrets once it opts in (nobody else does here)
    for name in ("agentrun-state-store", "agentrun-state-store-read"):
        wait_for(lambda: secret(kube, NAMESPACE, name), timeout=120, what=f"Secret {name}")  # noqa: B023

    # a state over the inline threshold, killed half-way: it resumes whole from the store
    body = support_agent_run("big", "big_state_agent", {"steps": 3, "outputBytes": 20_000, "killAt": 2})
    body["spec"]["retry"] = FAST_RETRY
    body["spec"]["ttlSecondsAfterFinished"] = 0
    create_run(kube, NAMESPACE, body)
    uid = get_run(kube, NAMESPACE, "big")["metadata"]["uid"]

    def archived() -> bool:
        listed = kube.custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "runs")["items"]
        return not any(r["metadata"]["uid"] == uid for r in listed)

    wait_for(archived, timeout=300, what="the Run archived and deleted")

    # the CLI, with no store variable in its environment, reads the namespace's read-only Secret
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTRUN_STATE_STORE", "AWS_"))}
    env["KUBECONFIG"] = str(kube.kubeconfig)

    def plugin(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv(NAMESPACE, *args), env=env, capture_output=True, text=True, timeout=120, check=False
        )

    listed = plugin("history")
    assert listed.returncode == 0, listed.stderr
    assert uid in listed.stdout and "Succeeded" in listed.stdout
    shown = plugin("describe", "--archived", "big")
    assert shown.returncode == 0, shown.stderr
    assert "State store:   Bundled (the operator's bundled object store)" in shown.stdout
    assert "attempt 2 Succeeded" in shown.stdout, shown.stdout
    document = json.loads(plugin("describe", "--archived", "big", "-o", "json").stdout)
    assert document["object"]["status"]["stateStore"] == "Bundled"
    assert document["object"]["status"]["phase"] == "Succeeded"
    # describe of the name alone says where it went
    gone = plugin("describe", "big")
    assert gone.returncode == 1 and f"kubectl agentrun describe --archived big -n {NAMESPACE}" in gone.stderr
    assert len(output(0, 20_000)) > 16 * 1024  # each step's output alone is over the inline threshold

    # docs/state-store.md's recipe that puts the read-only Secret's values in a shell, run as written
    kubectl_dir = Path(str(kube.kubectl_path)).parent
    env["PATH"] = os.pathsep.join([str(kubectl_dir), str(Path(sys.executable).parent), os.environ["PATH"]])
    script = "\n".join(
        [
            "set -euo pipefail",
            recipe().replace("-n NS", f"-n {NAMESPACE}"),
            'echo "url=$AGENTRUN_STATE_STORE_URL"',
        ]
    )
    ran = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert ran.returncode == 0, f"{ran.stdout}{ran.stderr}"
    assert uid in ran.stdout
    read = secret(kube, NAMESPACE, "agentrun-state-store-read")
    url = base64.b64decode(read.data["AGENTRUN_STATE_STORE_URL"]).decode()
    assert f"url={url}\n" in ran.stdout and "&" in url


def recipe() -> str:
    """The bash block of docs/state-store.md that reads the read-only Secret into a shell."""
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "docs" / "state-store.md").read_text(), re.S)
    [block] = [b for b in blocks if "get secret agentrun-state-store-read -n NS" in b]
    return textwrap.dedent(block)
