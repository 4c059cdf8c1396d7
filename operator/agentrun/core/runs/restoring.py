"""A Run waiting for a person over a blob that cannot be verified (NeedsReconciliation, StateUnverifiable):
the operator restores the blob from the version the store kept (core.blobrestore; the I/O:
operator.blobrestore), and records what became of it through the table like any other write of the Run."""

from __future__ import annotations

from agentrun.core import blobrestore
from agentrun.core.plan import PatchRunStatus, RestoreBlobs
from agentrun.core.runs.stopping import at_rest
from agentrun.core.runs.transition import Transition, event
from agentrun.core.runs.world import World


def state_restore(w: World) -> Transition | None:
    """NeedsReconciliation for a StateUnverifiable failure no StateRestored condition answers yet, with a
    state store, and nothing else to write -> the blobs the failure names restored (RestoreBlobs); once
    that is observed (World.restorations) -> the StateRestored condition (True: every named blob verifies
    now) and an Event say what became of each blob. Never a retry: the Run stays where it is, a person
    decides."""
    status = w.run.status
    failure = status.failure.to_api() if status.failure is not None else None
    conditions = list(status.conditions or [])
    if not w.has_store or not blobrestore.unanswered(failure, [c.type for c in conditions]):
        return None
    rest = at_rest(w)
    if rest is None:
        return None  # what a stopped Run keeps in order is written first (Stopped)
    if w.restorations is None:
        assert failure is not None
        return rest.then(RestoreBlobs(tuple(sorted(blobrestore.named_keys(failure)))))
    if not w.restorations:
        return None  # the failure names no content address: nothing the operator can look at
    decided = blobrestore.verdict(w.restorations, generation=w.run.metadata.generation, now=w.now)
    recorded = PatchRunStatus({"conditions": [*(c.to_api() for c in conditions), decided.condition]})
    return rest.then(recorded, event(decided.event_type, decided.event_reason, decided.message))
