"""core.retention with framework checkpoints: only State checkpoints count, entries go with their parent."""

from __future__ import annotations

from typing import Any

from agentrun.api import Checkpoint, CheckpointKind
from agentrun.core import retention
from unit.factories import make_checkpoint, make_run, run_status


def entry(name: str, parent: str | None, kind: CheckpointKind = CheckpointKind.WRITES) -> Checkpoint:
    base = make_checkpoint(name, 1)
    return base.model_copy(update={"spec": base.spec.model_copy(update={"kind": kind, "parent": parent})})


def kept(retention_count: int, latest: str, phase: str = "Running") -> Any:
    return make_run(
        run_status(phase, current=1, latestCheckpoint=latest),
        spec={"checkpointRetention": retention_count},
    )


def test_writes_do_not_count_and_go_with_their_parent() -> None:
    states = [make_checkpoint(f"c-{n}", n) for n in range(1, 5)]  # c-1 .. c-4
    writes = [entry(f"w-{n}", f"c-{n}") for n in range(1, 5)]
    journal = entry("j-1", None, CheckpointKind.JOURNAL)
    pruned = retention.prunable(kept(2, "c-4"), [*writes, journal, *states], [])
    # Four Writes would be beyond a count of 2 if they counted; they go only with c-1 and c-2.
    assert pruned == ["w-1", "w-2", "c-2", "c-1"]  # entries first: none is left without its parent


def test_an_entry_stored_before_its_parent_is_kept() -> None:
    # LangGraph saves a task's writes while the checkpoint the task ran from is still being saved: an
    # absent parent may be one about to be stored, and pruning its writes would lose them for good.
    states = [make_checkpoint("c-1", 1)]
    assert retention.prunable(kept(5, "c-1"), [*states, entry("w-2", "c-2")], []) == []
    # also once the Run has finished: a saver outside any Attempt may still write its thread
    finished = kept(5, "c-1", phase="Succeeded")
    assert retention.prunable(finished, [*states, entry("w-2", "c-2")], []) == []


def test_an_entry_goes_with_its_parent_and_before_it() -> None:
    states = [make_checkpoint(f"c-{n}", n) for n in range(1, 4)]
    pruned = retention.prunable(kept(1, "c-3"), [*states, entry("w-1", "c-1"), entry("w-3", "c-3")], [])
    assert pruned == ["w-1", "c-2", "c-1"]
