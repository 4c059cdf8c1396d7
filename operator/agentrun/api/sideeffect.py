"""The SideEffect kind: the ledger entry of one external action, which never rolls back with state."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, ClassVar, Literal

from pydantic import ConfigDict, Field

from agentrun.api.blobref import BlobRef
from agentrun.api.budgets import KIB, SIDE_EFFECT_RESULT_BUDGET
from agentrun.api.common import (
    ApiModel,
    AttemptName,
    Digest,
    Epoch,
    FreeJson,
    Identifier,
    KubernetesObject,
    Message,
    ObjectName,
    PrinterColumn,
    RunName,
    UserName,
    cel,
    cel_list,
    validation_rules,
)

MAX_HISTORY = 32
MAX_SENDS_LIMIT = 10  # spec.maxSends at most: every send is kept in status.sends
MAX_SENDS_KEPT = 64  # sends across fresh rounds (an Absent resolution); a full list stops the sends
MAX_SEND_DEADLINE_SECONDS = 86400
MAX_TOOL_LENGTH = 128
MAX_REFERENCE_LENGTH = 512  # the Run's report lists up to 50 of each inside its status budget
# A person's user name or "lookup by <attempt>"; longer than a UserName, as it was before those existed.
ResolverName = Annotated[str, Field(min_length=1, max_length=253)]


class Resend(StrEnum):
    """Whether an action whose outcome is unknown may be sent again without a lookup."""

    NEVER = "Never"
    WITH_SAME_KEY = "WithSameKey"  # the external system deduplicates by key: a re-send is the same action


class SendOutcome(StrEnum):
    """What became of one send."""

    CONFIRMED = "Confirmed"
    FAILED = "Failed"  # a definite failure (transient ones are sent again within the bounds)
    UNKNOWN = "Unknown"  # no answer: the action may have happened
    ABSENT = "Absent"  # no answer, then a lookup (or a person) established it did not happen


class Resolution(StrEnum):
    """A person's verdict on an action whose outcome was unknown."""

    CONFIRMED = "Confirmed"
    FAILED = "Failed"
    ABSENT = "Absent"  # it did not happen: state Failed, and a later Attempt may send again, afresh


class SideEffectState(StrEnum):
    """Where an external side effect stands."""

    PENDING = "Pending"
    CONFIRMED = "Confirmed"
    FAILED = "Failed"
    UNKNOWN = "Unknown"
    COMPENSATED = "Compensated"


# The ledger's state machine; the API server enforces the same table (see SideEffectStatus.state).
# Staying in the same state is always allowed. A SideEffect without status counts as Pending.
SIDE_EFFECT_TRANSITIONS: dict[SideEffectState, frozenset[SideEffectState]] = {
    SideEffectState.PENDING: frozenset(
        {SideEffectState.CONFIRMED, SideEffectState.FAILED, SideEffectState.UNKNOWN}
    ),
    SideEffectState.UNKNOWN: frozenset({SideEffectState.CONFIRMED, SideEffectState.FAILED}),
    SideEffectState.CONFIRMED: frozenset({SideEffectState.COMPENSATED}),
    # Only after a person's resolution Absent ("it did not happen"; enforced on SideEffectStatus): the
    # action is sent again with the same key, with a fresh maxSends.
    SideEffectState.FAILED: frozenset({SideEffectState.PENDING}),
    SideEffectState.COMPENSATED: frozenset(),
}


def is_allowed_transition(old: SideEffectState, new: SideEffectState) -> bool:
    """Whether the ledger may move a SideEffect from `old` to `new`."""
    return old == new or new in SIDE_EFFECT_TRANSITIONS[old]


def _transition_rule() -> str:
    """SIDE_EFFECT_TRANSITIONS as a CEL transition rule on the state field."""
    clauses = ["self == oldSelf"]
    for source, targets in SIDE_EFFECT_TRANSITIONS.items():
        if targets:
            clauses.append(f"(oldSelf == '{source}' && self in {cel_list(targets)})")
    return " || ".join(clauses)


