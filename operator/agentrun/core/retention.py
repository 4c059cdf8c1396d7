"""Which Checkpoints to prune: the oldest State checkpoints beyond the retention count, never one still
pointed at; and the entries (Writes, Journal) that belong to a pruned or vanished State checkpoint."""

from __future__ import annotations

from collections.abc import Iterable

from agentrun.api import Attempt, Checkpoint, CheckpointKind, Run


def prunable(run: Run, checkpoints: Iterable[Checkpoint], attempts: Iterable[Attempt]) -> list[str]:
    keep = run.spec.checkpoint_retention
    every = list(checkpoints)
    states = [c for c in every if c.spec.kind == CheckpointKind.STATE]
    ordered = sorted(states, key=lambda c: c.spec.sequence, reverse=True)
    protected = {run.status.latest_checkpoint}
    if run.status.pending_request:
        protected.add(run.status.pending_request.checkpoint_id)
    protected |= {a.spec.resume_from for a in attempts if a.spec.resume_from}
    pruned = [c for c in ordered[keep:] if c.spec.id not in protected]
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
        and (c.spec.parent not in kept if c.spec.parent is not None else start_gone)
    ]
    return [str(c.metadata.name) for c in [*pruned, *entries]]
