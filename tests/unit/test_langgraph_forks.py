"""integrations.langgraph.forks: which Checkpoint is the operator's copy of a LangGraph checkpoint, and the
fork root the saver saves from it (the same LangGraph checkpoint on the fork's thread, its manifest shared,
no LangGraph parent, every delta walk ending at the root)."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.api import Checkpoint
from agentrun.integrations.langgraph import forks

MANIFEST = {"key": "agentrun/team-a/5d1e/sha256/" + "b" * 64, "sha256": "b" * 64, "size": 812, "links": True}
COPIED = {"run": "source", "uid": "5d1e", "checkpoint": "source-2f0a1c-1ef7"}


def copy(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "runName": "fork",
        "id": "fork-a0-s5",
        "sequence": 5,
        "attempt": "source-a1",
        "leaseEpoch": 1,
        "kind": "State",
        "step": "langgraph:loop:3",
        "thread": {"id": "source", "ns": ""},
        "ledgerMark": 1,
        "copiedFrom": COPIED,
        "stateRef": MANIFEST,
    }
    body.update(spec)
    return {"metadata": {"name": body["id"]}, "spec": {k: v for k, v in body.items() if v is not None}}


INLINE_STATE = {
    "checkpointId": "1ef7-0003",
    "parentCheckpointId": "1ef7-0002",
    "checkpoint": ["msgpack", "AAA="],
    "metadata": ["msgpack", "BBB="],
}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (copy(), True),  # in the store: its manifest names the LangGraph checkpoint
        (copy(stateRef=None, state=INLINE_STATE), True),  # saved inline
        (copy(copiedFrom=None), False),  # the saver's own checkpoint, or ctx.checkpoint's
        (copy(thread=None), False),  # an SDK agent's checkpoint, copied: ctx.state, not a graph
        (copy(kind="Writes"), False),
        (copy(stateRef=None, state={"step": 2}), False),
        (None, False),
    ],
)
def test_a_fork_copy_of_a_langgraph_checkpoint_is_recognized(
    body: dict[str, Any] | None, expected: bool
) -> None:
    assert forks.is_fork_copy(body) is expected


def test_pointers_are_read_inline_only_when_the_copy_holds_them() -> None:
    assert forks.inline_pointers(copy()) is None  # the operator copies a stateRef alone: read its manifest
    assert forks.inline_pointers(copy(stateRef=None, state=INLINE_STATE)) == INLINE_STATE


def root(source: dict[str, Any], pointers: dict[str, Any]) -> dict[str, Any]:
    metadata = {"name": "fork-9c1d-1ef7-0003", "namespace": "team-a"}
    return forks.root_checkpoint(
        source,
        pointers,
        name="fork-9c1d-1ef7-0003",
        attempt="fork-a1",
        lease_epoch=1,
        ledger_mark=1,
        thread={"id": "fork", "ns": ""},
        metadata=metadata,
    )


def test_the_root_shares_the_manifest_on_the_forks_thread_after_the_copy() -> None:
    header = {
        "checkpointId": "1ef7-0003",
        "deltaSeeds": {"messages": {"checkpoint": "source-x", "sequence": 2}},
    }
    body = root(copy(), header)

    spec = body["spec"]
    assert spec["stateRef"] == MANIFEST  # the source's manifest, by digest: nothing copied
    assert spec["thread"] == {"id": "fork", "ns": ""}
    assert (spec["parent"], spec["sequence"]) == ("fork-a0-s5", 6)
    assert (spec["attempt"], spec["leaseEpoch"], spec["ledgerMark"]) == ("fork-a1", 1, 1)
    assert spec["step"] == "langgraph:loop:3"
    # no LangGraph parent (the source's ancestors are not the fork's); delta walks end at the root
    assert spec["state"] == {
        "checkpointId": "1ef7-0003",
        "deltaSeeds": {"messages": {"checkpoint": "fork-9c1d-1ef7-0003", "sequence": 6}},
    }
    assert "copiedFrom" not in spec
    Checkpoint.model_validate(body)  # a valid Checkpoint as the API server's schema has it


def test_an_inline_root_keeps_the_values_without_the_parent() -> None:
    body = root(copy(stateRef=None, state=INLINE_STATE), INLINE_STATE)

    assert body["spec"]["state"] == {k: v for k, v in INLINE_STATE.items() if k != "parentCheckpointId"}
    assert "stateRef" not in body["spec"]
    Checkpoint.model_validate(body)


def test_a_copy_that_names_no_langgraph_checkpoint_is_refused() -> None:
    with pytest.raises(ValueError, match="no LangGraph checkpoint id"):
        root(copy(), {"sequence": 5})
