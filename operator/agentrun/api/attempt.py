"""The Attempt kind: one try at a Run, run by one Pod under one lease epoch; never rewritten."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import ClassVar, Final, Literal

from pydantic import ConfigDict, Field

from agentrun.api.blobref import BlobRef
from agentrun.api.budgets import KIB, RESUME_VALUE_BUDGET
from agentrun.api.common import (
    ApiModel,
    Epoch,
    FailureClass,
    FailureInfo,
    FreeJson,
    Identifier,
    KubernetesObject,
    Message,
    ObjectName,
    PrinterColumn,
    Reason,
    RunName,
    cel,
    cel_list,
    validation_rules,
)
from agentrun.api.usage import Usage

MAX_ATTEMPT_NUMBER = 9999  # keeps <run>-a<number> within 63 characters for a 48-character Run name


class AttemptPhase(StrEnum):
    """Where an Attempt is in its life."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    INTERRUPTED = "Interrupted"
    ABORTED = "Aborted"
    LEASE_LOST = "LeaseLost"
    REJECTED = "Rejected"


FINISHED_ATTEMPT_PHASES: Final = frozenset(AttemptPhase) - {AttemptPhase.PENDING, AttemptPhase.RUNNING}


class RejectedCommitReason(StrEnum):
    """Which fence refused an Attempt's commit."""

    STALE_AFTER_CANCEL = "stale_after_cancel"
    STALE_WORKER = "stale_worker"


class AttemptReason:
    """Values of Attempt spec.reason: why the Attempt was started."""

    INITIAL: Final = "initial"
    LEASE_EXPIRED: Final = "lease_expired"
    MANUAL_RETRY: Final = "manual_retry"
    # A compensation Attempt: it runs the registered compensations and lookups, never the agent.
    COMPENSATE: Final = "compensate"

    @staticmethod
    def retry(failure_class: FailureClass) -> str:
        """An automatic retry after a failure of the given class."""
        return f"retry:{failure_class}"

    @staticmethod
    def resume(request_id: str) -> str:
        """A continuation after the given pending request was answered."""
        return f"resume:{request_id}"


class StartKind(StrEnum):
    """What started an Attempt: the part of spec.reason before any `:<argument>`."""

    INITIAL = "initial"
    RETRY = "retry"  # an automatic retry; argument: the failure class
    LEASE_EXPIRED = "lease_expired"
    RESUME = "resume"  # argument: the request id that was answered
    MANUAL_RETRY = "manual_retry"
    COMPENSATE = "compensate"


_WITH_ARGUMENT: Final = frozenset({StartKind.RETRY, StartKind.RESUME})


@dataclass(frozen=True)
class StartReason:
    """Attempt spec.reason, typed: parse() reads the wire string, str() writes it back unchanged."""

    kind: StartKind
    argument: str | None = None

    def __post_init__(self) -> None:
        if (self.kind in _WITH_ARGUMENT) != bool(self.argument):
            raise ValueError(f"reason {self.kind.value} with argument {self.argument!r}")

    @classmethod
    def parse(cls, text: str) -> StartReason:
        kind, _, argument = text.partition(":")
        return cls(StartKind(kind), argument or None)

    def __str__(self) -> str:
        return f"{self.kind.value}:{self.argument}" if self.argument else self.kind.value

    @property
    def fresh(self) -> bool:
        """Whether the Attempt starts a new series counted against spec.retry.maxAttempts."""
        return self.kind in (StartKind.INITIAL, StartKind.MANUAL_RETRY, StartKind.RESUME)

    @property
    def replays_journal(self) -> bool:
        """Whether the Attempt continues the same observations (a crash, a lease loss, a retry), so
        journaled step results are returned; never after an answer, for a first Attempt or a compensation."""
        return self.kind in (StartKind.RETRY, StartKind.LEASE_EXPIRED, StartKind.MANUAL_RETRY)

    @property
    def answered_request(self) -> str | None:
        """The request a resume answers."""
        return self.argument if self.kind == StartKind.RESUME else None


_ATTEMPT_REASON_PATTERN = (
    r"^(initial|lease_expired|manual_retry|compensate|retry:("
    + "|".join(failure_class.value for failure_class in FailureClass)
    + r")|resume:[A-Za-z0-9]([A-Za-z0-9._:/@=+-]*[A-Za-z0-9])?)$"
)


