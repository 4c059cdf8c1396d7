"""Restart safety on the real API server: the real Executor carries out each decision's Plan, an operator
"crash" stops it after the N-th write of a grant, a takeover, a cancel or a resume, and the next decision
sees a World rebuilt from what the API server holds (as an operator restarted with an empty cache). Each
story must end exactly as it does without a crash: no epoch skipped or reused, no Attempt created twice,
no history rewritten.

The attempt Pods are never scheduled (a nodeSelector no node matches): the test writes their status as
their kubelet would, and plays the worker (its request) and the user (cancel, resume) through the API.
It runs on the namespaced control plane (conftest.py), where no operator watches the whole cluster: one
would decide these Runs too, and every crash point would become a race with it.
The in-memory simulation that kills the operator between any two writes of whole Runs is
tests/unit/test_core_runs_simulation.py.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentrun.api import API_VERSION, GROUP, RUN_LABEL, VERSION, Attempt, Run, lease_name
from agentrun.clock import SystemClock
from agentrun.core.identity import owned_by
from agentrun.core.lease import lease_view
from agentrun.core.plan import Plan, RecordEvent
from agentrun.core.pods import pod_view
from agentrun.core.runs import World, decide
from agentrun.kubeapi import KubeApi, load_configuration
from agentrun.operator.cache import OwnedObjects
from agentrun.operator.executor import Executor, Superseded
from support.kube import Kube

pytestmark = pytest.mark.cluster
JsonDict = dict[str, Any]
RUN = "crashy"


HEALTHY, EXPIRED = 30.0, -1.0  # the operator's judgement of the holder's Lease (its own clock)
CHECKPOINT = f"{RUN}-a1-s1"
REQUEST = {"requestId": "q-1", "reason": "input_required", "checkpointId": CHECKPOINT}


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Cluster:
    """The real API server, as an operator (its own identity, under the admission policies) and the world
    around it (the admin) see it."""

    def __init__(self, kube: Kube, namespace: str, operator_kubeconfig: Path) -> None:
        self.kube, self.ns = kube, namespace
        self.api = KubeApi(load_configuration(str(operator_kubeconfig)), threads=2)
        self.expires_in = HEALTHY

    # ---- the operator ------------------------------------------------------------------------------

    async def world(self) -> tuple[Run, World]:
        """The Run and what it owns, read from the API server (nothing remembered between decisions)."""
        api, ns = self.api, self.ns
        body = await api.get(api.custom_path("runs", ns, RUN))
        assert body is not None
        run = Run.model_validate(body)
        uid = str(run.metadata.uid)

        async def owned(path: str) -> list[JsonDict]:
            listed = await api.request("GET", path, query={"labelSelector": f"{RUN_LABEL}={RUN}"})
            return [o for o in listed["items"] if owned_by(o, uid, controller=True)]

        attempts = [Attempt.model_validate(o) for o in await owned(api.custom_path("attempts", ns))]
        pods = [pod_view(o) for o in await owned(api.core_path("pods", ns))]
        lease_body = await api.get(api.lease_path(ns, lease_name(RUN)))
        lease = lease_view(lease_body) if lease_body and owned_by(lease_body, uid, controller=True) else None
        world = World(
            run=run,
            attempts={a.spec.number: a for a in attempts},
            pods={p.name: p for p in pods},
            lease=lease,
            now=datetime.datetime.now(datetime.UTC),
            lease_expires_in=self.expires_in if lease is not None else None,
        )
        return run, world

    async def execute(self, plan: Plan, run: Run) -> None:
        """One operator life's Executor, with an empty cache: it knows only what the API server says."""
        clock = SystemClock()
        await Executor(self.api, OwnedObjects(clock), clock=clock).execute(plan, run)

    async def settle(self) -> None:
        """Reconciles until a decision asks for no write (the Run rests until something happens)."""
        for _ in range(12):
            run, world = await self.world()
            plan = decide(world)
            if not writes(plan):
                return
            try:
                await self.execute(plan, run)
            except Superseded:
                continue
        raise AssertionError("the Run did not come to rest")

    # ---- the world around it: the kubelet, the worker, the user --------------------------------------

    def create_run(self) -> None:
        spec = {
            "agent": {
                "image": "agent:test",
                "command": ["python", "-m", "agent"],
                "podTemplate": {"spec": {"nodeSelector": {"agentrun.dev/test-node": "none"}}},
            },
            # A retry never comes due during the test: the stories end in RetryBackoff at most.
            "retry": {"backoff": {"initialSeconds": 3600, "maxSeconds": 3600}},
            # Its Pods never run on a node (no log to keep): the stories are about grants, not Pod collection.
            "podGC": "Never",
        }
        body = {"apiVersion": API_VERSION, "kind": "Run", "metadata": {"name": RUN}, "spec": spec}
        self.kube.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, "runs", body)

    def pod_status(self, attempt: str, state: JsonDict, phase: str) -> None:
        agent = {"name": "agent", "image": "agent:test", "imageID": "", "ready": False, "restartCount": 0}
        status = {"phase": phase, "containerStatuses": [{**agent, "state": state}]}
        self.kube.core.patch_namespaced_pod_status(attempt, self.ns, {"status": status})

    def agent_runs(self, attempt: str) -> None:
        self.pod_status(attempt, {"running": {"startedAt": _now()}}, "Running")

    def agent_exits(self, attempt: str, code: int) -> None:
        ended = {"terminated": {"exitCode": code, "startedAt": _now(), "finishedAt": _now()}}
        self.pod_status(attempt, ended, "Succeeded" if code == 0 else "Failed")

    def run_status(self, status: JsonDict) -> None:
        self.kube.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, self.ns, "runs", RUN, {"status": status}
        )

    def run_spec(self, spec: JsonDict) -> None:
        self.kube.custom.patch_namespaced_custom_object(GROUP, VERSION, self.ns, "runs", RUN, {"spec": spec})

    # ---- what it holds in the end ------------------------------------------------------------------

    def summary(self) -> JsonDict:
        run = self.kube.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, "runs", RUN)
        status = run["status"]
        listed = self.kube.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.ns, "attempts", label_selector=f"{RUN_LABEL}={RUN}"
        )["items"]
        attempts = sorted(
            (
                a["spec"]["number"],
                a["spec"]["reason"],
                a["spec"]["leaseEpoch"],
                a["spec"].get("input"),
                (a.get("status") or {}).get("phase"),
            )
            for a in listed
        )
        held = self.kube.get("lease", lease_name(RUN), self.ns)  # a finished Run's Lease is deleted
        lease = (held or {}).get("spec") or {}
        pods = self.kube.core.list_namespaced_pod(self.ns, label_selector=f"{RUN_LABEL}={RUN}").items
        accepted = [c["op"] for c in status.get("controls") or [] if c["outcome"] == "Accepted"]
        return {
            "phase": status["phase"],
            "run": (status.get("currentAttempt"), status.get("attempts"), status.get("leaseEpoch")),
            "attempts": attempts,
            "lease": (lease.get("holderIdentity"), lease.get("leaseTransitions")) if held else None,
            "pods": sorted(p.metadata.name for p in pods if not p.metadata.deletion_timestamp),
            "accepted": accepted,
        }