class SideEffectSpec(ApiModel):
    """The external action as it was requested; immutable, like a ledger line."""

    run_name: RunName = Field(description="Name of the Run that performs the action.")
    operation_id: Identifier | None = Field(
        None, description="Id of the call within the Run, assigned by the worker SDK."
    )
    step: str | None = Field(None, max_length=128, description="The agent's step that performs the action.")
    tool: str = Field(
        min_length=1, max_length=MAX_TOOL_LENGTH, description="The tool or API called, e.g. create_ticket."
    )
    idempotency_key: Identifier = Field(
        description="The key that identifies the action in the external system. The action is executed "
        "at most once per key; a later Attempt looks it up by this key instead of repeating it."
    )
    target: str | None = Field(
        None, max_length=MAX_REFERENCE_LENGTH, description="What the action acts on, e.g. a project or a URL."
    )
    request_digest: Digest | None = Field(
        None,
        description="sha256 of the request's canonical JSON (sha256:<hex>), to detect a changed request.",
    )
    compensation: str = Field(
        "",
        max_length=MAX_TOOL_LENGTH,
        description="The action that undoes this one, e.g. close_ticket; empty when there is none.",
    )
    reversible: bool = Field(
        False,
        description="Whether the compensation really undoes the action; false means it cannot be undone. "
        "An irreversible action is never sent again automatically after an unknown outcome.",
    )
    resend: Resend = Field(
        Resend.NEVER,
        description="WithSameKey: the external system deduplicates by idempotencyKey, so an unknown outcome "
        "may be sent again without a lookup. Never (default): only a lookup that finds it absent allows it.",
    )
    max_sends: int = Field(
        3,
        ge=1,
        le=MAX_SENDS_LIMIT,
        description="The most sends of the action (status.sends) before the Run goes NeedsReconciliation "
        "(MaxSendsReached); a resolution Absent starts a fresh count.",
    )
    ledger_sequence: Epoch | None = Field(
        None,
        description="Position of the record in its Run's ledger, counting up from 1, assigned by the SDK "
        "when it records the intent: a Checkpoint's ledgerMark says which records were opened before it "
        "was saved. An inherited record keeps its source's.",
    )
    send_deadline_seconds: int = Field(
        300,
        ge=1,
        le=MAX_SEND_DEADLINE_SECONDS,
        description="No send or lookup after this many seconds from the round's first send.",
    )


class HistoryEntry(ApiModel):
    """One state change of the SideEffect."""

    state: SideEffectState = Field(description="The state entered.")
    time: datetime = Field(description="When the state was entered (RFC 3339).")
    attempt: AttemptName | None = Field(None, description="The Attempt that made the change, if any.")
    message: Message | None = Field(None, description="Why the state was entered.")


class Send(ApiModel):
    """One send of the action to the external system."""

    send_id: Identifier = Field(description="Unique per send: <operationId>-s<number>.")
    attempt: AttemptName = Field(description="The Attempt that sent it.")
    time: datetime = Field(description="When it was sent (RFC 3339).")
    outcome: SendOutcome | None = Field(
        None, description="What became of it; absent while in flight (the SDK records a send before it)."
    )
    call_id: str | None = Field(
        None, max_length=MAX_REFERENCE_LENGTH, description="The external system's id of the call, if any."
    )
    reference: str | None = Field(
        None,
        max_length=MAX_REFERENCE_LENGTH,
        description="The external reference its answer (or the lookup after it) named.",
    )
    message: Message | None = Field(None, description="The answer or the error, in short.")


class Conflict(ApiModel):
    """Answers that disagree about the action: a person must decide."""

    message: Message = Field(description="What disagreed.")
    references: list[Annotated[str, Field(max_length=MAX_REFERENCE_LENGTH)]] | None = Field(
        None, max_length=8, description="The external references named by the disagreeing answers."
    )
    time: datetime = Field(description="When the conflict was seen (RFC 3339).")


class Approval(ApiModel):
    """The resume that approved a gated action before it was executed."""

    request_id: Identifier = Field(
        description="The approval request (reason auth_required) that was answered; it names the "
        "request's digest, so an approval of one request never approves another."
    )
    request_digest: Digest | None = Field(None, description="The spec.requestDigest that was approved.")
    approved_by: UserName | None = Field(
        None,
        description="Who approved: the answer's spec.resume.answeredBy, checked by the API server against "
        "the user who sent it.",
    )
    time: datetime = Field(description="When the approval was recorded (RFC 3339).")


class InheritedFrom(ApiModel):
    """The source record a fork's inherited SideEffect copies: the action happened (or may have) in the
    source Run, before the checkpoint the fork started from."""

    run: RunName = Field(description="Name of the source Run.")
    uid: str = Field(min_length=1, max_length=64, description="UID of the source Run.")
    record: ObjectName = Field(description="Name of the source's SideEffect.")


