"""A finished Run leaves the API server lighter (docs/state-store.md, "Archives of finished Runs"): its
Checkpoint index goes to the state store, its superseded Checkpoints and its Lease are deleted; and the
Pods of ended Attempts are collected (Run spec.podGC), each after the tail of its log was kept.

Compaction is level-based, in two reconciles, so an operator restart between any two writes finishes it:
1. Succeeded, Failed or Cancelled, settled (no Attempt or Pod still going, no effect whose outcome is
   open, the report current), with a state store: while the Run still has its Lease (or has Checkpoints
   and no index), the index is written (merged with an earlier one: a Run retried after compaction saved
   more) and recorded in status.checkpointIndex, then the Lease is deleted. Every grant creates a Lease,
   so a Lease on a finished Run means the recorded index may be behind; none means it is current.
2. With the index recorded and no Lease: the superseded Checkpoints are deleted. Kept: the latest of
   each thread, the one status.latestCheckpoint names (a retry continues from it), those a pending
   request or an Attempt resumes from, and what their state is rebuilt from (core.retention).
Without a store only the Lease goes (never while an index is recorded: then the Lease is what says the
index is behind) and every Checkpoint stays: state is never lost for want of a place to put it.
3. Then, with or without a store, once nothing else is left to write for the Run (no log tail to keep, no
   Pod to collect, no upkeep, its time to live's writes made and its archive not due), the
   metadata.managedFields of the Run and of the Attempts, SideEffects and Checkpoints it keeps are
   cleared: about half of what a finished Run leaves in the API server as kubectl prints it. Decided on
   the objects as observed (World.managed_fields), so a later write that adds an entry again (a
   server-side apply; the API server tracks no fields on a plain update of an object that has none) is
   followed by another clear once the Run is at rest again.
"""

from __future__ import annotations

from collections.abc import Iterable

from agentrun.api import (
    FINISHED_ATTEMPT_PHASES,
    TERMINAL_PHASES,
    Attempt,
    Checkpoint,
    CheckpointKind,
    PodGC,
    Run,
    SideEffect,
)
from agentrun.core import compensation
from agentrun.core.plan import (
    ClearManagedFields,
    DeleteCheckpoint,
    DeleteLease,
    DeletePod,
    ManagedKind,
    SaveLogTail,
    WriteCheckpointIndex,
)
from agentrun.core.retention import rebuilt_from
from agentrun.core.runs import expiry, rules
from agentrun.core.runs.stopping import live_attempts
from agentrun.core.runs.transition import NOTHING, Transition, event, writes
from agentrun.core.runs.upkeep import upkeep
from agentrun.core.runs.world import World

INDEXED = "CheckpointsIndexed"
LEASE_RELEASED = "LeaseReleased"


def compacting(w: World) -> Transition | None:
    """Succeeded, Failed or Cancelled and settled -> with a store, the Checkpoint index written and the
    Lease deleted, then the superseded Checkpoints deleted; without one, the Lease deleted only; then the
    managedFields of what is left cleared."""
    if not settled(w):
        return None
    lease, index = w.lease, w.run.status.checkpoint_index
    if not w.has_store:
        if lease is None:
            return clear_managed_fields(w)
        if index is not None:
            return None
        message = "the Run has ended: its Lease is deleted; without a state store its Checkpoints are kept"
        return writes(DeleteLease(lease.resource_version)).then(event("Normal", LEASE_RELEASED, message))
    if lease is not None or (index is None and w.checkpoints):
        previous = index.to_api() if index is not None else None
        checkpoints = tuple(c.to_api() for c in sorted(w.checkpoints, key=_order))
        t = writes(WriteCheckpointIndex(checkpoints, previous))
        if lease is not None:
            t = t.then(DeleteLease(lease.resource_version))
        message = (
            f"the Run has ended: its {len(checkpoints)} Checkpoints are indexed in the state store "
            "(status.checkpointIndex) and its Lease is deleted"
        )
        return t.then(event("Normal", INDEXED, message))
    gone = superseded(w.run, w.checkpoints, w.attempts.values())
    return writes(*(DeleteCheckpoint(name) for name in gone)) if gone else clear_managed_fields(w)


def clear_managed_fields(w: World) -> Transition | None:
    """A compacted Run at rest -> the managedFields of the Run, then of its Attempts, SideEffects and
    Checkpoints, cleared: each a reset preconditioned on the version seen. Only as the last write: while
    anything else is to be written for the Run (an upkeep, a log tail, a Pod to collect, its expiresTime
    or Archived condition, its archive and deletion) that goes first, so that the result does not depend
    on whether a later write records its writer again (a server-side apply does). A Run to be archived
    and deleted now is not cleared (its records go to the store whole)."""
    if not w.managed_fields or upkeep(w) or collect_pods(w, NOTHING) is not None:
        return None
    rest = expiry.expiry(w)
    if rest is not None and rest.steps:
        return None
    run = w.run
    attempts = sorted(w.attempts.values(), key=lambda a: a.spec.number)
    objects: list[tuple[ManagedKind, str, str | None]] = [
        ("runs", str(run.metadata.name), run.metadata.resource_version),
        *(("attempts", str(a.metadata.name), a.metadata.resource_version) for a in attempts),
        *(("sideeffects", *_named(e)) for e in _by_name(w.side_effects)),
        *(("checkpoints", *_named(c)) for c in _by_name(w.checkpoints)),
    ]
    clears = [
        ClearManagedFields(kind, name, version)
        for kind, name, version in objects
        if (kind, name) in w.managed_fields and version is not None
    ]
    if not clears:
        return None
    return writes(*clears).then(rest or NOTHING)


