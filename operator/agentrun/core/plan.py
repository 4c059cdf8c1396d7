"""Intended writes: what the state machine asks the I/O layer to do, in order, and from which view of
the Run they may be carried out (`Consistency`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from agentrun.api import FINISHED_ATTEMPT_PHASES

JsonDict = dict[str, Any]


@dataclass(frozen=True)
class PatchRunStatus:
    """A merge patch of Run.status, sent with the resourceVersion the decision was made on."""

    patch: JsonDict


@dataclass(frozen=True)
class WriteLease:
    """Create the Run's Lease (expected_resource_version None) or update it, preconditioned.

    epoch is written as leaseTransitions: every change of holder is a new epoch.
    """

    holder: str | None
    epoch: int
    duration_seconds: int
    expected_resource_version: str | None


@dataclass(frozen=True)
class CreateAttempt:
    body: JsonDict


@dataclass(frozen=True)
class PatchAttemptStatus:
    """A merge patch of Attempt.status; with the resourceVersion the decision saw, when it saw one, so that
    a decision made on a stale view of the Attempt never rewrites how it ended."""

    name: str
    patch: JsonDict
    expected_resource_version: str | None = None
    # The stopped Pod whose log tail goes into the same patch (status.logTail), as far as it can be read
    # now: an Attempt ending with its Pod collected at its end (spec.podGC OnAttemptEnd) records its end
    # and its tail in one write. A log that cannot be read now is left to SaveLogTail, later.
    log_tail_of: str | None = None


@dataclass(frozen=True)
class PatchSideEffectStatus:
    """A merge patch of SideEffect.status by the operator (an approval it records, a cancelled Run's
    in-flight record it marks Unknown), preconditioned on resource_version when given."""

    name: str
    patch: JsonDict
    resource_version: str | None = None


@dataclass(frozen=True)
class CreatePod:
    body: JsonDict


@dataclass(frozen=True)
class DeletePod:
    name: str
    grace_seconds: int | None = None
    # Collected (Run spec.podGC): the stopped Pod of an ended Attempt, its log tail recorded. Right on any
    # view of the Run (an Attempt's end is final), so it asks for no fresh read of the Run. Like
    # Plan.consistency, it says how the write may be made, not what is written: not compared.
    collected: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class DeleteCheckpoint:
    name: str


@dataclass(frozen=True)
class CreateCheckpoint:
    """Create a Checkpoint the operator writes for the Run (a fork's copy of its source's): idempotent, its
    name is deterministic; one found under that name must be the Run's own."""

    body: JsonDict


@dataclass(frozen=True)
class CreateSideEffect:
    """Create a SideEffect the operator writes for the Run (a fork's inherited record), then write its
    `statuses` in order (the status subresource: a create cannot carry one). Idempotent like the others."""

    body: JsonDict
    statuses: tuple[JsonDict, ...] = ()


@dataclass(frozen=True)
class WriteCheckpointIndex:
    """A finished Run's Checkpoint index to the state store, then recorded in Run status.checkpointIndex
    (preconditioned, like every Run status patch): `checkpoints` are the Checkpoint objects seen now, merged
    with the index recorded before (`previous`, a BlobRef's JSON) if the Run was compacted once already.
    Content-addressed: written again from the same Checkpoints, it is the same blob."""

    checkpoints: tuple[JsonDict, ...]
    previous: JsonDict | None = None


@dataclass(frozen=True)
class DeleteLease:
    """Delete the Run's Lease (a finished Run holds none): preconditioned on the resourceVersion seen."""

    resource_version: str


@dataclass(frozen=True)
class SaveLogTail:
    """The tail of an ended Attempt's Pod log, kept in Attempt status.logTail (in the state store, or a
    short tail inline without one), before the Pod is deleted (Run spec.podGC)."""

    attempt: str
    pod: str
    # Before a grant deletes the Pod at once: a log that cannot be read now is logged and skipped, never
    # holding up the grant (else the tail is read again later, and the Pod waits for it).
    best_effort: bool = False


