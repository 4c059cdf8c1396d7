"""Which Checkpoints to prune: the oldest State checkpoints beyond the retention count, never one still
pointed at nor one a kept checkpoint's state is rebuilt from; and the entries (Writes, Journal) that
belong to a State checkpoint pruned now.

An entry whose parent is absent is left alone: it may be stored before its parent, as LangGraph saves a
task's writes while the checkpoint the task ran from is still being saved (its default durability
orders the writes only before the next checkpoint), and pruning it would lose those writes for good (a
DeltaChannel read past that checkpoint is then StateUnverifiable). Such entries go with the Run. So
that none is left behind by a pass that stopped half-way, entries are deleted before their parent."""

from __future__ import annotations

from collections.abc import Iterable

from agentrun.api import Attempt, Checkpoint, CheckpointKind, Run


def prunable(run: Run, checkpoints: Iterable[Checkpoint], attempts: Iterable[Attempt]) -> list[str]:
    keep = run.spec.checkpoint_retention
    every = list(checkpoints)
    states = [c for c in every if c.spec.kind == CheckpointKind.STATE]
    ordered = sorted(states, key=lambda c: c.spec.sequence, reverse=True)
    live = {c.spec.id for c in ordered[:keep]} | {run.status.latest_checkpoint}
    if run.status.pending_request:
        live.add(run.status.pending_request.checkpoint_id)
    live |= {a.spec.resume_from for a in attempts if a.spec.resume_from}
    needed = rebuilt_from(live, states)
    pruned = [c for c in ordered[keep:] if c.spec.id not in needed]
    gone = {c.spec.id for c in pruned}
    kept = {c.spec.id for c in states} - gone
    # Entries made before the first State checkpoint (no parent) belong to the start of the Run: they go
    # once no State checkpoint without a parent is kept (the first was pruned), as no Attempt can start
    # from the beginning again.
    start_gone = bool(states) and not any(c.spec.parent is None for c in states if c.spec.id in kept)
    entries = [
        c
        for c in every
        if c.spec.kind != CheckpointKind.STATE
        and (c.spec.parent in gone if c.spec.parent is not None else start_gone)
    ]
    return [str(c.metadata.name) for c in [*entries, *pruned]]


def rebuilt_from(live: set[str | None], states: list[Checkpoint]) -> set[str]:
    """The live checkpoints and every ancestor one of them is rebuilt from: the parent chain of a
    checkpoint with a deltaBase, back to that base. An ancestor already missing ends the walk (that
    state cannot be rebuilt any more: the reader says so, loudly, when it reads it)."""
    by_id = {c.spec.id: c for c in states}
    needed = {i for i in live if i is not None}
    walked: set[tuple[str, str]] = set()  # (ancestor, base) already walked from there
    for start in sorted(needed & by_id.keys()):
        base = by_id[start].spec.delta_base
        if base is None or base == start:
            continue
        cursor = by_id[start].spec.parent
        while cursor is not None and cursor in by_id and (cursor, base) not in walked:
            walked.add((cursor, base))
            needed.add(cursor)
            if cursor == base:
                break
            cursor = by_id[cursor].spec.parent
    return needed