def settled(w: World) -> bool:
    """Succeeded, Failed or Cancelled after at least one Attempt (a Run refused before any has neither
    Lease nor Checkpoints of its own), with nothing left to do but compact: no Attempt or Pod still
    going, no effect whose outcome is open (a person may still need the Run as it is), and nothing the
    Stopped rule would still write (leftovers, a cancelled Run's Pending records, the report)."""
    run = w.run
    if run.status.phase not in TERMINAL_PHASES or run.metadata.deletion_timestamp is not None:
        return False
    if not run.status.attempts:  # ended before any Attempt (refused): nothing of its own to compact
        return False
    if live_attempts(w) or compensation.to_settle(w.side_effects):
        return False
    stopped = rules.stopped(w)
    return stopped is None or not stopped.steps


def superseded(run: Run, checkpoints: Iterable[Checkpoint], attempts: Iterable[Attempt]) -> list[str]:
    """The Checkpoints of a compacted Run that may go (their index is in the store): entries first, so
    that a pass stopped half-way leaves no entry without its parent."""
    every = list(checkpoints)
    states = [c for c in every if c.spec.kind == CheckpointKind.STATE]
    newest: dict[tuple[str, str] | None, Checkpoint] = {}
    for c in states:
        thread = (c.spec.thread.id, c.spec.thread.ns) if c.spec.thread else None
        if thread not in newest or c.spec.sequence > newest[thread].spec.sequence:
            newest[thread] = c
    live: set[str | None] = {c.spec.id for c in newest.values()}
    live.add(run.status.latest_checkpoint)
    if run.status.pending_request:
        live.add(run.status.pending_request.checkpoint_id)
    live |= {a.spec.resume_from for a in attempts if a.spec.resume_from}
    needed = rebuilt_from(live, states)
    pruned = [c for c in states if c.spec.id not in needed]
    gone = {c.spec.id for c in pruned}
    start_kept = any(c.spec.parent is None for c in states if c.spec.id not in gone)
    entries = [
        c
        for c in every
        if c.spec.kind != CheckpointKind.STATE
        and (c.spec.parent in gone if c.spec.parent is not None else bool(states) and not start_kept)
    ]
    return [str(c.metadata.name) for c in sorted(entries, key=_order) + sorted(pruned, key=_order)]


def _named(o: SideEffect | Checkpoint) -> tuple[str, str | None]:
    return str(o.metadata.name), o.metadata.resource_version


def _by_name(objects: Iterable[SideEffect | Checkpoint]) -> list[SideEffect | Checkpoint]:
    return sorted(objects, key=lambda o: str(o.metadata.name))


def _order(c: Checkpoint) -> tuple[int, str]:
    return c.spec.sequence, str(c.metadata.name)


# ---- Pods collected (Run spec.podGC) ----------------------------------------------------------------


def collect_pods(w: World, chosen: Transition) -> Transition | None:
    """After whatever the rule decided: each ended Attempt whose Pod has stopped has the tail of its log
    kept (Attempt status.logTail), and once that is recorded its Pod is deleted: when its outcome is
    recorded (OnAttemptEnd), once the Run is Succeeded, Failed or Cancelled (OnRunEnd), never (Never).
    In its own later reconcile, so a log that cannot be read now delays the deletion, never loses it."""
    run = w.run
    policy = run.spec.pod_gc
    if run.metadata.deletion_timestamp is not None or policy == PodGC.NEVER:
        return None
    if policy == PodGC.ON_RUN_END and run.status.phase not in TERMINAL_PHASES:
        return None
    deleting = {a.name for a in chosen.actions if isinstance(a, DeletePod)}
    steps: list[SaveLogTail | DeletePod] = []
    for attempt in sorted(w.attempts.values(), key=lambda a: a.spec.number):
        name = str(attempt.metadata.name)
        pod = w.pods.get(name)
        if attempt.status.phase not in FINISHED_ATTEMPT_PHASES or pod is None:
            continue
        if not pod.finished or pod.deleting or pod.name in deleting:
            continue
        collected = DeletePod(pod.name, collected=True)
        steps.append(SaveLogTail(name, pod.name) if attempt.status.log_tail is None else collected)
    return chosen.then(writes(*steps)) if steps else None
