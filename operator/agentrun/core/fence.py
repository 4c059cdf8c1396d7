"""The fence every worker write that changes official Run state must pass."""

from __future__ import annotations

from agentrun.api import RejectedCommitReason, Run


def fence_violation(run: Run, lease_epoch: int, cancel_epoch: int) -> RejectedCommitReason | None:
    """Why a worker holding (lease_epoch, cancel_epoch) may no longer write to `run`, or None.

    A grown cancel epoch wins over a lost lease: the user's cancel is the reason to report.
    """
    if run.spec.cancel_epoch != cancel_epoch:
        return RejectedCommitReason.STALE_AFTER_CANCEL
    if (run.status.lease_epoch or 0) != lease_epoch:
        return RejectedCommitReason.STALE_WORKER
    return None
