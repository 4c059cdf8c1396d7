"""A forked Run's LangGraph thread (spec.forkFrom), without I/O: what the saver makes of the checkpoint the
operator copied from the source.

The operator starts a fork from its own copy of the source's State checkpoint (`<fork>-a0-s<sequence>`,
spec.copiedFrom): the source's thread, its state as it is (a `stateRef` still names the source's manifest,
shared by digest). The fork's graph runs on the fork's own thread (thread id = the fork Run), so the saver
continues from that copy by saving the **fork root**: the same LangGraph checkpoint (same checkpoint id,
same manifest, never copied) as a State checkpoint of the fork's thread, named as the saver names every
checkpoint, whose parent is the copy. From there the graph goes on as in any Run: its next checkpoints
name the root as their parent, and unchanged channels keep naming the source's blobs.

The root is the fork thread's first checkpoint: it records no LangGraph parent (the source's ancestors
are not the fork's), the pending writes of the source's checkpoint are not carried (the tasks after it
run again in the fork, and their effects, opened after the checkpoint's ledger mark, are the fork's own),
and a delta channel's walk ends at the root (a checkpoint rebuilt from its ancestors' deltas is refused
by the operator before any Attempt).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from agentrun.api import API_VERSION, CheckpointKind

JsonDict = dict[str, Any]

# What a LangGraph State checkpoint's pointers are (spec.state when saved inline, else its manifest's header).
POINTERS: Final = ("checkpointId", "deltaSeeds")  # in a manifest, its header
INLINE: Final = ("checkpoint", "metadata")  # the values of a checkpoint saved without a state store


def is_fork_copy(body: Mapping[str, Any] | None) -> bool:
    """Whether a Checkpoint object is the operator's copy of another Run's LangGraph State checkpoint (a
    fork's first Checkpoint): copiedFrom, kind State, a framework thread, and a LangGraph state (inline
    with its checkpoint id, or a manifest in the store)."""
    spec = (body or {}).get("spec") or {}
    state = spec.get("state")
    return (
        isinstance(spec.get("copiedFrom"), dict)
        and spec.get("kind", CheckpointKind.STATE.value) == CheckpointKind.STATE.value
        and isinstance(spec.get("thread"), dict)
        and (
            (isinstance(state, dict) and "checkpointId" in state and "checkpoint" in state)
            or isinstance(spec.get("stateRef"), dict)
        )
    )


def inline_pointers(copy: Mapping[str, Any]) -> JsonDict | None:
    """The copy's LangGraph pointers when it holds them inline (saved without a store), else None: they
    are in its manifest's header then (the operator copies a stateRef alone)."""
    state = copy["spec"].get("state")
    if isinstance(state, dict) and "checkpointId" in state:
        return dict(state)
    return None


def root_state(pointers: Mapping[str, Any], name: str, sequence: int) -> JsonDict:
    """The fork root's spec.state: the source checkpoint's id (and its inline values, when it has them)
    without its LangGraph parent, every delta channel's walk ending at the root itself."""
    if "checkpointId" not in pointers:
        raise ValueError("the forked checkpoint records no LangGraph checkpoint id")
    state: JsonDict = {"checkpointId": str(pointers["checkpointId"])}
    for field in INLINE:
        if field in pointers:
            state[field] = pointers[field]
    seeds = pointers.get("deltaSeeds")
    if isinstance(seeds, dict) and seeds:
        state["deltaSeeds"] = {ch: {"checkpoint": name, "sequence": sequence} for ch in sorted(seeds)}
    return state


def root_checkpoint(
    copy: Mapping[str, Any],
    pointers: Mapping[str, Any],
    *,
    name: str,
    attempt: str,
    lease_epoch: int,
    ledger_mark: int,
    thread: Mapping[str, str],
    metadata: JsonDict,
) -> JsonDict:
    """The fork root (see the module): a State checkpoint of the fork's `thread` named `name`, holding the
    copy's LangGraph checkpoint (its manifest by reference, or its inline values), whose parent is the
    copy, saved by `attempt` under `lease_epoch` with the Run's ledger mark."""
    spec = copy["spec"]
    sequence = int(spec["sequence"]) + 1
    body: JsonDict = {
        "runName": spec["runName"],
        "id": name,
        "sequence": sequence,
        "attempt": attempt,
        "leaseEpoch": lease_epoch,
        "kind": CheckpointKind.STATE.value,
        "thread": {"id": thread["id"], "ns": thread["ns"]},
        "parent": spec["id"],
        "ledgerMark": ledger_mark,
        "state": root_state(pointers, name, sequence),
    }
    if spec.get("step"):
        body["step"] = spec["step"]
    if isinstance(spec.get("stateRef"), dict):
        body["stateRef"] = dict(spec["stateRef"])
    return {"apiVersion": API_VERSION, "kind": "Checkpoint", "metadata": metadata, "spec": body}