def writes(plan: Plan) -> list[str]:
    return [type(a).__name__ for a in plan.actions if not isinstance(a, RecordEvent)]


def crashed_after(plan: Plan, n: int) -> Plan:
    """The part of the Plan an operator carried out before it died right after its n-th write."""
    done, kept = 0, []
    for action in plan.actions:
        if done == n:
            break
        kept.append(action)
        done += not isinstance(action, RecordEvent)
    return Plan(kept)


async def _running(c: Cluster) -> None:
    """Attempt 1 granted and its agent running."""
    c.create_run()
    await c.settle()
    c.agent_runs(f"{RUN}-a1")
    await c.settle()


async def _new(c: Cluster) -> None:
    c.create_run()


async def _lease_ran_out(c: Cluster) -> None:
    await _running(c)
    c.expires_in = EXPIRED


async def _cancelled(c: Cluster) -> None:
    await _running(c)
    c.run_spec({"cancelEpoch": 1})


async def _cancel_requested(c: Cluster) -> None:
    await _cancelled(c)
    run, world = await c.world()
    await c.execute(decide(world), run)  # CancelRequested, its Pod stopped: gone, as it was never scheduled


async def _answered(c: Cluster) -> None:
    """Attempt 1 asked a question and ended; the answer arrives."""
    await _running(c)
    c.run_status({"latestCheckpoint": CHECKPOINT, "pendingRequest": REQUEST})
    c.agent_exits(f"{RUN}-a1", 0)
    await c.settle()
    resume = {"requestId": "q-1", "checkpointId": CHECKPOINT, "value": {"ok": True}, "idempotencyKey": "k-1"}
    c.run_spec({"resume": resume})


