"""A hostile agent: from its own attempt Pod, with nothing but that Pod's service-account token, it tries
every write the security model forbids (against another Run of its namespace, and beyond its own rights
on its own Run), then commits what the API server answered to each as its result.

    input: {"victim": "<run name>", "victimAttempt": "<its current Attempt>"}

With `store` it also writes against the state store with its own Pod's store credentials (those of its
namespace: get and put under the namespace's prefix, no delete), as any agent of the namespace can:
    input: {"victim": "<run name>", "store": {"mode": "replace" | "truncate", "checkpoint": "<id>"}}
        the blob the victim's Checkpoint `checkpoint` references is overwritten: other bytes of the same
        size (replace), or its first half (truncate)
    input: {"victim": "<run name>", "store": {"mode": "replace" | "truncate", "key": "<blob key>"}}
        the same for the blob at `key`, e.g. a LangGraph channel blob that only the victim's manifests name
    input: {"victim": "<run name>", "store": {"mode": "plant", "value": <JSON>}}
    input: {"victim": "<run name>", "store": {"mode": "plant", "bigState": {"outputs": N, "outputBytes": S,
            "by": "<attempt>"}}}
        garbage is planted at the predictable address of a blob the victim has not written yet: the
        content address of `value` (encoded as the SDK encodes state), or of the big-state agent's state
        after N outputs (support.big_state_agent), stamped by `by`
Without `victimAttempt` only the store writes are tried. The store's answers are in the result's
`storeWrites` (the store cannot refuse an overwrite by the namespace's own principal: the readers' digest
checks catch it), the keys written in `tampered`.

Run with PYTHONPATH=<repo>/tests: `python -m support.hostile_agent`.
"""

from __future__ import annotations

import datetime
import hashlib
import os
from collections.abc import Awaitable, Callable
from typing import Any

import obstore

from agentrun import worker
from agentrun.api import API_VERSION, RUN_LABEL, lease_name
from agentrun.kubeapi import ApiError, KubeApi
from agentrun.statestore import BlobStore, StoreTimeouts, parse_store_url
from agentrun.statestore.blobs import open_object_store
from agentrun.worker.blobs import STORE_URL_ENV, encode

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


def forged_bytes(original: bytes) -> bytes:
    """Other bytes of the same size: one letter changed, as a forger who wants the same length would."""
    for old, new in ((b"a", b"Z"), (b"e", b"Q"), (b"0", b"1")):
        if old in original:
            return original.replace(old, new, 1)
    return bytes(reversed(original)) if original != bytes(reversed(original)) else original + b" "


def big_state(outputs: int, size: int, by: str | None) -> dict[str, Any]:
    """The big-state agent's state after `outputs` steps (support.big_state_agent), as it will save it."""
    from support.big_state_agent import output  # noqa: PLC0415 (only the planting attack needs it)

    state: dict[str, Any] = {"outputs": [output(i, size) for i in range(outputs)], "fetched": None}
    if by is not None:
        state["by"] = by
    return state


async def store_attacks(api: KubeApi, ctx: worker.Context, victim: str, spec: dict[str, Any]) -> JsonDict:
    """Writes against the victim's blobs with this Pod's own store credentials: {storeWrites, tampered}."""
    url = os.environ[STORE_URL_ENV]  # told by the operator, as to every attempt Pod of the namespace
    location = parse_store_url(url)
    raw = open_object_store(location, StoreTimeouts(), os.environ)
    blobs = BlobStore(raw, location)
    ns = ctx.namespace
    run = await api.get(api.custom_path("runs", ns, victim))
    assert run is not None, f"victim {victim} not found"
    mode = spec["mode"]
    if mode == "plant":
        value = spec["value"] if "value" in spec else big_state(**_big_state_args(spec["bigState"]))
        data = encode(value)
        key = blobs.key_for(ns, run["metadata"]["uid"], hashlib.sha256(data).hexdigest())
        forged = b'{"planted":"by a hostile Pod of the namespace"}'
    else:
        if "key" in spec:  # a blob a document names (a LangGraph channel blob), found by the test
            key = spec["key"]
        else:
            checkpoint = await api.get(api.custom_path("checkpoints", ns, spec["checkpoint"]))
            assert checkpoint is not None, f"checkpoint {spec['checkpoint']} not found"
            key = checkpoint["spec"]["stateRef"]["key"]
        original = bytes(await (await obstore.get_async(raw, key)).bytes_async())
        forged = forged_bytes(original) if mode == "replace" else original[: len(original) // 2]
    writes: dict[str, str] = {}
    try:
        await obstore.put_async(raw, key, forged, use_multipart=False)
        writes[f"{mode} {key}"] = "accepted"
    except Exception as exc:  # what the store answered is the finding
        writes[f"{mode} {key}"] = f"refused: {type(exc).__name__}: {exc}"[:300]
    try:  # deleting is not the namespace principal's right
        await obstore.delete_async(raw, key)
        writes[f"delete {key}"] = "accepted"
    except Exception as exc:
        writes[f"delete {key}"] = f"refused: {type(exc).__name__}"
    tampered = [key] if writes[f"{mode} {key}"] == "accepted" else []
    return {"storeWrites": writes, "tampered": tampered}


def _big_state_args(spec: dict[str, Any]) -> dict[str, Any]:
    return {"outputs": int(spec["outputs"]), "size": int(spec["outputBytes"]), "by": spec.get("by")}


async def agent(ctx: worker.Context) -> dict[str, Any]:
    api = KubeApi(threads=2)  # the Pod's own kubeconfig (KUBECONFIG): its bound service-account token
    result: dict[str, Any] = {}
    try:
        if "victimAttempt" in ctx.input:
            result["outcomes"] = await attacks(api, ctx, ctx.input["victim"], ctx.input["victimAttempt"])
        if "store" in ctx.input:
            result |= await store_attacks(api, ctx, ctx.input["victim"], ctx.input["store"])
    finally:
        api.close()
    return result


if __name__ == "__main__":
    worker.main(agent)
