"""The fork's start (spec.forkFrom), as a rule of the Run's table: before its first Attempt, the source
is resolved and judged (core.fork); the fork fails at once when it is not usable, else its copies
are written (the checkpoint, the inherited SideEffects), then Attempt 1 resumes from the copy, or, when
an inherited record's outcome is open, the fork stops for a person before any send."""

from __future__ import annotations

from agentrun.api import AttemptReason, FailureClass, RunPhase
from agentrun.core import fork
from agentrun.core.plan import CreateCheckpoint, CreateSideEffect
from agentrun.core.runs.grants import failure_fields, grant
from agentrun.core.runs.rules import spec_over_budget
from agentrun.core.runs.transition import Transition, event, set_phase, wake_in, writes
from agentrun.core.runs.world import RECHECK_SECONDS, World


def fork_start(w: World) -> Transition | None:
    """Not started, with spec.forkFrom -> Failed (ForkSourceNotFound, ForkSourceInvalid) when the source is
    not usable; else its checkpoint copied and its SideEffects up to the ledger mark inherited, then
    Attempt 1 granted, resuming from the copy (or NeedsReconciliation, InheritedUnknown, when an inherited
    record's outcome is open)."""
    run = w.run
    if run.spec.fork_from is None:
        return None
    if spec_over_budget(run.spec):
        return None  # FirstAttempt fails it, as any Run
    source = w.fork_source
    if source is None:
        return wake_in(RECHECK_SECONDS)  # not observed yet
    if refused := fork.refusal(run, source):
        reason, message = refused
        failure = failure_fields(FailureClass.DETERMINISTIC, reason, message)
        return set_phase(RunPhase.FAILED, reason, message, failure=failure).then(
            event("Warning", reason, message)
        )
    assert source.run is not None and source.checkpoint is not None
    records = fork.inherited(source)
    copy = fork.checkpoint_copy(run, source)
    copies = writes(
        CreateCheckpoint(copy),
        *(CreateSideEffect(*fork.inherited_record(run, source.run, r, w.now)) for r in records),
    )
    copy_id = copy["spec"]["id"]
    fields = {"latestCheckpoint": copy_id, "fork": fork.fork_status(source, len(records))}
    started = (
        f"forked from Run {source.run.metadata.name} at checkpoint {source.checkpoint.spec.id}, "
        f"inheriting {len(records)} side effect(s)"
    )
    if open_ := fork.open_records(records):
        names = ", ".join(str(r.metadata.name) for r in open_[:5])
        message = (
            f"{started}; {len(open_)} of them with an open outcome in the source ({names}): resolve this "
            "Run's inherited records (status.resolution), then ask for a retry (spec.retryRequest)"
        )
        reason = fork.INHERITED_UNKNOWN
        failure = failure_fields(FailureClass.UNKNOWN_SIDE_EFFECT, reason, message)
        stop = set_phase(RunPhase.NEEDS_RECONCILIATION, reason, message, failure=failure, **fields)
        return copies.then(stop, event("Warning", "NeedsReconciliation", message))
    return copies.then(
        event("Normal", "Forked", started),
        grant(w, 1, AttemptReason.INITIAL, None, copy_id, **fields),
    )