@dataclass(frozen=True)
class Story:
    """Reach the decision of interest (`prepare`), which must ask for `decision`; then crash in it."""

    prepare: Callable[[Cluster], Awaitable[None]]
    decision: list[str]
    end: JsonDict


GRANTED = {
    "phase": "Running",
    "run": (1, 1, 1),
    "attempts": [(1, "initial", 1, None, None)],
    "lease": (f"{RUN}-a1", 1),
    "pods": [f"{RUN}-a1"],
    "accepted": [],
}
STORIES = {
    "grant": Story(_new, ["WriteLease", "PatchRunStatus", "CreateAttempt", "CreatePod"], GRANTED),
    "takeover": Story(
        _lease_ran_out,
        ["WriteLease", "PatchRunStatus", "DeletePod", "PatchAttemptStatus"],
        {
            **GRANTED,
            "phase": "RetryBackoff",
            "run": (1, 1, 2),
            "attempts": [(1, "initial", 1, None, "LeaseLost")],
            "lease": (None, 2),
            "pods": [],
        },
    ),
    # A Cancelled Run's Lease is deleted once it has settled (no state store here: the Lease only).
    "cancel": Story(
        _cancelled,
        ["PatchRunStatus", "DeletePod"],
        {
            **GRANTED,
            "phase": "Cancelled",
            "attempts": [(1, "initial", 1, None, "Aborted")],
            "pods": [],
            "lease": None,
        },
    ),
    "cancel-finishing": Story(
        _cancel_requested,
        ["PatchAttemptStatus", "PatchRunStatus"],
        {
            **GRANTED,
            "phase": "Cancelled",
            "attempts": [(1, "initial", 1, None, "Aborted")],
            "pods": [],
            "lease": None,
        },
    ),
    "resume": Story(
        _answered,
        ["DeletePod", "WriteLease", "PatchRunStatus", "CreateAttempt", "CreatePod"],
        {
            "phase": "Running",
            "run": (2, 2, 2),
            "attempts": [(1, "initial", 1, None, "Interrupted"), (2, "resume:q-1", 2, {"ok": True}, None)],
            "lease": (f"{RUN}-a2", 2),
            "pods": [f"{RUN}-a2"],
            "accepted": ["Resume"],
        },
    ),
}
CRASHES = {
    f"{name}-after-{n}-of-{len(story.decision)}-writes": (story, n)
    for name, story in STORIES.items()
    for n in range(len(story.decision))  # 0: the decision carried out whole, the story as it should end
}


@pytest.mark.parametrize(("story", "crash_after"), CRASHES.values(), ids=CRASHES.keys())
def test_an_operator_restarted_mid_decision_ends_the_story_the_same(
    kube: Kube, namespace: str, operator_kubeconfig: Path, story: Story, crash_after: int
) -> None:
    cluster = Cluster(kube, namespace, operator_kubeconfig)

    async def play() -> None:
        await story.prepare(cluster)
        run, world = await cluster.world()
        plan = decide(world)
        assert writes(plan) == story.decision
        if crash_after:
            await cluster.execute(crashed_after(plan, crash_after), run)
        else:
            await cluster.execute(plan, run)
        await cluster.settle()  # a new operator life, from what the API server holds

    asyncio.run(play())

    assert cluster.summary() == story.end
