"""Forking a Run from another Run's checkpoint (spec.forkFrom): which source is usable, what the fork
copies of it, and which of the source's SideEffects it inherits. Pure: the I/O layer observes the source
(`ForkSourceView`); core.runs.fork turns these answers into the fork's first Transition.

A checkpoint never undoes the outside world: each State checkpoint records its ledger mark (the highest
SideEffect.spec.ledgerSequence of its Run when it was saved), and the fork gets, as records of its own,
exactly the source's SideEffects up to that mark, so it reuses what the source confirmed instead of
executing it again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from agentrun.api import (
    API_VERSION,
    RUN_LABEL,
    Checkpoint,
    CheckpointKind,
    Run,
    SideEffect,
    SideEffectState,
)
from agentrun.api.sideeffect import MAX_HISTORY
from agentrun.core.ledger import side_effect_name, state_of
from agentrun.core.pods import owner_reference

NOT_FOUND: Final = "ForkSourceNotFound"
INVALID: Final = "ForkSourceInvalid"
INHERITED_UNKNOWN: Final = "InheritedUnknown"
OPEN_STATES: Final = (SideEffectState.PENDING, SideEffectState.UNKNOWN)


@dataclass(frozen=True)
class ForkSourceView:
    """The source of a fork, as the I/O layer found it: the source Run (None: neither live nor archived),
    its Checkpoint named by spec.forkFrom.checkpointId (None: not found), and its SideEffects."""

    run: Run | None
    checkpoint: Checkpoint | None = None
    side_effects: Sequence[SideEffect] = ()
    # Read from the source's archive: the Run itself was deleted after its archive was verified.
    archived: bool = False
    # Why the checkpoint could not be read although the Run exists (e.g. compacted into its index).
    missing_note: str | None = None


def archived_source(document: Mapping[str, Any], checkpoint_id: str) -> ForkSourceView:
    """The source as its archive holds it (the document statestore.archives writes and verifies: the Run
    as "object", its "checkpoints" and "sideEffects", whole)."""
    checkpoints = [Checkpoint.model_validate(c) for c in document.get("checkpoints") or []]
    return ForkSourceView(
        run=Run.model_validate(document["object"]),
        checkpoint=next((c for c in checkpoints if c.spec.id == checkpoint_id), None),
        side_effects=tuple(SideEffect.model_validate(e) for e in document.get("sideEffects") or []),
        archived=True,
    )


def refusal(fork: Run, source: ForkSourceView) -> tuple[str, str] | None:
    """(reason, message) when the fork cannot start from `source`; None when it can."""
    wanted = fork.spec.fork_from
    assert wanted is not None
    ns, name = fork.metadata.namespace, wanted.run
    if name == fork.metadata.name:
        return INVALID, f"spec.forkFrom.run names this Run itself ({name}): a Run forks from another Run"
    if source.run is None:
        return NOT_FOUND, f"spec.forkFrom.run: no Run {name} in namespace {ns}, and no archive of it"
    checkpoint = source.checkpoint
    if checkpoint is None:
        note = f" ({source.missing_note})" if source.missing_note else ""
        return NOT_FOUND, (
            f"spec.forkFrom.checkpointId: Run {name} has no checkpoint {wanted.checkpoint_id}{note}"
        )
    return _checkpoint_refusal(name, checkpoint)


def _checkpoint_refusal(name: str, checkpoint: Checkpoint) -> tuple[str, str] | None:
    """Why the source's checkpoint cannot be forked from: not a resume point, or not self-contained."""
    spec = checkpoint.spec
    if spec.kind != CheckpointKind.STATE:
        return INVALID, (
            f"spec.forkFrom.checkpointId: checkpoint {spec.id} of Run {name} is a {spec.kind.value} "
            "checkpoint; a fork starts from a State checkpoint (a resume point)"
        )
    if spec.thread is not None and spec.thread.ns:
        return INVALID, (
            f"spec.forkFrom.checkpointId: checkpoint {spec.id} of Run {name} is a checkpoint of a subgraph "
            f"(checkpoint namespace {spec.thread.ns!r}), not of the graph the Run runs; fork from a "
            "checkpoint of its root graph (thread.ns empty)"
        )
    if spec.ledger_mark is None:
        return INVALID, (
            f"spec.forkFrom.checkpointId: checkpoint {spec.id} of Run {name} records no ledger mark (saved "
            "by an SDK or adapter that predates forks), so no fork can tell which of its side effects "
            "precede it; fork from a checkpoint that has spec.ledgerMark"
        )
    if spec.delta_base is not None:
        return INVALID, (
            f"spec.forkFrom.checkpointId: checkpoint {spec.id} of Run {name} is rebuilt from the deltas of "
            f"its ancestors (deltaBase {spec.delta_base}), which a fork does not copy yet"
        )
    return None


