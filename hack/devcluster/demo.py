"""`make demo`: agentrun's promises, narrated, on the embedded local control plane.

1. A ticket agent plans, asks a person for the priority (interrupt), gets the answer (resume), opens a
   ticket in an external service exactly once (side-effect ledger) and commits its result.
2. A Run is cancelled in the middle of a step: the agent stops fast, a late commit would be refused.
3. A worker is killed between the external call and its confirmation: the next Attempt finds the
   ticket by its idempotency key instead of opening a second one.
4. A LangGraph agent (agentrun.integrations.langgraph) asks, is answered, opens its ticket through the
   ledger and is killed: the next Attempt continues from LangGraph's last checkpoint, no second ticket,
   no node run twice.
5. A create that times out is looked up by its key and found (never sent again); and a Run with
   spec.compensation.onCancel: Compensate is cancelled after opening its ticket: a compensation Attempt
   closes the ticket, once, and the Run ends Cancelled with the ticket reported as compensated.
6. A LangGraph research agent reads twelve 40 KB documents (the ordinary message list: half a megabyte,
   more than a Kubernetes object may hold): its checkpoints go to the object store, the cluster keeps
   references; killed mid-way, it finishes with every document in its state, each read to its end once.
Each Run ends with `kubectl agentrun report`. Everything started here stops on exit or Ctrl-C.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from agentrun.api import AGENT_LABEL
from agentrun.examples.manifests import agent_run
from agentrun.examples.ticket_agent import ticket_key
from agentrun.rbac import attempt_role

from . import security
from .cluster import REPO_ROOT, LocalCluster
from .operator import OperatorProcess
from .tickets import TicketServiceProcess

NAMESPACE = "demo"
BOLD, DIM, GREEN, RESET = ("\033[1m", "\033[2m", "\033[32m", "\033[0m") if sys.stdout.isatty() else ("",) * 4


def say(text: str) -> None:
    print(f"\n{BOLD}{textwrap.dedent(text).strip()}{RESET}", flush=True)


class Demo:
    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}

    def sh(self, *argv: str, stdin: str | None = None, show: bool = True, check: bool = True) -> str:
        """Runs a command a user would type, shows it and its output."""
        shown = " ".join(argv)
        if show:
            print(f"{GREEN}$ {shown}{RESET}", flush=True)
        exe = self.cluster.binary("kubectl") if argv[0] == "kubectl" else argv[0]
        if argv[0] == "kubectl-agentrun":
            command = [sys.executable, "-m", "agentrun.cli", *argv[1:]]
        else:
            command = [exe, *argv[1:]]
        out = subprocess.run(command, input=stdin, capture_output=True, text=True, env=self.env, check=False)
        if show and (out.stdout.strip() or out.stderr.strip()):
            print(textwrap.indent((out.stdout + out.stderr).rstrip(), "  "), flush=True)
        if check and out.returncode != 0:
            raise RuntimeError(f"{shown} failed: {out.stderr}")
        return out.stdout

    def run_json(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(
            self.sh("kubectl", "get", "run", name, "-n", NAMESPACE, "-o", "json", show=False)
        )
        return result

    def side_effects(self, run: str) -> list[dict[str, Any]]:
        owned_by = f"agentrun.dev/run={run}"
        listed = self.sh(
            "kubectl", "get", "sideeffects", "-n", NAMESPACE, "-l", owned_by, "-o", "json", show=False
        )
        items: list[dict[str, Any]] = json.loads(listed)["items"]
        return items

    def wait(self, what: str, probe: Callable[[], Any], timeout: float = 180) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if value := probe():
                return value
            time.sleep(0.3)
        raise RuntimeError(f"timed out waiting for {what}")

    def wait_phase(self, name: str, *phases: str) -> dict[str, Any]:
        print(f"{DIM}  ... waiting for run/{name} to be {' or '.join(phases)}{RESET}", flush=True)
        run: dict[str, Any] = self.wait(
            f"{name} in {phases}",
            lambda: (run := self.run_json(name)) and run.get("status", {}).get("phase") in phases and run,
        )
        return run

    def apply(self, manifest: dict[str, Any]) -> None:
        self.sh("kubectl", "apply", "-n", NAMESPACE, "-f", "-", stdin=yaml.safe_dump(manifest))


def ticket_run(name: str, tickets: TicketServiceProcess, **scenario: Any) -> dict[str, Any]:
    return agent_run(
        name,
        "ticket_agent",
        {"title": "Printer on fire", "body": "Third floor, next to the kitchen", **scenario},
        env=tickets.env(),
        retry={"maxAttempts": 3, "backoff": {"initialSeconds": 1, "factor": 2.0, "maxSeconds": 5}},
    )


@contextlib.contextmanager
def environment(state_dir: Path) -> Iterator[tuple[Demo, TicketServiceProcess, OperatorProcess]]:
    shutil.rmtree(state_dir, ignore_errors=True)
    cluster = LocalCluster(state_dir=state_dir)
    tickets = TicketServiceProcess(state_dir / "tickets.json", state_dir / "logs" / "tickets.log")
    operator: OperatorProcess | None = None
    try:
        say("Starting the local control plane: etcd, apiserver, controller-manager, scheduler, node agent")
        began = time.monotonic()
        cluster.start()
        print(f"  healthy in {time.monotonic() - began:.1f}s; logs in {state_dir / 'logs'}")
        demo = Demo(cluster)
        say("Installing the agentrun CRDs and a namespace whose agents may do what an attempt Pod does")
        demo.sh("kubectl", "apply", "--server-side", "-f", str(REPO_ROOT / "crds"))
        demo.sh("kubectl", "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        demo.sh("kubectl", "create", "namespace", NAMESPACE)
        demo.wait(
            "the default service account",
            lambda: demo.sh("kubectl", "get", "sa", "default", "-n", NAMESPACE, show=False, check=False),
        )
        demo.sh("kubectl", "label", "serviceaccount", "default", "-n", NAMESPACE, f"{AGENT_LABEL}=true")
        demo.apply(attempt_role(NAMESPACE))
        demo.sh(
            "kubectl",
            "create",
            "rolebinding",
            "agentrun-attempt",
            "-n",
            NAMESPACE,
            "--role=agentrun-attempt",
            f"--serviceaccount={NAMESPACE}:default",
        )
        # the namespace's credentials for the cluster's object store, which its attempt Pods read
        demo.apply(security.state_store_secret(NAMESPACE, cluster.namespace_store_env(NAMESPACE)))
        say("Starting the external ticket service (the world outside) and the agentrun operator")
        tickets.start()
        print(f"  ticket service at {tickets.url}")
        say("Running the operator as its own ServiceAccount, with the admission policies that fence Pods")
        operator_kubeconfig = security.install(
            cluster.binary("kubectl"), cluster.kubeconfig, state_dir / "operator.kubeconfig"
        )
        operator = OperatorProcess(
            operator_kubeconfig,
            state_dir / "logs" / "operator.log",
            # the cluster's object store, as `make operator` and the tests have it (the namespace's Secret
            # is made above, so the operator is not told to make it)
            env={**security.OPERATOR_ENV, **security.local_store_operator_env(cluster, provision=False)},
        )
        operator.start()
        operator.wait_ready()
        print(f"  operator running (log: {operator.log_path})")
        yield demo, tickets, operator
    finally:
        if operator:
            operator.stop()
        tickets.stop()
        cluster.stop()


def act_one(demo: Demo, tickets: TicketServiceProcess) -> None:
    say("1. Interrupt and resume: the agent asks a person for the priority before it opens a ticket")
    demo.apply(ticket_run("triage", tickets))
    run = demo.wait_phase("triage", "InputRequired", "Failed")
    demo.sh("kubectl", "get", "runs", "-n", NAMESPACE)
    pending = run["status"]["pendingRequest"]
    print(f"  the Run waits at checkpoint {pending['checkpointId']}: {pending['prompt']}")
    print("  the worker was released: its Attempt ended Interrupted, no Pod is running")
    say("An answer that does not match the request's schema is refused, and the Run does not move")
    demo.sh(
        "kubectl-agentrun",
        "resume",
        "triage",
        "-n",
        NAMESPACE,
        "--value",
        '{"priority": "urgent"}',
        check=False,
    )
    say("Plain kubectl works too; an answer to the wrong request is refused and recorded with a reason")
    wrong = {
        "resume": {
            "requestId": "triage-r9",
            "checkpointId": pending["checkpointId"],
            "value": {"priority": "low"},
            "idempotencyKey": "wrong-request",
        }
    }
    demo.sh(
        "kubectl",
        "patch",
        "run",
        "triage",
        "-n",
        NAMESPACE,
        "--type",
        "merge",
        "-p",
        json.dumps({"spec": wrong}),
    )
    refusal = demo.wait(
        "the refusal",
        lambda: next(
            (
                c
                for c in demo.run_json("triage")["status"].get("controls", [])
                if c["idempotencyKey"] == "wrong-request"
            ),
            None,
        ),
    )
    print(f"  status.controls: {refusal['outcome']} {refusal['reason']}: {refusal['message']}")
    say("The right answer resumes the same Run from the same checkpoint")
    demo.sh("kubectl-agentrun", "resume", "triage", "-n", NAMESPACE, "--value", '{"priority": "high"}')
    demo.wait_phase("triage", "Succeeded", "Failed")
    demo.sh("kubectl", "get", "attempts", "-n", NAMESPACE, "-l", "agentrun.dev/run=triage")
    print(f"  tickets in the external service: {[t['id'] + ' ' + t['title'] for t in tickets.tickets()]}")
    demo.sh("kubectl-agentrun", "report", "triage", "-n", NAMESPACE)


def act_two(demo: Demo) -> None:
    say("2. Cancel in the middle of a step: the agent stops fast, and nothing after the cancel counts")
    demo.apply(agent_run("long-task", "scenario", {"steps": 20, "stepSeconds": 1.0}))
    demo.wait(
        "a checkpoint of long-task",
        lambda: demo.run_json("long-task").get("status", {}).get("latestCheckpoint"),
    )
    began = time.monotonic()
    demo.sh("kubectl-agentrun", "cancel", "long-task", "-n", NAMESPACE)
    run = demo.wait_phase("long-task", "Cancelled")
    print(f"  Cancelled {time.monotonic() - began:.1f}s after the cancel; the attempt was stopped mid-step")
    print(
        f"  cancel epoch now {run['spec']['cancelEpoch']}: a late "
        "commit from the old worker would carry epoch 0 and be refused (stale_after_cancel)"
    )
    demo.sh("kubectl-agentrun", "report", "long-task", "-n", NAMESPACE)


def act_three(demo: Demo, tickets: TicketServiceProcess) -> None:
    say("3. Crash between the external call and its confirmation: no second ticket")
    tickets.set_faults(holdCreates=True)  # the service stores each ticket, then holds its answer
    demo.apply(ticket_run("crash", tickets, askPriority=False))
    key = ticket_key(NAMESPACE, "crash")
    demo.wait(
        "the ticket call in flight", lambda: any(e["idempotencyKey"] == key for e in tickets.in_flight())
    )
    pod = _worker_pod(demo, "crash-a1")
    print(
        "  the ticket service has stored the ticket but not answered yet; the ledger says Pending: "
        f"killing {pod[0]} (pid {pod[1]})"
    )
    os.killpg(pod[1], signal.SIGKILL)
    tickets.clear_faults()
    demo.wait_phase("crash", "Succeeded", "Failed", "NeedsReconciliation")
    demo.sh("kubectl", "get", "attempts", "-n", NAMESPACE, "-l", "agentrun.dev/run=crash")
    demo.sh("kubectl-agentrun", "effects", "crash", "-n", NAMESPACE)
    created = [e for e in tickets.audit() if e["event"] == "created" and e["idempotencyKey"] == key]
    print(f"  tickets the service created for this Run: {len(created)} (from its own audit log)")
    demo.sh("kubectl-agentrun", "report", "crash", "-n", NAMESPACE)


# The LangGraph ticket agent's path through its graph: every superstep must end exactly once.
LANGGRAPH_PATH = ["triage", "agent", "tools", "agent"]


def act_four(demo: Demo, tickets: TicketServiceProcess, state_dir: Path) -> None:
    say("4. A LangGraph agent, durable: its checkpoints are the Run's, its tool goes through the ledger")
    nodes = state_dir / "langgraph-nodes.log"
    env = {**tickets.env(), "AGENTRUN_NODE_LOG": str(nodes)}
    spec = {"title": "Coffee machine leaks", "body": "Second floor", "holdAfterTicket": [2]}
    retry = {"maxAttempts": 3, "backoff": {"initialSeconds": 1, "factor": 1.0, "maxSeconds": 1}}
    demo.apply(agent_run("graph", "langgraph_agent", spec, env=env, retry=retry))
    run = demo.wait_phase("graph", "InputRequired", "Failed")
    print(f"  the graph's interrupt() is the Run's question: {run['status']['pendingRequest']['prompt']}")
    demo.sh("kubectl-agentrun", "resume", "graph", "-n", NAMESPACE, "--value", '{"priority": "normal"}')

    def confirmed() -> bool:
        effects = demo.side_effects("graph")
        return any((e.get("status") or {}).get("state") == "Confirmed" for e in effects)

    demo.wait("the ticket confirmed in the ledger", confirmed)
    pod = _worker_pod(demo, "graph-a2")
    print(
        f"  the tool's ticket is confirmed in the ledger; killing {pod[0]} (pid {pod[1]}) before it returns"
    )
    os.killpg(pod[1], signal.SIGKILL)
    demo.wait_phase("graph", "Succeeded", "Failed", "NeedsReconciliation")
    demo.sh("kubectl", "get", "attempts", "-n", NAMESPACE, "-l", "agentrun.dev/run=graph")
    demo.sh("kubectl", "get", "checkpoints", "-n", NAMESPACE, "-l", "agentrun.dev/run=graph")
    created = [
        e for e in tickets.audit() if e["event"] == "created" and e["idempotencyKey"].startswith("graph.")
    ]
    print(f"  tickets the service created for the LangGraph Run: {len(created)}")
    runs = [line.split() for line in nodes.read_text().splitlines()]
    ended = [node for _, event, node in runs if event == "end"]
    again = [node for a, event, node in runs if event == "start" and a.endswith("-a3")]
    print(f"  supersteps that ran to their end: {' -> '.join(ended)}")
    print(f"  after the kill, Attempt 3 ran only: {', '.join(again)} (what was checkpointed never ran again)")
    print(f"  each superstep ran to its end once: {ended == LANGGRAPH_PATH}")
    demo.sh("kubectl-agentrun", "report", "graph", "-n", NAMESPACE)


def act_five(demo: Demo, tickets: TicketServiceProcess) -> None:
    say("5. A create that times out is found by lookup; a cancel undoes the ticket by its compensation")
    # The service stores the ticket, then answers after the client gave up waiting: the outcome is unknown.
    # (The client waits 5 s, time enough for a busy machine's service to store the ticket and to answer
    # the lookup that follows; the answer comes 10 s after the create.)
    tickets.set_faults(delayCreateSeconds=10)
    scenario = {"title": "Coffee machine leaks", "body": "Second floor", "askPriority": False}
    env = {**tickets.env(), "TICKET_SERVICE_TIMEOUT": "5"}
    demo.apply(agent_run("slow", "ticket_agent", scenario, env=env))
    demo.wait_phase("slow", "Succeeded", "Failed", "NeedsReconciliation")
    tickets.clear_faults()
    demo.sh("kubectl-agentrun", "effects", "slow", "-n", NAMESPACE)
    [effect] = demo.side_effects("slow")
    found, sends = effect["status"]["history"][-1]["message"], len(effect["status"]["sends"])
    print(f"  the timed-out create was {found}; sends: {sends}")

    undo = agent_run(
        "undo",
        "ticket_agent",
        {"title": "Wrong ticket", "body": "opened by mistake", "askPriority": False, "askAfterTicket": True},
        env=tickets.env(),
        compensation={"onCancel": "Compensate"},
    )
    demo.apply(undo)
    demo.wait_phase("undo", "InputRequired", "Failed")
    print(
        "  the ticket is open and the Run waits for a note; cancelling it (compensation.onCancel: Compensate)"
    )
    demo.sh("kubectl-agentrun", "cancel", "undo", "--reason", "opened by mistake", "-n", NAMESPACE)
    demo.wait_phase("undo", "Cancelled", "NeedsReconciliation")
    demo.sh("kubectl", "get", "attempts", "-n", NAMESPACE, "-l", "agentrun.dev/run=undo")
    demo.sh("kubectl-agentrun", "effects", "undo", "-n", NAMESPACE)
    closes = [
        e
        for e in tickets.audit()
        if e["event"] in ("closed", "close-repeated") and e["idempotencyKey"] == ticket_key(NAMESPACE, "undo")
    ]
    print(f"  tickets closed by the compensation: {len(closes)} (from the service's audit log)")
    demo.sh("kubectl-agentrun", "report", "undo", "-n", NAMESPACE)


def act_six(demo: Demo, state_dir: Path) -> None:
    say("6. Agent state outside etcd: a research agent reads twelve 40 KB documents and is killed mid-way")
    reads = state_dir / "research-reads.log"
    spec = {"documents": 12, "documentBytes": 40_000, "holdAt": [1, 7]}
    retry = {"maxAttempts": 3, "backoff": {"initialSeconds": 1, "factor": 1.0, "maxSeconds": 1}}
    env = {"AGENTRUN_TOOL_LOG": str(reads)}
    demo.apply(agent_run("research", "research_agent", spec, env=env, retry=retry))
    demo.wait(
        "the read of document 7 under way",
        lambda: reads.exists() and "research-a1 start 7" in reads.read_text().splitlines(),
        timeout=180,
    )
    pod = _worker_pod(demo, "research-a1")
    print(f"  seven documents read (280 KB of messages); killing {pod[0]} (pid {pod[1]}) amid the 8th")
    os.killpg(pod[1], signal.SIGKILL)
    run = demo.wait_phase("research", "Succeeded", "Failed", "NeedsReconciliation")
    demo.sh("kubectl", "get", "attempts", "-n", NAMESPACE, "-l", "agentrun.dev/run=research")
    latest = run["status"].get("latestCheckpoint", "")
    checkpoint = json.loads(
        demo.sh("kubectl", "get", "checkpoint", latest, "-n", NAMESPACE, "-o", "json", show=False)
    )
    stored = checkpoint["spec"].get("stateRef")
    where = "inline"
    if stored:
        where = f"{stored['size']} bytes in the object store, sha256 {stored['sha256'][:12]}…"
    size = len(json.dumps(checkpoint))
    print(f"  its latest checkpoint object is {size} bytes; the state it names: {where}")
    result = run["status"].get("result") or {}
    print(f"  documents in the final state: {result.get('documents')} ({result.get('bytes')} bytes)")
    lines = [line.split() for line in reads.read_text().splitlines()]
    ended = [int(number) for _, event, number in lines if event == "end"]
    print(f"  every document read to its end once: {sorted(ended) == list(range(12))}")


def _worker_pod(demo: Demo, name: str) -> tuple[str, int]:
    pod = json.loads(demo.sh("kubectl", "get", "pod", name, "-n", NAMESPACE, "-o", "json", show=False))
    container_id = pod["status"]["containerStatuses"][0]["containerID"]
    return pod["metadata"]["name"], int(container_id.removeprefix("process://"))


def main(state_dir: Path) -> int:
    try:
        with environment(state_dir) as (demo, tickets, _operator):
            act_one(demo, tickets)
            act_two(demo)
            act_three(demo, tickets)
            act_four(demo, tickets, state_dir)
            act_five(demo, tickets)
            act_six(demo, state_dir)
            say("Done. Every process started by the demo stops now.")
    except KeyboardInterrupt:
        print("\ninterrupted: stopping everything the demo started", file=sys.stderr)
        return 130
    return 0
