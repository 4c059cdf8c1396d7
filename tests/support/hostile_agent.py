"""A hostile agent: from its own attempt Pod, with nothing but that Pod's service-account token, it tries
every write the security model forbids (against another Run of its namespace, and beyond its own rights
on its own Run), then commits what the API server answered to each as its result.

    input: {"victim": "<run name>", "victimAttempt": "<its current Attempt>"}

Run with PYTHONPATH=<repo>/tests: `python -m support.hostile_agent`.
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable
from typing import Any

from agentrun import worker
from agentrun.api import API_VERSION, RUN_LABEL, lease_name
from agentrun.kubeapi import ApiError, KubeApi

JsonDict = dict[str, Any]

# Every write the agent tries, and the cause the API server's refusal must name.
EXPECTED_CAUSES = {
    "victim result": "NotOwnRun",
    "victim result and leaseEpoch": "NotOwnRun",
    "victim phase": "NotOwnRun",
    "victim lease": "NotOwnRun",
    "victim lease renewal": "NotOwnRun",
    "victim checkpoint": "NotOwnRun",
    "victim side effect": "NotOwnRun",
    "victim attempt status": "NotOwnRun",
    "own phase": "NotWorkerField",
    "own side effect resolutionMessage": "NotWorkerField",
    "own side effect resolvedSends": "NotWorkerField",
    "own side effect inheritedFrom": "NotWorkerField",
    "own leaseEpoch": "NotWorkerField",
    "own expiresAt": "NotWorkerField",
    "own attempt phase": "NotWorkerField",
    "own lease duration": "NotWorkerField",
    "own checkpoint for another attempt": "NotCurrentAttempt",
}


def refusals_missing(outcomes: dict[str, str]) -> dict[str, str]:
    """The writes whose outcome is not a refusal naming the expected cause (empty: all refused)."""
    return {
        what: outcome
        for what, outcome in outcomes.items()
        if not (outcome.startswith("refused") and f"{EXPECTED_CAUSES.get(what)}:" in outcome)
    }


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def _outcome(write: Callable[[], Awaitable[Any]]) -> str:
    try:
        await write()
    except ApiError as exc:
        return f"refused {exc.status}: {exc.message}"
    return "accepted"


def _owned(name: str, run: str, uid: str) -> JsonDict:
    owner = {"apiVersion": API_VERSION, "kind": "Run", "name": run, "uid": uid}
    return {"name": name, "labels": {RUN_LABEL: run}, "ownerReferences": [owner]}


async def attacks(api: KubeApi, ctx: worker.Context, victim: str, victim_attempt: str) -> dict[str, str]:
    ns, me = ctx.namespace, ctx.attempt
    run = await api.get(api.custom_path("runs", ns, victim))
    assert run is not None, f"victim {victim} not found"
    stored = run["status"]
    forged = {
        "attempt": victim_attempt,
        "leaseEpoch": stored.get("leaseEpoch", 0),
        "cancelEpoch": run["spec"].get("cancelEpoch", 0),
    }
    victim_status = api.custom_path("runs", ns, victim, "status")
    own_status = api.custom_path("runs", ns, ctx.run_name, "status")
    uid = run["metadata"]["uid"]
    checkpoint: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "Checkpoint",
        "metadata": _owned(f"{victim_attempt}-s99", victim, uid),
        "spec": {
            "runName": victim,
            "id": f"{victim_attempt}-s99",
            "sequence": 99,
            "attempt": victim_attempt,
            "leaseEpoch": forged["leaseEpoch"],
            "state": {"forged": True},
        },
    }
    side_effect = {
        "apiVersion": API_VERSION,
        "kind": "SideEffect",
        "metadata": _owned("sfx-forged", victim, uid),
        "spec": {
            "runName": victim,
            "tool": "create_ticket",
            "idempotencyKey": f"{victim}-ticket",
            "reversible": True,
        },
    }
    other = f"{ctx.run_name}-a{ctx.attempt_number + 1}"  # an Attempt of its own Run that is not itself
    own_run = await api.get(api.custom_path("runs", ns, ctx.run_name))
    assert own_run is not None
    own_checkpoint = {
        **checkpoint,
        "metadata": _owned(f"{other}-s1", ctx.run_name, own_run["metadata"]["uid"]),
        "spec": {
            **checkpoint["spec"],
            "runName": ctx.run_name,
            "id": f"{other}-s1",
            "attempt": other,
            "sequence": 1,
        },
    }
    # Its own record, written through the ledger: a person's verdict on it is never the Pod's to write.
    own_effect = await ctx.side_effect(tool="noop", key="hostile-own", execute=lambda key: {"id": "own-1"})
    own_effect_status = api.custom_path("sideeffects", ns, own_effect.name, "status")
    writes: dict[str, Callable[[], Awaitable[Any]]] = {
        "own side effect resolutionMessage": lambda: api.merge_patch(
            own_effect_status, {"status": {"resolutionMessage": "forged"}}
        ),
        "own side effect resolvedSends": lambda: api.merge_patch(
            own_effect_status, {"status": {"resolvedSends": 0}}
        ),
        # only the operator marks a fork's inherited records: a Pod could otherwise pass off its own
        # action as its source's (never compensated by it)
        "own side effect inheritedFrom": lambda: api.merge_patch(
            own_effect_status,
            {"status": {"inheritedFrom": {"run": "victim", "uid": "forged", "record": "sfx-forged"}}},
        ),
        "victim result": lambda: api.merge_patch(
            victim_status, {"status": {"result": {"forged": True}, "committedBy": forged}}
        ),
        "victim result and leaseEpoch": lambda: api.merge_patch(
            victim_status,
            {
                "status": {
                    "result": {"forged": True},
                    "leaseEpoch": forged["leaseEpoch"] + 1,
                    "committedBy": {**forged, "leaseEpoch": forged["leaseEpoch"] + 1},
                }
            },
        ),
        "victim phase": lambda: api.merge_patch(victim_status, {"status": {"phase": "Failed"}}),
        "victim lease": lambda: api.merge_patch(
            api.lease_path(ns, lease_name(victim)),
            {"spec": {"holderIdentity": me, "leaseDurationSeconds": 3600}},
        ),
        "victim lease renewal": lambda: api.merge_patch(
            api.lease_path(ns, lease_name(victim)), {"spec": {"renewTime": _now()}}
        ),
        "victim checkpoint": lambda: api.create(api.custom_path("checkpoints", ns), checkpoint),
        "victim side effect": lambda: api.create(api.custom_path("sideeffects", ns), side_effect),
        "victim attempt status": lambda: api.merge_patch(
            api.custom_path("attempts", ns, victim_attempt, "status"),
            {"status": {"rejectedCommit": {"reason": "stale_worker", "message": "forged"}}},
        ),
        "own phase": lambda: api.merge_patch(own_status, {"status": {"phase": "Succeeded"}}),
        "own leaseEpoch": lambda: api.merge_patch(
            own_status, {"status": {"leaseEpoch": (own_run["status"].get("leaseEpoch") or 0) + 5}}
        ),
        "own expiresAt": lambda: api.merge_patch(
            own_status,
            {
                "status": {
                    "pendingRequest": {
                        "requestId": "r",
                        "reason": "input_required",
                        "checkpointId": "c",
                        "expiresAt": "2099-01-01T00:00:00Z",
                    }
                }
            },
        ),
        "own attempt phase": lambda: api.merge_patch(
            api.custom_path("attempts", ns, me, "status"), {"status": {"phase": "Succeeded"}}
        ),
        "own lease duration": lambda: api.merge_patch(
            api.lease_path(ns, lease_name(ctx.run_name)), {"spec": {"leaseDurationSeconds": 3600}}
        ),
        "own checkpoint for another attempt": lambda: api.create(
            api.custom_path("checkpoints", ns), own_checkpoint
        ),
    }
    return {what: await _outcome(write) for what, write in writes.items()}


async def agent(ctx: worker.Context) -> dict[str, Any]:
    api = KubeApi(threads=2)  # the Pod's own kubeconfig (KUBECONFIG): its bound service-account token
    try:
        outcomes = await attacks(api, ctx, ctx.input["victim"], ctx.input["victimAttempt"])
    finally:
        api.close()
    return {"outcomes": outcomes}


if __name__ == "__main__":
    worker.main(agent)