ManagedKind = Literal["runs", "attempts", "sideeffects", "checkpoints"]


@dataclass(frozen=True)
class ClearManagedFields:
    """Strip metadata.managedFields from an object of a compacted Run (the API server's documented reset: a
    patch setting them to a list of one empty entry), preconditioned on the resourceVersion the decision
    saw: an object written since (a person's retry, a resolution) is decided again, its entries kept.
    `kind` is the plural: runs, attempts, sideeffects or checkpoints."""

    kind: ManagedKind
    name: str
    resource_version: str


@dataclass(frozen=True)
class RecordEvent:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str
    attempt: str | None = None  # the Attempt the event is about; the Run otherwise


@dataclass(frozen=True)
class RefuseMove:
    """No write: the rule `rule` asked to move the Run from `source` to `target`, a move its row of the
    table does not declare (core.runs.chain); counted and logged by the operator, the Run left as it is."""

    rule: str
    source: str
    target: str


@dataclass(frozen=True)
class ProvisionStoreCredentials:
    """Make `namespace`'s principals on the bundled object store and their Secrets (the operator holds
    the server's root credentials: operator.store_credentials), idempotently: a Secret there already keeps
    its credentials. It writes none of the Run's objects, so it is right on any view of the Run. The
    I/O layer tells core when the server refused (World.store_provisioning_refused)."""

    namespace: str


@dataclass(frozen=True)
class RestoreBlobs:
    """Restore the blobs a waiting Run's StateUnverifiable failure names (`keys`: the content addresses
    its message names) from the versions the store kept (operator.blobrestore: the references the
    decision's World records, the versions listed, the one that verifies written back and read back).
    It writes none of the Run's objects: what became of each blob goes back to core
    (World.restorations), whose StateRestore rule records it."""

    keys: tuple[str, ...]


@dataclass(frozen=True)
class ArchiveRun:
    """Write the Run's archive to the state store (statestore.archives), read it back, verify it and
    index it; the Plan stops here when the store cannot (the Run is kept, its deletion delayed).
    `document` is the archive's body (core.archive), `summary` its index entry's fields."""

    document: JsonDict
    summary: JsonDict


@dataclass(frozen=True)
class DeleteRun:
    """Delete the Run (its owned objects go with it), preconditioned on its uid and on the
    resourceVersion its archive recorded: a Run changed since is decided again, never deleted unseen."""

    uid: str
    resource_version: str


Action = (
    PatchRunStatus
    | RefuseMove
    | WriteLease
    | CreateAttempt
    | PatchAttemptStatus
    | PatchSideEffectStatus
    | CreatePod
    | DeletePod
    | DeleteCheckpoint
    | CreateCheckpoint
    | CreateSideEffect
    | WriteCheckpointIndex
    | DeleteLease
    | SaveLogTail
    | ClearManagedFields
    | RecordEvent
    | ProvisionStoreCredentials
    | RestoreBlobs
    | ArchiveRun
    | DeleteRun
)


class Consistency(StrEnum):
    """From which view of the Run a Plan may be written (the I/O layer's cached view may be behind)."""

    # The cached Run will do: nothing ahead of the Run's preconditioned status patch could be wrong on a
    # stale view (a stale view ends in a 409 there, before any later write).
    CACHED_RUN = "CachedRun"
    # Must be written from a freshly read Run: a write ahead of the Run's status patch (or one with no
    # status patch to fence it) would be made on a view nobody verified.
    FRESH_RUN = "FreshRun"