class SideEffectStatus(ApiModel):
    """What became of the action, written by the worker SDK and by reconciliation."""

    model_config = ConfigDict(
        json_schema_extra=validation_rules(
            cel(
                "oldSelf.state != 'Failed' || self.state == 'Failed' || "
                "(has(oldSelf.resolution) && oldSelf.resolution == 'Absent' && "
                "(has(oldSelf.resolvedSends) ? oldSelf.resolvedSends : 0) == "
                "(has(oldSelf.sends) ? size(oldSelf.sends) : 0))",
                "a Failed SideEffect is final, unless a person resolved it Absent (it did not happen): then "
                "it may be sent again once (Failed -> Pending, before any later send)",
                reason="FieldValueForbidden",
                field_path=".state",
            ),
            cel(
                "!has(self.resolution) || has(self.resolvedBy)",
                "a resolution names who made it: set status.resolvedBy",
                reason="FieldValueRequired",
                field_path=".resolvedBy",
            ),
            cel(
                "oldSelf.state != 'Unknown' || self.state == 'Unknown' || has(self.resolvedBy)",
                "a SideEffect leaves Unknown only by reconciliation: set status.resolvedBy to who or what "
                "established the outcome",
                reason="FieldValueRequired",
                field_path=".resolvedBy",
            ),
        )
    )

    state: SideEffectState = Field(
        description="Pending until the outcome is known, then Confirmed (it happened), Failed (it did "
        "not) or Unknown (nobody can tell; a person must resolve it). A Confirmed action may later be "
        "Compensated. The API server refuses every other transition.",
        json_schema_extra=validation_rules(
            cel(
                _transition_rule(),
                "status.state may only move Pending -> Confirmed, Failed or Unknown; Unknown -> Confirmed "
                "or Failed; Confirmed -> Compensated; Failed -> Pending after a resolution Absent. A ledger "
                "entry is never rewritten otherwise.",
                reason="FieldValueForbidden",
            )
        ),
    )
    external_reference: str | None = Field(
        None,
        max_length=MAX_REFERENCE_LENGTH,
        description="The external system's id of what was done, e.g. a ticket number.",
    )
    result: FreeJson = Field(
        None,
        description="What the action returned (any JSON). A later Attempt reuses it instead of executing "
        f"the action again. At most {SIDE_EFFECT_RESULT_BUDGET // KIB} KiB of JSON (the SDK refuses a "
        "larger one). With a state store configured, a result over the inline threshold (16 KiB) is in "
        "resultRef instead.",
    )
    result_ref: BlobRef | None = Field(
        None,
        description="What the action returned, stored in the agent-state store when it is over the inline "
        "threshold; read and verified (size, sha256) when a later Attempt reuses it.",
    )
    attempt: AttemptName | None = Field(None, description="The Attempt that executed the action.")
    lease_epoch: Epoch | None = Field(None, description="The lease epoch that Attempt held.")
    resolved_by: ResolverName | None = Field(
        None,
        description="Who or what resolved an Unknown outcome: required to leave Unknown. A person writes "
        "their own user name as the API server knows it (kubectl auth whoami; any other name is refused "
        "whenever it differs from what is stored); an attempt Pod writes lookup by <attempt>.",
    )
    approval: Approval | None = Field(None, description="The approval, for an action that required one.")
    sends: list[Send] | None = Field(
        None,
        max_length=MAX_SENDS_KEPT,
        description="Every send of the action, across all Attempts, oldest first; spec.maxSends counts "
        "those since the last resolution Absent.",
    )
    conflict: Conflict | None = Field(None, description="Answers that disagreed, if any.")
    resolution: Resolution | None = Field(
        None,
        description="A person's verdict (with resolvedBy): Confirmed, Failed, or Absent (it did not "
        "happen: state Failed, and a later Attempt may send it again with a fresh maxSends).",
    )
    resolution_message: Message | None = Field(None, description="Why the person resolved it so.")
    resolved_sends: int | None = Field(
        None,
        ge=0,
        le=MAX_SENDS_KEPT,
        description="How many of status.sends the resolution covers: maxSends counts the later ones.",
    )
    history: list[HistoryEntry] | None = Field(
        None, max_length=MAX_HISTORY, description="The state changes, oldest first."
    )
    inherited_from: InheritedFrom | None = Field(
        None,
        description="Set by the operator on a forked Run's copy of its source's record: the fork reuses a "
        "Confirmed one instead of executing it again, stops for a person on an open one, and never "
        "compensates it. Never written by an attempt Pod.",
    )


class SideEffect(KubernetesObject):
    """One external action of a Run (an API call, a message, a payment): the ledger entry that says
    whether it happened, so that it is never executed twice and the Run's report can say what was
    done, what was compensated and what cannot be undone."""

    plural: ClassVar[str] = "sideeffects"
    short_name: ClassVar[str] = "sfx"
    printer_columns: ClassVar[tuple[PrinterColumn, ...]] = (
        PrinterColumn("Run", ".spec.runName", "string", "The Run that performed the action."),
        PrinterColumn("Tool", ".spec.tool", "string", "The tool that was called."),
        PrinterColumn("State", ".status.state", "string", "What became of the action."),
        PrinterColumn(
            "External Reference", ".status.externalReference", "string", "The external system's id."
        ),
    )
    model_config = ConfigDict(
        json_schema_extra=validation_rules(
            cel(
                "!has(oldSelf.status) || has(self.status)",
                "the status of a SideEffect cannot be removed: it is the ledger's record of the action",
                reason="FieldValueForbidden",
                field_path=".status",
            ),
            cel(
                "has(oldSelf.status) || !has(self.status) || self.status.state != 'Compensated'",
                "a new SideEffect starts Pending and only a Confirmed one can become Compensated",
                reason="FieldValueForbidden",
                field_path=".status.state",
            ),
        )
    )

    kind: Literal["SideEffect"] = Field("SideEffect", description="SideEffect.")
    spec: SideEffectSpec = Field(
        description="The action as requested; immutable.",
        json_schema_extra=validation_rules(
            cel(
                "self == oldSelf",
                "a SideEffect's spec is immutable: the ledger keeps the action as it was requested; a "
                "different action needs a different idempotencyKey and so a new SideEffect",
                reason="FieldValueForbidden",
            )
        ),
    )
    status: SideEffectStatus | None = Field(
        None, description="What became of the action; absent until the worker records it (counts as Pending)."
    )