def inherited(source: ForkSourceView) -> list[SideEffect]:
    """The source's SideEffects up to the checkpoint's ledger mark, in ledger order. A record without a
    ledgerSequence (written by an SDK that predates forks) is inherited too: a fork may reuse an action
    it did not need, never repeat one the source may have performed."""
    assert source.checkpoint is not None and source.checkpoint.spec.ledger_mark is not None
    mark = source.checkpoint.spec.ledger_mark
    kept = [r for r in source.side_effects if (r.spec.ledger_sequence or 0) <= mark]
    return sorted(kept, key=lambda r: (r.spec.ledger_sequence or 0, str(r.metadata.name)))


def open_records(records: Sequence[SideEffect]) -> list[SideEffect]:
    """Inherited records whose outcome nobody knows: the fork stops for a person before any send."""
    return [r for r in records if state_of(r) in OPEN_STATES]


def copied_checkpoint_id(fork: Run, checkpoint: Checkpoint) -> str:
    """The id (and object name) of the fork's copy: before its first Attempt, as attempt 0 would name it."""
    return f"{fork.metadata.name}-a0-s{checkpoint.spec.sequence}"


def _metadata(fork: Run, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": fork.metadata.namespace,
        "labels": {RUN_LABEL: fork.metadata.name},
        "ownerReferences": [owner_reference(fork, controller=True)],
    }


def checkpoint_copy(fork: Run, source: ForkSourceView) -> dict[str, Any]:
    """The fork's first Checkpoint: the source's state as it is (a stateRef still names the source's blob,
    shared by digest: the collector keeps it while this reference lives), its ledger mark, and where it
    came from. It has no parent: the fork's chain starts here."""
    assert source.run is not None and source.checkpoint is not None
    spec = source.checkpoint.spec
    copy_id = copied_checkpoint_id(fork, source.checkpoint)
    body: dict[str, Any] = {
        "runName": fork.metadata.name,
        "id": copy_id,
        "sequence": spec.sequence,
        "attempt": spec.attempt,
        "leaseEpoch": spec.lease_epoch,
        "kind": CheckpointKind.STATE.value,
        "ledgerMark": spec.ledger_mark,
        "copiedFrom": {
            "run": source.run.metadata.name,
            "uid": source.run.metadata.uid,
            "checkpoint": source.checkpoint.metadata.name,
        },
    }
    if spec.step is not None:
        body["step"] = spec.step
    if spec.thread is not None:
        body["thread"] = spec.thread.to_api()
    if spec.state_ref is not None:
        body["stateRef"] = spec.state_ref.to_api()
    else:
        body["state"] = spec.state
    return {
        "apiVersion": API_VERSION,
        "kind": "Checkpoint",
        "metadata": _metadata(fork, copy_id),
        "spec": body,
    }


def inherited_record(
    fork: Run, source_run: Run, record: SideEffect, now: datetime
) -> tuple[dict[str, Any], tuple[dict[str, Any], ...]]:
    """The fork's copy of one source record: its body (the spec as requested, under the fork's name for
    the same key) and the status writes that follow the create, in order. The status is the source's as
    it stands now, marked inheritedFrom; a Pending one becomes Unknown (the source's Attempt may still be
    sending it: nobody can tell from here); a Compensated one is written Confirmed first (a record's first
    status may not be Compensated)."""
    spec = record.spec.to_api()
    spec["runName"] = fork.metadata.name
    body = {
        "apiVersion": API_VERSION,
        "kind": "SideEffect",
        "metadata": _metadata(fork, side_effect_name(str(fork.metadata.name), record.spec.idempotency_key)),
        "spec": spec,
    }
    status = record.status.to_api() if record.status is not None else {}
    state = state_of(record)
    if state == SideEffectState.PENDING:
        state = SideEffectState.UNKNOWN
    note = {
        "state": state.value,
        "time": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "message": f"inherited from Run {source_run.metadata.name} ({record.metadata.name})",
    }
    history = [*(status.get("history") or []), note][-MAX_HISTORY:]
    status.update(
        state=state.value,
        history=history,
        inheritedFrom={
            "run": source_run.metadata.name,
            "uid": source_run.metadata.uid,
            "record": record.metadata.name,
        },
    )
    if state == SideEffectState.COMPENSATED:
        return body, ({**status, "state": SideEffectState.CONFIRMED.value}, status)
    return body, (status,)


def fork_status(source: ForkSourceView, count: int) -> dict[str, Any]:
    """status.fork: the source as resolved (its uid: a later Run of that name is another)."""
    assert source.run is not None and source.checkpoint is not None
    return {
        "run": source.run.metadata.name,
        "uid": source.run.metadata.uid,
        "checkpointId": source.checkpoint.spec.id,
        "ledgerMark": source.checkpoint.spec.ledger_mark,
        "inherited": count,
        "archived": source.archived,
    }
