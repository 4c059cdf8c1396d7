"""Which Checkpoints to prune: the oldest beyond the retention count, never one still pointed at."""

from __future__ import annotations

from collections.abc import Iterable

from agentrun.api import Attempt, Checkpoint, Run


def prunable(run: Run, checkpoints: Iterable[Checkpoint], attempts: Iterable[Attempt]) -> list[str]:
    keep = run.spec.checkpoint_retention
    ordered = sorted(checkpoints, key=lambda c: c.spec.sequence, reverse=True)
    protected = {run.status.latest_checkpoint}
    if run.status.pending_request:
        protected.add(run.status.pending_request.checkpoint_id)
    protected |= {a.spec.resume_from for a in attempts if a.spec.resume_from}
    return [str(c.metadata.name) for c in ordered[keep:] if c.spec.id not in protected]