class AttemptSpec(ApiModel):
    """What the Attempt was granted when it started; immutable, since history is never rewritten."""

    run_name: RunName = Field(description="Name of the Run this Attempt belongs to.")
    number: int = Field(
        ge=1, le=MAX_ATTEMPT_NUMBER, description="1 for the Run's first Attempt, then counting up."
    )
    lease_epoch: Epoch = Field(
        description="The lease epoch granted to this Attempt; its writes are valid only while it holds it."
    )
    cancel_epoch: Epoch = Field(
        description="The Run's spec.cancelEpoch when the Attempt was granted; a higher one means cancelled."
    )
    resume_from: Identifier | None = Field(
        None, description="Id of the Checkpoint the Attempt continues from; absent for a fresh start."
    )
    reason: str = Field(
        max_length=160,
        pattern=_ATTEMPT_REASON_PATTERN,
        description="Why the Attempt was started: initial, retry:<failure class>, lease_expired, "
        "resume:<requestId>, manual_retry or compensate (a compensation Attempt, which runs the "
        "compensations of the Run's side effects instead of the agent).",
    )
    input: FreeJson = Field(
        None,
        description="The resume value, when the Attempt answers a pending request; or, on an automatic "
        "retry, the answer the failed Attempt was given, when it saved no Checkpoint after it (so the "
        "agent is not asked again); for a compensation Attempt, {effects: [idempotency keys]} when only "
        f"those effects are compensated. At most {RESUME_VALUE_BUDGET // KIB} KiB of JSON.",
    )
    state_in_store: bool | None = Field(
        None,
        description="True when the Run's state may be (partly) in the agent-state store, by reference "
        "(a Checkpoint's stateRef, a SideEffect's resultRef, an earlier Attempt whose SDK stated it reads "
        "them): the Pod then gets its namespace as AGENTRUN_NAMESPACE_WITH_REFS instead of "
        "AGENTRUN_NAMESPACE, so an SDK that predates the store stops before it reads anything, and the "
        "Attempt must state BlobRefs in status.sdkReads (else it ends with reason AgentSDKTooOld).",
    )


class SdkRead(StrEnum):
    """What an agent's SDK can read, as it states at its start (Attempt status.sdkReads)."""

    BLOB_REFS = "BlobRefs"  # values in the agent-state store by reference (BlobRef), verified on read


class AttemptFailure(FailureInfo):
    """Why the Attempt failed."""

    reason: Reason | None = Field(
        None,
        description="For unknown_side_effect: why the ledger stopped (MaxSendsReached, LookupUnavailable, "
        "ConflictingResults, IrreversibleUnknown, ...); AttemptTimeout or ProgressTimeout for an Attempt "
        "stopped by spec.attemptTimeoutSeconds or spec.progressTimeoutSeconds. The Run's "
        "status.failure.reason carries it.",
    )

    exit_code: int | None = Field(None, ge=0, le=255, description="Exit code of the agent's container.")
    retry_after_seconds: int | None = Field(
        None,
        ge=0,
        le=86400,
        description="For rate_limited failures: how long the agent was told to wait. The next Attempt "
        "starts no sooner, whatever the backoff says.",
    )


class RejectedCommit(ApiModel):
    """A commit of this Attempt that the fences refused."""

    reason: RejectedCommitReason = Field(
        description="stale_after_cancel: the Run was cancelled after the Attempt was granted; "
        "stale_worker: another Attempt holds the lease now."
    )
    message: Message | None = Field(None, description="Details of the refused write.")
    time: datetime | None = Field(None, description="When the commit was refused (RFC 3339).")


# The tail of an Attempt's Pod log kept: at most this much in the state store, or inline without one.
LOG_TAIL_LINES: Final = 1000
LOG_TAIL_STORED_BYTES: Final = 64 * KIB
LOG_TAIL_INLINE_BYTES: Final = 4 * KIB


class LogTail(ApiModel):
    """The last lines of the agent container's log, kept when the operator deletes the Attempt's Pod."""

    ref: BlobRef | None = Field(
        None,
        description=f"The tail (at most {LOG_TAIL_LINES} lines and {LOG_TAIL_STORED_BYTES // KIB} KiB) as a "
        "blob in the state store, when one is configured.",
    )
    text: str | None = Field(
        None,
        max_length=LOG_TAIL_INLINE_BYTES,
        description=f"Without a state store: the last {LOG_TAIL_INLINE_BYTES // KIB} KiB of the log, inline.",
    )
    truncated: bool | None = Field(
        None, description="True when the log was longer than what is kept (earlier lines are not kept)."
    )
    unavailable: str | None = Field(
        None,
        max_length=1024,
        description="Why no log could be kept, when none could (the API server's answer: e.g. the Pod "
        "never ran on a node).",
    )
    time: datetime | None = Field(None, description="When the tail was read (RFC 3339).")


