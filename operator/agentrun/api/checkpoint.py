"""The Checkpoint kind: where a Run can continue from; immutable once created."""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar, Literal

from pydantic import Field

from agentrun.api.blobref import BlobRef
from agentrun.api.budgets import CHECKPOINT_STATE_BUDGET, KIB
from agentrun.api.common import (
    ApiModel,
    AttemptName,
    Epoch,
    FreeJson,
    Identifier,
    KubernetesObject,
    ObjectName,
    PrinterColumn,
    RunName,
    cel,
    validation_rules,
)


class CheckpointKind(StrEnum):
    """What a Checkpoint holds. Only State checkpoints are resume points (status.latestCheckpoint) and
    count toward retention; the others belong to the State checkpoint named in their parent and are
    pruned with it."""

    STATE = "State"
    WRITES = "Writes"  # a framework's pending writes of one task, for the checkpoint in parent
    JOURNAL = "Journal"  # a recorded step result


class Thread(ApiModel):
    """A framework's own thread, for adapters whose threads are not the Run (LangGraph: the thread id
    and the checkpoint namespace of a subgraph)."""

    id: str = Field(min_length=1, max_length=256, description="The framework's thread id.")
    ns: str = Field(
        "", max_length=1024, description="The checkpoint namespace within the thread; empty for the root."
    )


class CopiedFrom(ApiModel):
    """The checkpoint of another Run that a fork's first Checkpoint copies."""

    run: RunName = Field(description="Name of the source Run.")
    uid: str = Field(min_length=1, max_length=64, description="UID of the source Run.")
    checkpoint: ObjectName = Field(description="Name of the source's Checkpoint object.")


class CheckpointSpec(ApiModel):
    """The saved state of a Run at a step boundary."""

    run_name: RunName = Field(description="Name of the Run this Checkpoint belongs to.")
    id: Identifier = Field(
        description="Id of the Checkpoint, referenced by status.latestCheckpoint, pending requests and "
        "Attempt spec.resumeFrom."
    )
    sequence: Epoch = Field(description="Position in the Run's chain of Checkpoints, counting up.")
    parent: Identifier | None = Field(
        None, description="Id of the previous Checkpoint; absent for the first."
    )
    delta_base: Identifier | None = Field(
        None,
        description="Id of the oldest State checkpoint on this one's parent chain that its state is rebuilt "
        "from: a framework that stores deltas (LangGraph's DeltaChannel) replays the entries of every "
        "ancestor back to it. Retention keeps that chain, with its entries, as long as this checkpoint is "
        "kept. Absent when the state is whole in itself.",
    )
    attempt: AttemptName = Field(description="Name of the Attempt that saved the Checkpoint.")
    lease_epoch: Epoch = Field(description="The lease epoch that Attempt held when it saved.")
    step: str | None = Field(None, max_length=128, description="The agent's step the state was saved at.")
    kind: CheckpointKind = Field(
        CheckpointKind.STATE,
        description="State (a resume point, the default), Writes (pending writes for the checkpoint in "
        "parent) or Journal (a recorded step result). Only State checkpoints are pointed at by "
        "status.latestCheckpoint and count toward retention; the others are pruned with their parent.",
    )
    thread: Thread | None = Field(
        None, description="The framework thread this checkpoint belongs to, when it is not the Run's own."
    )
    ledger_mark: Epoch | None = Field(
        None,
        description="The Run's ledger as it stood when the checkpoint was saved: the highest "
        "ledgerSequence among the Run's SideEffects opened by then (0: none). A fork from this "
        "checkpoint inherits exactly the SideEffects up to it. The SDK and the LangGraph saver record it "
        "inside an attempt Pod; absent on checkpoints saved outside one or by an SDK that predates forks "
        "(they cannot be forked from).",
    )
    copied_from: CopiedFrom | None = Field(
        None,
        description="For the first Checkpoint of a forked Run: the source checkpoint it copies (its state "
        "reference names the source's blobs, shared by digest).",
    )
    state: FreeJson = Field(
        None,
        description="The agent's state as JSON (ctx.state on resume), when it is kept inline. At most "
        f"{CHECKPOINT_STATE_BUDGET // KIB} KiB of JSON (the SDK refuses a larger one). With a state store "
        "configured, a state over the inline threshold (16 KiB) is in the store instead (stateRef); a "
        "Journal entry then keeps its call index here and its result in the store.",
    )
    state_ref: BlobRef | None = Field(
        None,
        description="The state (for a Journal entry: the step's result) stored in the agent-state store, "
        "read and verified on resume; set instead of the inline value when it is over the threshold.",
    )


class CheckpointStatus(ApiModel):
    """Checkpoints carry no status yet; the status subresource keeps spec and metadata writes apart."""


class Checkpoint(KubernetesObject):
    """The state of a Run at a step boundary, from which a later Attempt continues. Immutable: a Run
    moves on by saving a new Checkpoint whose parent is the previous one."""

    plural: ClassVar[str] = "checkpoints"
    short_name: ClassVar[str] = "ckpt"
    printer_columns: ClassVar[tuple[PrinterColumn, ...]] = (
        PrinterColumn("Run", ".spec.runName", "string", "The Run this Checkpoint belongs to."),
        PrinterColumn("Sequence", ".spec.sequence", "integer", "Position in the Run's chain."),
        PrinterColumn("Step", ".spec.step", "string", "The step the state was saved at."),
        PrinterColumn("Kind", ".spec.kind", "string", "State, Writes or Journal."),
    )

    kind: Literal["Checkpoint"] = Field("Checkpoint", description="Checkpoint.")
    spec: CheckpointSpec = Field(
        description="The saved state; immutable.",
        json_schema_extra=validation_rules(
            cel(
                "self == oldSelf",
                "a Checkpoint is immutable once created: save a new Checkpoint (with this one as parent) "
                "instead of changing it",
                reason="FieldValueForbidden",
            )
        ),
    )
    status: CheckpointStatus = Field(
        default_factory=CheckpointStatus, description="Unused; present for the status subresource."
    )
