"""The README's quickstart, run as written: each block marked `<!-- quickstart: NAME -->` is read from the
README and its commands run one after another in one bash, from the checkout, on a local control plane
of its own. The one liberty taken: the state directory (`.devcluster` in the README, and so in the
commands that name a file in it) is a temporary one (AGENTRUN_DEVCLUSTER_DIR), so a developer's own
`make cluster` is never touched. Then the outcomes are checked: the approved Run Succeeded with its
ticket confirmed once, the cancelled one is Cancelled, both through the cluster's object store.

It starts its own clusters (not the session's), so it does not use the `local_cluster` fixture."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from support.corpus import REPO

pytestmark = pytest.mark.cluster

README = REPO / "README.md"
MAX_COMMANDS = 15
BLOCK = re.compile(r"<!-- quickstart: (?P<name>[\w-]+) -->\s*```sh\n(?P<body>.*?)```", re.S)


def quickstarts() -> dict[str, list[str]]:
    """The README's quickstart blocks by name: their commands, one a line (comments and blanks left out)."""
    blocks = {
        m["name"]: [
            line.strip() for line in m["body"].splitlines() if line.strip() and not line.startswith("#")
        ]
        for m in BLOCK.finditer(README.read_text())
    }
    return blocks


def test_the_readme_has_both_quickstarts_within_fifteen_commands() -> None:
    blocks = quickstarts()
    assert sorted(blocks) == ["helm", "local"]
    for name, commands in blocks.items():
        assert 0 < len(commands) <= MAX_COMMANDS, f"quickstart {name}: {len(commands)} commands"
        assert commands[:2] == ["make cluster", "source .devcluster/env"], name
    # the examples are the same on both paths: only the install differs
    local, helm = blocks["local"], blocks["helm"]
    assert local[3:] == helm[3:]
    assert local[2] == "make operator" and helm[2].startswith("helm install ")


@dataclass
class Outcome:
    state_dir: Path
    log: str
    seconds: float

    def sh(self, command: str) -> str:
        """A command in a shell that sourced the cluster's env file, as the quickstart's shell did."""
        out = subprocess.run(
            f"source {shlex.quote(str(self.state_dir / 'env'))} && {command}",
            shell=True,
            executable="/bin/bash",
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert out.returncode == 0, f"{command} failed:\n{out.stdout}{out.stderr}"
        return out.stdout

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.sh(f"kubectl {shlex.join(args)} -o json"))

    def run(self, name: str) -> dict[str, Any]:
        run: dict[str, Any] = self.kubectl_json("get", "run", "-n", "agents", name)
        return run

    def side_effects(self, run: str) -> list[dict[str, Any]]:
        listed = self.kubectl_json("get", "sideeffects", "-n", "agents", "-l", f"agentrun.dev/run={run}")
        items: list[dict[str, Any]] = listed["items"]
        return items


def run_quickstart(name: str, state_dir: Path, helm_home: Path) -> Outcome:
    """Runs the README's block `name` in one bash from the checkout; fails with its output on an error."""
    script = ["set -euo pipefail"]
    for written in quickstarts()[name]:
        command = written.replace(".devcluster/", f"{shlex.quote(str(state_dir))}/")
        script += [f"echo {shlex.quote('$ ' + written)}", command]
    env = {
        **os.environ,
        "AGENTRUN_DEVCLUSTER_DIR": str(state_dir),
        # helm's own state stays out of the home directory
        "HELM_CACHE_HOME": str(helm_home / "cache"),
        "HELM_CONFIG_HOME": str(helm_home / "config"),
        "HELM_DATA_HOME": str(helm_home / "data"),
    }
    began = time.monotonic()
    done = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    seconds = time.monotonic() - began
    log = done.stdout + done.stderr
    if done.returncode != 0:
        operator_log = state_dir / "logs" / "operator.log"
        tail = operator_log.read_text(errors="replace")[-4000:] if operator_log.exists() else ""
        raise AssertionError(f"quickstart {name} failed ({done.returncode}):\n{log[-6000:]}\n{tail}")
    print(f"quickstart {name}: {len(quickstarts()[name])} commands in {seconds:.1f}s")
    return Outcome(state_dir, log, seconds)