class AttemptStatus(ApiModel):
    """What happened to the Attempt."""

    phase: AttemptPhase | None = Field(
        None,
        description="Absent while the Attempt's Pod is created and scheduled (pending; Pending is accepted "
        "too), Running once its agent runs, then one final phase: Succeeded, Failed, Interrupted (waits for "
        "input), Aborted (cancelled), LeaseLost, or Rejected (its commit lost a fence). A final phase "
        "never changes, except that a late commit can still be recorded as Rejected.",
        json_schema_extra=validation_rules(
            cel(
                f"!(oldSelf in {cel_list(FINISHED_ATTEMPT_PHASES)}) || self == oldSelf"
                " || (self == 'Rejected' && oldSelf != 'Succeeded')",
                "an Attempt that has ended keeps its phase (history is never rewritten); only a refused "
                "late commit may still turn it into Rejected",
                reason="FieldValueForbidden",
            )
        ),
    )
    pod_name: ObjectName | None = Field(
        None, description="Name of the Pod that runs the Attempt, recorded once its agent runs."
    )
    start_time: datetime | None = Field(None, description="When the agent started (RFC 3339).")
    completion_time: datetime | None = Field(None, description="When the Attempt ended (RFC 3339).")
    failure: AttemptFailure | None = Field(None, description="Why the Attempt failed, when it did.")
    rejected_commit: RejectedCommit | None = Field(
        None, description="The commit the fences refused, when one was."
    )
    usage: Usage | None = Field(
        None,
        description="What the agent reported it consumed (ctx.add_usage, and its in-Attempt step retries), "
        "written by the Attempt's Pod every few seconds and when it ends.",
    )
    trace_id: str | None = Field(
        None,
        max_length=128,
        pattern=r"^[A-Za-z0-9-]+$",
        description="Trace id of the Attempt's work (the W3C trace id of its Run, 32 hex digits), to find "
        "it in the tracing backend.",
    )
    sdk_reads: list[SdkRead] | None = Field(
        None,
        max_length=8,
        description="What the agent's SDK reads, as it stated at its start, before it read any state "
        "(written by the Attempt's own Pod): BlobRefs, values in the agent-state store by reference. An SDK "
        "that states nothing predates the state store and is never given a Run whose state is there.",
    )
    log_tail: LogTail | None = Field(
        None,
        description="The tail of its Pod's log, kept by the operator before it deleted the Pod (spec.podGC "
        "of the Run); `kubectl agentrun logs RUN --attempt N` shows it.",
    )


class Attempt(KubernetesObject):
    """One try at a Run: a Pod running the agent under one lease epoch, from a checkpoint or from the
    start. The operator creates a new Attempt for every retry, takeover and resume; old Attempts keep
    what happened to them, so cost, trace and error of each try stay traceable."""

    plural: ClassVar[str] = "attempts"
    short_name: ClassVar[str] = "att"
    printer_columns: ClassVar[tuple[PrinterColumn, ...]] = (
        PrinterColumn("Run", ".spec.runName", "string", "The Run this Attempt belongs to."),
        PrinterColumn("Number", ".spec.number", "integer", "Position among the Run's Attempts."),
        PrinterColumn("Phase", ".status.phase", "string", "Where the Attempt is in its life."),
        PrinterColumn("Reason", ".spec.reason", "string", "Why the Attempt was started."),
        PrinterColumn("Pod", ".status.podName", "string", "The Pod that runs the Attempt."),
    )

    model_config = ConfigDict(
        json_schema_extra=validation_rules(
            # The phase rule on status.phase only runs while both old and new values exist: without
            # this one, removing the phase (or the whole status) and setting it again would rewrite
            # an ended Attempt.
            cel(
                "!has(oldSelf.status) || !has(oldSelf.status.phase)"
                " || (has(self.status) && has(self.status.phase))",
                "an Attempt's status.phase cannot be removed once set: history is never rewritten; "
                "move the phase forward instead",
                reason="FieldValueForbidden",
                field_path=".status.phase",
            ),
        )
    )

    kind: Literal["Attempt"] = Field("Attempt", description="Attempt.")
    spec: AttemptSpec = Field(
        description="What the Attempt was granted; immutable.",
        json_schema_extra=validation_rules(
            cel(
                "self == oldSelf",
                "an Attempt's spec is immutable: history is never rewritten; the operator starts a new "
                "Attempt instead",
                reason="FieldValueForbidden",
            )
        ),
    )
    status: AttemptStatus = Field(default_factory=AttemptStatus, description="What happened to the Attempt.")