def consistency_of(actions: Sequence[Action], *, committed: bool) -> Consistency:
    """The consistency writing `actions` in order needs, decided on a Run that shows a commit or not.

    What may come ahead of the Run's status patch on the cached view:
    - an Attempt status patch that does not end the Attempt (Pending, Running, usage): it records what
      its Pod shows, true whatever the Run says since; one that ends it only if the Run already shows
      the commit (a commit is never undone). Ending an Attempt from Pod evidence alone while no commit
      is seen must not be decided on a stale Run: the commit may have landed.
    - a Lease created where none existed (a Run's first grant): the create cannot overwrite anything (a
      Lease already there is a 409), and the holder it names can do nothing until the preconditioned
      Run patch after it records its epoch. So the Lease write goes first: a grant written the other
      way round would name in the Run an epoch no Lease holds. If the Run patch loses, the next grant of
      that Attempt adopts the epoch (core.lease.epoch_for_grant), so no epoch is reused.
    - what a finished Run leaves behind, collected (core.runs.compaction): the log tail of a stopped Pod
      (it records what the Pod wrote), that Pod deleted (`DeletePod.collected`: its Attempt's end is
      final), and the Run's Lease deleted with the Event that says so. The deletion is preconditioned on
      the Lease's resourceVersion (a renewal since: decided again), and only this operator grants: a
      Run retried since the cached view (spec.retryRequest, not seen yet) is granted after it, and a
      grant that finds no Lease takes status.leaseEpoch + 1, so epochs never go back. The deletion is
      then what compaction would have done had the retry come a moment later.
    - a namespace's store credentials made (ProvisionStoreCredentials), a Run's blobs restored
      (RestoreBlobs): no object of the Run is written.
    Anything else ahead of the Run's status patch (a Lease taken over or revoked, an Attempt or Pod
    created, another Pod deleted, an Event, a side-effect record) needs the Run read first.
    """
    previous: Action | None = None
    for action in actions:
        # A checkpoint index is recorded by a preconditioned Run status patch too (its blobs, written
        # first, are content-addressed: a stale view writes nothing that could be wrong).
        if isinstance(action, PatchRunStatus | WriteCheckpointIndex):
            return Consistency.CACHED_RUN
        # So is the reset of the Run's managedFields: a merge patch preconditioned on the Run's
        # resourceVersion, ahead of those of its other objects (each preconditioned on its own).
        if isinstance(action, ClearManagedFields) and action.kind == "runs":
            return Consistency.CACHED_RUN
        collected = isinstance(action, SaveLogTail | DeleteLease) or (
            isinstance(action, DeletePod) and action.collected
        )
        released = isinstance(action, RecordEvent) and isinstance(previous, DeleteLease)
        previous = action
        if collected or released or isinstance(action, ProvisionStoreCredentials | RestoreBlobs):
            continue
        if isinstance(action, WriteLease) and action.expected_resource_version is None:
            continue
        if not isinstance(action, PatchAttemptStatus):
            return Consistency.FRESH_RUN
        if action.patch.get("phase") in FINISHED_ATTEMPT_PHASES and not committed:
            return Consistency.FRESH_RUN
    return Consistency.CACHED_RUN


@dataclass(frozen=True)
class Plan:
    """Writes to make in order (stop at the first that fails), and when to look at the Run again. A value:
    the table's rules build Transitions (core.runs.transition), and `render` makes the Plan of one."""

    actions: Sequence[Action] = field(default_factory=list)
    requeue_after: float | None = None
    # When the current holder's Lease runs out unless renewed first. Unlike requeue_after, the I/O layer
    # looks at the Run again then only if the Lease was not renewed meanwhile (else it waits for the new
    # expiry): a healthy worker's renewals cost no reconcile and no read of the Run.
    lease_expires_in: float | None = None
    # From which view of the Run the writes may be made (consistency_of): stated by core.runs.render;
    # a Plan that does not state it is written from a freshly read Run.
    consistency: Consistency = field(default=Consistency.FRESH_RUN, compare=False)

    @property
    def needs_fresh_run(self) -> bool:
        return bool(self.actions) and self.consistency == Consistency.FRESH_RUN

    def of(self, kind: type[Action]) -> list[Action]:
        return [a for a in self.actions if isinstance(a, kind)]