# What the quickstart's Pods listen on, on this machine's one network: the example ticket service, and the
# chart's operator (health, metrics). A port another process holds would serve the wrong thing.
PORTS = {8088: "the example ticket service", 8080: "the chart's health port", 8000: "the metrics port"}


def _taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


@pytest.fixture(params=["local", "helm"])
def outcome(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Outcome]:
    taken = {port: what for port, what in PORTS.items() if _taken(port)}
    assert not taken, f"ports the quickstart's Pods listen on are taken on this machine: {taken}"
    state_dir = tmp_path / "devcluster"
    try:
        yield run_quickstart(request.param, state_dir, tmp_path / "helm")
    finally:
        subprocess.run(
            [sys.executable, "-m", "devcluster", "down", f"--state-dir={state_dir}"],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO / "hack")},
            capture_output=True,
            check=False,
        )


# The quickstart's own bound (900 s, its control plane's start included), and the commands after it.
@pytest.mark.timeout(1500)
def test_quickstart_runs_as_written(outcome: Outcome) -> None:
    approved = outcome.run("pydantic-ai-ticket")
    assert approved["status"]["phase"] == "Succeeded"
    # on both paths the operator keeps agent state in the object store `make cluster` runs, and made the
    # examples' namespace its Secrets when it opted in
    assert approved["status"]["stateStore"] == "Bundled"
    secrets = outcome.kubectl_json("get", "secrets", "-n", "agents")["items"]
    assert {"agentrun-state-store", "agentrun-state-store-read"} <= {s["metadata"]["name"] for s in secrets}
    assert "Opened T-1." in json.dumps(approved["status"]["result"])
    tickets = [e for e in outcome.side_effects("pydantic-ai-ticket") if e["spec"]["tool"] == "create_ticket"]
    assert [(e["status"]["state"], e["status"].get("externalReference")) for e in tickets] == [
        ("Confirmed", "T-1")
    ]
    assert "kubectl agentrun report" in outcome.log and "T-1" in outcome.log  # the report was shown
    # the ticket service the quickstart deployed (its Pod listens on this machine) opened that one ticket
    with urllib.request.urlopen("http://127.0.0.1:8088/tickets", timeout=10) as response:
        opened = json.load(response)
    assert [(t["id"], t["title"], t["status"]) for t in opened] == [("T-1", "Printer on fire", "open")]
    cancelled = outcome.run("langgraph-ticket")
    assert cancelled["status"]["phase"] == "Cancelled"
    assert "pendingRequest" not in cancelled["status"]  # it waits for nobody: no inbox, no WAITING FOR
    assert outcome.side_effects("langgraph-ticket") == []  # cancelled while it asked: nothing was done

    # The report offered `kubectl agentrun compensate`: the example registers the compensation it names,
    # so following the hint closes the ticket, once, and the Run returns to Succeeded.
    assert re.search(r"Compensate with: kubectl agentrun compensate .*pydantic-ai-ticket", outcome.log)
    outcome.sh("kubectl agentrun compensate -n agents pydantic-ai-ticket --wait --timeout 120")
    assert outcome.run("pydantic-ai-ticket")["status"]["phase"] == "Succeeded"
    states = {e["spec"]["tool"]: e["status"]["state"] for e in outcome.side_effects("pydantic-ai-ticket")}
    assert states == {"create_ticket": "Compensated", "close_ticket": "Confirmed"}
    with urllib.request.urlopen("http://127.0.0.1:8088/tickets/T-1", timeout=10) as response:
        assert json.load(response)["status"] == "closed"

    # The other example Runs, applied as their comments say, run unchanged on the same path.
    for manifest, name in (("run-minimal.yaml", "echo"), ("run-with-retry-and-lease.yaml", "echo-resilient")):
        outcome.sh(f"kubectl apply -n agents -f examples/{manifest}")
        outcome.sh(
            f"kubectl wait -n agents run/{name} --for=jsonpath='{{.status.phase}}'=Succeeded --timeout=120s"
        )
        assert outcome.run(name)["status"]["phase"] == "Succeeded"
