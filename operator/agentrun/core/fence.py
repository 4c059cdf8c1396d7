"""The fence every worker write that changes official Run state must pass."""

from __future__ import annotations

from typing import Final

from agentrun.api import RejectedCommitReason, Run
from agentrun.api.causes import RefusalCause


def fence_violation(run: Run, lease_epoch: int, cancel_epoch: int) -> RejectedCommitReason | None:
    """Why a worker holding (lease_epoch, cancel_epoch) may no longer write to `run`, or None.

    A grown cancel epoch wins over a lost lease: the user's cancel is the reason to report.
    """
    if run.spec.cancel_epoch != cancel_epoch:
        return RejectedCommitReason.STALE_AFTER_CANCEL
    if (run.status.lease_epoch or 0) != lease_epoch:
        return RejectedCommitReason.STALE_WORKER
    return None


# The causes that the admission policies (agentrun.admission) put first in a refusal's message, and what
# each means for the refused worker: a fence it lost (recorded on its Attempt), or a mistake (permanent).
REFUSAL_CAUSES: Final = {cause: cause.fence for cause in RefusalCause}


def refusal_cause(message: str) -> tuple[RefusalCause, RejectedCommitReason | None] | None:
    """(cause, fence lost or None) of a write the API server refused by policy, from its message alone
    (no read needed); None if the message names no cause."""
    cause = RefusalCause.of(message)
    return None if cause is None else (cause, cause.fence)
