"""What waits for a person, read from the Runs and SideEffects the user can see: the inbox's items.

Plain functions of the stored objects (raw JSON, as the watches deliver them) and `now`. Everything an
agent wrote (prompts, tools, targets, schemas) is untrusted here: it is passed on as data, bounded, and
the page sets it as text.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agentrun.core.ledger import request_digest

JsonDict = dict[str, Any]
MAX_SCHEMA_DEPTH = 6  # deeper schemas get the raw JSON editor only: a form that deep helps nobody
MAX_SCHEMA_NODES = 400  # and so do huge ones (the CRD bounds the schema at 64 properties per level)
APPROVAL_PREFIX = "approve-"  # core.ledger.approval_request_id
RESOLVABLE_STATES = ("Unknown", "Pending")


def schema_for_form(schema: Any) -> Any:
    """The request's schema if a form may be built from it (an object, nested at most MAX_SCHEMA_DEPTH
    levels, with at most MAX_SCHEMA_NODES values), else None: then only the raw JSON editor is shown."""
    if not isinstance(schema, dict):
        return None
    nodes = 0
    stack: list[tuple[Any, int]] = [(schema, 0)]
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if depth > MAX_SCHEMA_DEPTH * 2 or nodes > MAX_SCHEMA_NODES:  # a level is "properties" + field
            return None
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
    return schema


def _name(obj: JsonDict) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _condition_time(run: JsonDict, kind: str) -> str | None:
    for condition in (run.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            return str(condition.get("lastTransitionTime") or "") or None
    return None


def _since(run: JsonDict) -> str:
    """When the Run began to wait: its Waiting condition, else its creation."""
    created = str((run.get("metadata") or {}).get("creationTimestamp") or "")
    return _condition_time(run, "Waiting") or created


def approval_check(request_id: str, action: Any) -> JsonDict:
    """What the approval shows and whether Approve may be offered: the digest the worker wrote must be
    the RFC 8785 digest of the action it shows, and the one the request id names."""
    if not isinstance(action, dict):
        return {
            "verified": False,
            "problem": "the agent did not describe the action (an SDK without pendingRequest.action): "
            "approve it from the command line once you have checked it there",
        }
    tool, target, claimed = action.get("tool"), action.get("target"), action.get("requestDigest")
    shown: JsonDict = {
        "tool": tool,
        "target": target,
        "idempotencyKey": action.get("idempotencyKey"),
        "requestDigest": claimed,
        "reversible": action.get("reversible"),
    }
    if "request" not in action:
        reference = action.get("requestRef") or action.get("reference")
        return {
            **shown,
            "reference": reference,
            "verified": False,
            "problem": "the request is stored by reference, not inline: the console cannot recompute its "
            "digest, so it does not offer Approve",
        }
    shown["request"] = action.get("request")
    try:
        recomputed = request_digest(str(tool), None if target is None else str(target), action.get("request"))
    except (TypeError, ValueError) as exc:
        return {**shown, "verified": False, "problem": f"the request cannot be digested: {exc}"}
    shown["recomputedDigest"] = recomputed
    if recomputed != claimed:
        return {
            **shown,
            "verified": False,
            "problem": "the digest the agent wrote is not the digest of the request it shows: "
            "do not approve; deny it and find out why",
        }
    suffix = f"-{recomputed.removeprefix('sha256:')[:16]}"
    if request_id.startswith(APPROVAL_PREFIX) and not request_id.endswith(suffix):
        return {
            **shown,
            "verified": False,
            "problem": f"request {request_id} asks to approve another request than the one shown",
        }
    return {**shown, "verified": True, "problem": None}


def _pending_item(run: JsonDict) -> JsonDict | None:
    status = run.get("status") or {}
    pending = status.get("pendingRequest")
    if not isinstance(pending, dict):
        return None
    namespace, name = _name(run)
    request_id = str(pending.get("requestId") or "")
    reason = str(pending.get("reason") or "")
    if reason == "paused":
        kind = "pause"
    elif reason == "auth_required" and request_id.startswith(APPROVAL_PREFIX):
        kind = "approval"
    else:
        kind = "question"
    item: JsonDict = {
        "id": f"{namespace}/{name}/{request_id}",
        "kind": kind,
        "namespace": namespace,
        "run": name,
        "phase": status.get("phase"),
        "requestId": request_id,
        "checkpointId": pending.get("checkpointId"),
        "reason": reason,
        "prompt": pending.get("prompt"),
        "since": _since(run),
        "expiresAt": pending.get("expiresAt"),
        "heldBy": pending.get("heldBy"),
    }
    if kind == "question":
        schema = pending.get("acceptedSchema")
        item["schema"] = schema
        item["formSchema"] = schema_for_form(schema)
    if kind == "approval":
        item["approval"] = approval_check(request_id, pending.get("action"))
    return item


def _effect_item(effect: JsonDict, run: JsonDict | None) -> JsonDict | None:
    spec, status = effect.get("spec") or {}, effect.get("status") or {}
    state = str(status.get("state") or "Pending")
    run_phase = ((run or {}).get("status") or {}).get("phase")
    # A Pending record is a send under way, unless its Run stopped to have it reconciled.
    if state == "Unknown" or (state == "Pending" and run_phase == "NeedsReconciliation"):
        namespace, name = _name(effect)
        history = status.get("history") or []
        return {
            "id": f"{namespace}/effect/{name}",
            "kind": "reconcile",
            "namespace": namespace,
            "run": spec.get("runName"),
            "phase": run_phase,
            "effect": name,
            "state": state,
            "reason": "unknown outcome",
            "prompt": None,
            "since": (history[-1].get("time") if history else None)
            or (effect.get("metadata") or {}).get("creationTimestamp"),
            "tool": spec.get("tool"),
            "target": spec.get("target"),
            "idempotencyKey": spec.get("idempotencyKey"),
            "requestDigest": spec.get("requestDigest"),
            "reversible": spec.get("reversible"),
            "maxSends": spec.get("maxSends"),
            "sends": status.get("sends") or [],
            "history": history[-10:],
            "conflict": status.get("conflict"),
        }
    return None


def _retry_item(run: JsonDict) -> JsonDict:
    """A Run that stopped for reconciliation and has no unknown outcome left: it waits for a retry."""
    namespace, name = _name(run)
    status = run.get("status") or {}
    return {
        "id": f"{namespace}/{name}/retry",
        "kind": "retry",
        "namespace": namespace,
        "run": name,
        "phase": status.get("phase"),
        "reason": "reconciled: retry it",
        "prompt": status.get("message"),
        "since": _since(run),
    }


def items(runs: Iterable[JsonDict], effects: Iterable[JsonDict]) -> list[JsonDict]:
    """Every request waiting for a person, newest first."""
    by_name = {_name(r): r for r in runs}
    out: list[JsonDict] = []
    open_effects: set[tuple[str, str]] = set()
    for effect in effects:
        namespace = _name(effect)[0]
        run = by_name.get((namespace, str((effect.get("spec") or {}).get("runName") or "")))
        if (item := _effect_item(effect, run)) is not None:
            out.append(item)
            open_effects.add((namespace, str(item["run"])))
    for key, run in by_name.items():
        if (item := _pending_item(run)) is not None:
            out.append(item)
        elif (run.get("status") or {}).get("phase") == "NeedsReconciliation" and key not in open_effects:
            out.append(_retry_item(run))
    out.sort(key=lambda i: (str(i.get("since") or ""), str(i["id"])), reverse=True)
    return out
