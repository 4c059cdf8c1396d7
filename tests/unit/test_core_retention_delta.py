"""core.retention with delta ancestry: a State checkpoint whose state is rebuilt from its ancestors
(LangGraph's DeltaChannel replays every ancestor's writes back to the last snapshot) keeps that whole
chain, with its Writes, for as long as the checkpoint itself is kept."""

from __future__ import annotations

from typing import Any

from agentrun.api import Checkpoint, CheckpointKind
from agentrun.core import retention
from unit.factories import make_attempt, make_checkpoint, make_run, pending_request, run_status


def state(n: int, base: int | None) -> Checkpoint:
    """c-n, child of c-(n-1); rebuilt from the chain back to c-base (None: whole in itself)."""
    made = make_checkpoint(f"c-{n}", n)
    update: dict[str, Any] = {"parent": f"c-{n - 1}" if n > 1 else None}
    if base is not None:
        update["delta_base"] = f"c-{base}"
    return made.model_copy(update={"spec": made.spec.model_copy(update=update)})


def writes(n: int) -> Checkpoint:
    made = make_checkpoint(f"w-{n}", 1)
    update = {"kind": CheckpointKind.WRITES, "parent": f"c-{n}"}
    return made.model_copy(update={"spec": made.spec.model_copy(update=update)})


def chain(last: int, snapshots: tuple[int, ...] = ()) -> list[Checkpoint]:
    """c-1 .. c-last as LangGraph writes them with a DeltaChannel: the channel's value is stored at the root
    and at each snapshot; every other checkpoint replays the writes since the nearest one before it."""
    found: list[Checkpoint] = []
    for n in range(1, last + 1):
        holders = [s for s in (1, *snapshots) if s < n]
        found.append(state(n, None if n == 1 or n in snapshots else max(holders)))
        found.append(writes(n))
    return found


def run(retention_count: int, latest: str, **status: Any) -> Any:
    return make_run(
        run_status("Running", current=1, latestCheckpoint=latest, **status),
        spec={"checkpointRetention": retention_count},
    )


def test_without_a_snapshot_every_ancestor_of_a_kept_checkpoint_and_its_writes_stay() -> None:
    # The loss of issue 24: 31 checkpoints of a growing message list, none a snapshot yet, retention 20.
    assert retention.prunable(run(20, "c-31"), chain(31), []) == []


def test_ancestors_older_than_the_snapshot_of_every_kept_checkpoint_go() -> None:
    pruned = retention.prunable(run(10, "c-30"), chain(30, snapshots=(15,)), [])
    # c-21..c-30 are kept and rebuilt from c-15 on: c-15..c-20 stay with their writes; c-1..c-14 go.
    assert pruned == [*(f"w-{n}" for n in range(1, 15)), *(f"c-{n}" for n in range(14, 0, -1))]


def test_a_kept_checkpoint_before_the_snapshot_keeps_its_own_chain() -> None:
    checkpoints = chain(30, snapshots=(15,))
    held = {**pending_request(), "checkpointId": "c-9"}
    pruned = retention.prunable(run(10, "c-30", pendingRequest=held), checkpoints, [])
    # c-9 (a pending request's) is rebuilt from c-1: c-1..c-9 stay, c-10..c-14 go.
    assert pruned == [*(f"w-{n}" for n in range(10, 15)), *(f"c-{n}" for n in range(14, 9, -1))]
    attempt = make_attempt(2, resume_from="c-12")
    pruned = retention.prunable(run(10, "c-30"), checkpoints, [attempt])
    # an Attempt's resume point c-12, rebuilt from c-1: c-1..c-12 stay, only c-13 and c-14 go
    assert pruned == ["w-13", "w-14", "c-14", "c-13"]


def test_a_chain_with_a_gap_keeps_what_is_left_of_it() -> None:
    # c-3 is gone already (deleted before this rule): what c-10 names is kept as far as the chain reaches.
    checkpoints = [c for c in chain(10) if c.spec.id not in ("c-3", "w-3")]
    assert retention.prunable(run(3, "c-10"), checkpoints, []) == ["w-1", "w-2", "c-2", "c-1"]
