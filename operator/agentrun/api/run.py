"""The Run kind: a durable piece of agent work, driven through Attempts until it ends."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, ClassVar, Final, Literal

from pydantic import ConfigDict, Field

from agentrun.api.blobref import BlobRef
from agentrun.api.budgets import (
    ACCEPTED_SCHEMA_BUDGET,
    ACTION_REQUEST_BUDGET,
    KIB,
    RESULT_BUDGET,
    RESUME_VALUE_BUDGET,
    RUN_INPUT_BUDGET,
)
from agentrun.api.causes import RefusalCause
from agentrun.api.common import (
    CONDITIONS_SCHEMA,
    MAX_CONDITIONS,
    MAX_EPOCH,
    MAX_RUN_NAME_LENGTH,
    ApiModel,
    AttemptName,
    Condition,
    Digest,
    Epoch,
    FailureClass,
    FailureInfo,
    FreeJson,
    FreeJsonObject,
    Identifier,
    KubernetesObject,
    Message,
    ObjectName,
    PrinterColumn,
    Reason,
    RunName,
    UserName,
    cel,
    cel_list,
    defaulted_object,
    validation_rules,
)
from agentrun.api.kube import EnvVar, PodTemplate, ResourceRequirements
from agentrun.api.sideeffect import MAX_REFERENCE_LENGTH, MAX_TOOL_LENGTH, ResolverName, SideEffectState
from agentrun.api.usage import Usage

# status keeps the newest entries; Events and Attempts keep the rest, spentKeys every key. The bounds
# below keep the declared worst case of the status inside its budget (tests/unit/test_budgets.py).
MAX_RECORDED_CONTROLS = 30
MAX_REPORTED_EFFECTS = 30
MAX_CONTROL_MESSAGE_LENGTH = 256
MAX_SPENT_KEYS = 500
# A spent key is remembered as written when it is this short, else by its digest (KEY_DIGEST_LENGTH).
MAX_REMEMBERED_KEY_LENGTH = 40
SHORT_DIGEST_PATTERN = r"^sha256:[0-9a-f]{32}$"
# A compensateRequest names at most this many effects (all of them: name none).
MAX_COMPENSATE_EFFECTS = 8
# SideEffects are named sfx-<32 hex digits> (core.ledger.side_effect_name): the report lists them so.
SideEffectName = Annotated[str, Field(min_length=36, max_length=36, pattern=r"^sfx-[0-9a-f]{32}$")]
ShortDigest = Annotated[str, Field(max_length=39, pattern=SHORT_DIGEST_PATTERN)]
FreeText = Annotated[str, Field(max_length=1024)]
AgentArgument = Annotated[str, Field(max_length=1024)]


class RunPhase(StrEnum):
    """The state of a Run's state machine."""

    QUEUED = "Queued"
    RUNNING = "Running"
    INPUT_REQUIRED = "InputRequired"
    AUTH_REQUIRED = "AuthRequired"
    PAUSED = "Paused"
    RETRY_BACKOFF = "RetryBackoff"
    CANCEL_REQUESTED = "CancelRequested"
    COMPENSATING = "Compensating"
    CANCELLED = "Cancelled"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    NEEDS_RECONCILIATION = "NeedsReconciliation"


# Phases after which spec.cancelEpoch is frozen: nothing is left to cancel, nor to retry. A compensation
# runs to its end (bounded by spec.compensation.maxAttempts): a cancel cannot stop the undoing.
CANCEL_FROZEN_PHASES: Final = frozenset({RunPhase.SUCCEEDED, RunPhase.CANCELLED, RunPhase.COMPENSATING})


class RunConditionType(StrEnum):
    """Condition types the operator maintains on a Run (the same facts as the phase, for tools)."""

    SUCCEEDED = "Succeeded"
    WAITING = "Waiting"
    CANCEL_REQUESTED = "CancelRequested"
    LEASE_HELD = "LeaseHeld"
    ARCHIVED = "Archived"


class InterruptReason(StrEnum):
    """Why a Run waits: the agent needs input or authorisation, or someone asked it to pause."""

    INPUT_REQUIRED = "input_required"
    AUTH_REQUIRED = "auth_required"
    PAUSED = "paused"


class ControlOp(StrEnum):
    """A control operation requested from outside the Run."""

    RESUME = "Resume"
    RETRY = "Retry"
    PAUSE = "Pause"
    CANCEL = "Cancel"
    COMPENSATE = "Compensate"


class ControlOutcome(StrEnum):
    """What the operator did with a control request."""

    ACCEPTED = "Accepted"
    REJECTED = "Rejected"


# --- spec ---------------------------------------------------------------------------------------------


class AgentSpec(ApiModel):
    """What every Attempt of the Run executes: an image with a command, or a full Pod template."""

    model_config = ConfigDict(
        json_schema_extra=validation_rules(
            cel(
                "has(self.image) || has(self.podTemplate)",
                "spec.agent needs an image (usually with a command), or a podTemplate",
                reason="FieldValueRequired",
            )
        )
    )

    image: str | None = Field(
        None,
        min_length=1,
        max_length=512,
        description="Container image of the attempt Pod, e.g. agentrun/agent:dev. The image must contain "
        "the agent and the agentrun worker SDK.",
    )
    command: list[AgentArgument] | None = Field(
        None,
        max_length=32,
        description="Command that starts the agent, e.g. [python, -m, my_agent]. Defaults to the "
        "image's entrypoint.",
    )
    args: list[AgentArgument] | None = Field(
        None, max_length=64, description="Arguments appended to the command."
    )
    env: list[EnvVar] | None = Field(
        None,
        max_length=64,
        description="Environment variables of the agent. agentrun adds the variables the SDK needs "
        "next to these.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    resources: ResourceRequirements | None = Field(
        None, description="CPU, memory and other resources of the agent's container."
    )
    service_account_name: ObjectName | None = Field(
        None,
        description="ServiceAccount the attempt Pod runs as. It needs the permissions the worker SDK "
        "uses (read its Run, write Checkpoints, SideEffects, its Attempt and the Run's Lease). "
        "Defaults to the namespace's default ServiceAccount.",
    )
    pod_template: PodTemplate | None = Field(
        None,
        description="A full Pod template, for attempts that need volumes, scheduling constraints or "
        "sidecars. The fields above override the agent container's.",
    )


# Sized for thousands of running attempts (docs/performance.md, "Leases"): a renewal a minute is about
# 17 requests/s per 1,000 idle attempts, and a worker that stops silently (frozen, partitioned) is taken
# over 100 s after its last renewal at most.
DEFAULT_LEASE_DURATION_SECONDS: Final = 100
DEFAULT_LEASE_RENEW_SECONDS: Final = 60


class LeaseSpec(ApiModel):
    """How long an Attempt may hold the Run's lease without renewing it."""

    model_config = ConfigDict(
        json_schema_extra=validation_rules(
            cel(
                "self.renewSeconds < self.durationSeconds",
                "spec.lease.renewSeconds must be less than spec.lease.durationSeconds, so that a healthy "
                "worker renews its lease before it expires",
                field_path=".renewSeconds",
            )
        )
    )

    duration_seconds: int = Field(
        DEFAULT_LEASE_DURATION_SECONDS,
        ge=5,
        le=3600,
        description="Seconds the lease stays valid after its last renewal. When it expires the operator "
        "takes it over, raises the lease epoch and starts a new Attempt from the latest checkpoint; a "
        "longer lease tolerates longer pauses of the worker but delays recovery from a lost one (a Pod "
        "that ended is seen from its status at once, whatever the lease).",
    )
    renew_seconds: int = Field(
        DEFAULT_LEASE_RENEW_SECONDS,
        ge=1,
        le=1800,
        description="Seconds between lease renewals by the worker (each one request to the API server). "
        "Must be less than durationSeconds; the SDK tries a failed renewal again within seconds, until "
        "the lease would have run out.",
    )


class RetryBackoff(ApiModel):
    """Capped exponential backoff between automatic retries."""

    model_config = ConfigDict(
        json_schema_extra=validation_rules(
            cel(
                "self.initialSeconds <= self.maxSeconds",
                "spec.retry.backoff.initialSeconds must not exceed spec.retry.backoff.maxSeconds",
                field_path=".initialSeconds",
            )
        )
    )

    initial_seconds: int = Field(5, ge=1, le=3600, description="Delay before the first retry, in seconds.")
    factor: float = Field(
        2.0, ge=1.0, le=10.0, description="Each further retry waits this many times longer than the last."
    )
    max_seconds: int = Field(300, ge=1, le=86400, description="The delay never exceeds this many seconds.")


DEFAULT_RETRY_ON = (
    FailureClass.TRANSIENT,
    FailureClass.RATE_LIMITED,
    FailureClass.INFRASTRUCTURE,
    FailureClass.LEASE_LOST,
)


class RetryPolicy(ApiModel):
    """When a failed Attempt is retried automatically, and when the Run gives up."""

    max_attempts: int = Field(
        3,
        ge=1,
        le=100,
        description="The most Attempts the Run makes, the first one included, before it fails.",
    )
    backoff: RetryBackoff = defaulted_object(
        RetryBackoff, "Delay between an Attempt's failure and its retry."
    )
    retry_on: list[FailureClass] = Field(
        list(DEFAULT_RETRY_ON),
        max_length=8,
        description="Failure classes worth retrying. Others (deterministic, cancelled, "
        "unknown_side_effect, input_expired by default) end the Run at once.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    same_error_limit: int = Field(
        2,
        ge=1,
        le=100,
        description="After this many consecutive failures with the same fingerprint the Run fails with "
        "reason RepeatedFailure instead of retrying: repeating the same error needs new information, "
        "not another try.",
    )


class ResumeRequest(ApiModel):
    """The answer to the Run's pending request; the Run continues from the request's checkpoint."""

    model_config = ConfigDict(
        json_schema_extra=validation_rules(
            cel(
                "self.idempotencyKey != oldSelf.idempotencyKey || self == oldSelf",
                "this spec.resume.idempotencyKey was already used with different parameters: use a new "
                "idempotencyKey for a different answer (repeating the identical resume is fine)",
                reason="FieldValueForbidden",
                field_path=".idempotencyKey",
            )
        )
    )

    request_id: Identifier = Field(
        description="The status.pendingRequest.requestId being answered; an answer to any other request "
        "is rejected."
    )
    checkpoint_id: Identifier = Field(
        description="The status.pendingRequest.checkpointId the answer applies to. It guards against "
        "answering a request that was replaced in the meantime."
    )
    value: FreeJson = Field(
        description="The answer: any JSON value that validates against "
        "status.pendingRequest.acceptedSchema. The agent receives it as the return value of its interrupt. "
        f"At most {RESUME_VALUE_BUDGET // KIB} KiB of JSON: a larger answer is Rejected (ValueTooLarge)."
    )
    idempotency_key: Identifier = Field(
        description="Unique per answer (1 to 128 characters). Sending the same resume again is harmless; "
        "reusing the key with a different answer is refused."
    )
    answered_by: UserName | None = Field(
        None,
        description="Who answers: your user name as the API server knows it (kubectl auth whoami). The "
        "API server refuses any other name whenever this differs from what is stored, and requires it on "
        "an answer to an approval (requestId approve-...). Recorded in status.inputs, status.controls and, "
        "for an approval, on the SideEffect and in the report. A bot answers by impersonating the person "
        "it acts for.",
    )


class RetryRequest(ApiModel):
    """A manual retry of a Failed or NeedsReconciliation Run, keeping its history."""

    model_config = ConfigDict(
        json_schema_extra=validation_rules(
            cel(
                "self.idempotencyKey != oldSelf.idempotencyKey || self == oldSelf",
                "this spec.retryRequest.idempotencyKey was already used with different parameters: use a "
                "new idempotencyKey for a new retry",
                reason="FieldValueForbidden",
                field_path=".idempotencyKey",
            )
        )
    )

    idempotency_key: Identifier = Field(
        description="Unique per retry (1 to 128 characters). Each new key asks for one more Attempt; "
        "sending the same request again changes nothing."
    )
    from_checkpoint: Identifier | None = Field(
        None, description="Checkpoint id to continue from. Defaults to the Run's latest checkpoint."
    )
    reason: FreeText | None = Field(
        None, description="Why the Run is retried, e.g. what was fixed; recorded with the new Attempt."
    )
    requested_by: UserName | None = Field(
        None,
        description="Who asks for the retry: your user name as the API server knows it (kubectl auth "
        "whoami); any other name is refused whenever this differs from what is stored. Recorded in "
        "status.controls.",
    )


class Approvals(ApiModel):
    """Which side effects wait for a person's approval before their first send."""

    irreversible: bool = Field(
        False,
        description="Every irreversible side effect (reversible: false) waits for approval (the Run goes "
        "AuthRequired) before it is sent; the approval is bound to the request's digest.",
    )


class CompensationMode(StrEnum):
    """Whether the operator runs the compensations of a Run's side effects when it ends so."""

    NONE = "None"
    COMPENSATE = "Compensate"


class CompensationPolicy(ApiModel):
    """When the operator undoes what a Run did outside, by running compensation Attempts."""

    on_cancel: CompensationMode = Field(
        CompensationMode.NONE,
        description="Compensate: after a cancel the Run goes CancelRequested -> Compensating -> Cancelled; "
        "compensation Attempts settle the records whose outcome is open with the registered lookups, then "
        "run the compensations of the confirmed reversible side effects, newest first.",
    )
    on_failure: CompensationMode = Field(
        CompensationMode.NONE,
        description="Compensate: when the Run fails for good it goes Compensating -> Failed, undoing its "
        "side effects the same way.",
    )
    max_attempts: int = Field(
        3,
        ge=1,
        le=20,
        description="The most compensation Attempts per compensation, a budget of its own (not counted "
        "in spec.retry.maxAttempts); past it the Run goes NeedsReconciliation (CompensationIncomplete).",
    )


class CompensateRequest(ApiModel):
    """A request to run the compensations of a terminal Run's side effects now."""

    model_config = ConfigDict(
        json_schema_extra=validation_rules(
            cel(
                "self.idempotencyKey != oldSelf.idempotencyKey || self == oldSelf",
                "this spec.compensateRequest.idempotencyKey was already used with other effects: use a new "
                "idempotencyKey for a new compensation",
                reason="FieldValueForbidden",
                field_path=".idempotencyKey",
            )
        )
    )

    idempotency_key: Identifier = Field(
        description="Unique per request (1 to 128 characters). Each new key asks for one compensation; "
        "sending the same request again changes nothing."
    )
    effects: list[Identifier] | None = Field(
        None,
        max_length=MAX_COMPENSATE_EFFECTS,
        description="Idempotency keys of the side effects to compensate (their spec.idempotencyKey); "
        "empty or omitted: all of them. A key that names no side effect of the Run is Rejected.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    requested_by: UserName | None = Field(
        None,
        description="Who asks for the compensation: your user name as the API server knows it (kubectl "
        "auth whoami); any other name is refused whenever this differs from what is stored. Recorded in "
        "status.controls.",
    )


class PauseRequest(ApiModel):
    """A request from outside to pause the Run at its next step boundary."""

    model_config = ConfigDict(
        json_schema_extra=validation_rules(
            cel(
                "self.requestId != oldSelf.requestId || self == oldSelf",
                "this spec.pause.requestId was already used with a different reason: use a new requestId "
                "for a new pause",
                reason="FieldValueForbidden",
                field_path=".requestId",
            )
        )
    )

    request_id: Identifier = Field(
        description="Id of the pause, unique per pause request. The Run waits with a pending request of "
        "this id (reason paused), which spec.resume answers to continue. It is also the pause's "
        "idempotency key."
    )
    reason: FreeText | None = Field(
        None, description="Why the Run should pause; shown to whoever resumes it."
    )


class CancelRequest(ApiModel):
    """Who cancels and why, sent beside the spec.cancelEpoch bump it explains; recorded with op Cancel."""

    model_config = ConfigDict(
        json_schema_extra=validation_rules(
            cel(
                "self.idempotencyKey != oldSelf.idempotencyKey || self == oldSelf",
                "this spec.cancelRequest.idempotencyKey was already used with a different reason: use a "
                "new idempotencyKey for a new cancel",
                reason="FieldValueForbidden",
                field_path=".idempotencyKey",
            )
        )
    )

    idempotency_key: Identifier = Field(
        description="Unique per cancel (1 to 128 characters). Its digest covers the target "
        "spec.cancelEpoch and the reason: sending the same request again changes nothing."
    )
    reason: FreeText | None = Field(
        None, description="Why the Run is cancelled; recorded in status.controls."
    )
    requested_by: UserName | None = Field(
        None,
        description="Who cancels: your user name as the API server knows it (kubectl auth whoami); any "
        "other name is refused whenever this differs from what is stored. Recorded in status.controls.",
    )


MAX_SINK_LENGTH = 512


class NotifySpec(ApiModel):
    """Where the operator tells people that the Run waits for them."""

    sink: Annotated[str, Field(max_length=MAX_SINK_LENGTH, pattern=r"^https?://[^\s]+$")] = Field(
        description="URL that receives a CloudEvent (HTTP binary mode) when the Run waits for a person "
        "(InputRequired, AuthRequired, an approval, NeedsReconciliation). Only a sink on the operator's "
        "allow-list is used; any other is refused (a NotifySinkRefused Event on the Run) and the "
        "operator's default sink, if any, is told instead."
    )


class ForkFrom(ApiModel):
    """Where a forked Run starts: a State checkpoint of another Run of the same namespace."""

    run: RunName = Field(
        description="Name of the source Run, in this Run's namespace (a fork never crosses namespaces); "
        "never this Run itself. A source that was deleted after its archive was written is read from "
        "the archive."
    )
    checkpoint_id: Identifier = Field(
        description="Id of the source's State checkpoint (spec.id) the fork continues from. Its state is "
        "shared, not copied (blobs by digest); the source's SideEffects up to the checkpoint's ledger "
        "mark become the fork's own records, marked status.inheritedFrom."
    )


class PodGC(StrEnum):
    """When the operator deletes an Attempt's Pod (after the tail of its log went to the state store,
    or inline without one: Attempt status.logTail)."""

    ON_ATTEMPT_END = "OnAttemptEnd"  # once the Attempt's outcome is recorded and its Pod has stopped
    ON_RUN_END = "OnRunEnd"  # once the Run is Succeeded, Failed or Cancelled
    NEVER = "Never"  # kept until the Run is deleted


class StateStoreMode(StrEnum):
    """Where the operator keeps agent state (docs/state-store.md), as it says in its start-up log, its
    metric agentrun_state_store_mode and each Run's status.stateStore."""

    BUNDLED = "Bundled"  # the bundled object store: the operator makes each opted-in namespace's access
    EXTERNAL = "External"  # the store its URL names: an administrator provides the namespaces' Secrets
    INLINE = "Inline"  # no store: state stays in the cluster within the byte budgets (a deployer's choice)


class RunSpec(ApiModel):
    """The desired state of a Run, owned by its user."""

    agent: AgentSpec = Field(description="What each Attempt runs.")
    input: FreeJson = Field(
        None,
        description="Any JSON value handed to the agent as its input (ctx.input in the worker SDK). At most "
        f"{RUN_INPUT_BUDGET // KIB} KiB of JSON: the operator fails a Run with a larger input "
        "(InputTooLarge); pass a reference to large data instead.",
    )
    lease: LeaseSpec = defaulted_object(
        LeaseSpec, "How long an Attempt may hold the Run without renewing its lease."
    )
    retry: RetryPolicy = defaulted_object(
        RetryPolicy, "When failed Attempts are retried automatically, and how often."
    )
    deadline_seconds: int | None = Field(
        None,
        ge=1,
        le=2592000,
        description="The Run fails with reason DeadlineExceeded when it has not ended this many seconds "
        "after its creation (at most 30 days). Unlimited when omitted.",
    )
    attempt_timeout_seconds: int | None = Field(
        None,
        ge=1,
        le=2592000,
        description="An Attempt whose agent has run this many seconds (from the Attempt's startTime) is "
        "stopped (its Pod deleted with its grace period, then killed) and fails with class "
        "infrastructure, reason AttemptTimeout; the retry policy decides what follows. Unlimited when "
        "omitted.",
    )
    start_timeout_seconds: int = Field(
        300,
        ge=1,
        le=86400,
        description="How long an attempt Pod may stay unstarted for a reason that may clear (its image "
        "pull backing off, a Secret or ConfigMap it needs missing) before its Attempt fails as deterministic "
        "with reason ImagePullFailed or ConfigMissing, naming what is missing. An image that can never be "
        "pulled (ErrImageNeverPull, InvalidImageName) fails at once (ImageNotFound).",
    )
    progress_timeout_seconds: int | None = Field(
        None,
        ge=1,
        le=2592000,
        description="An Attempt whose agent has not reported progress (ctx.progress(), or any checkpoint, "
        "step, side effect or interrupt) for this many seconds is stopped by its worker and fails with "
        "class infrastructure, reason ProgressTimeout; its worker stops renewing the lease, so a worker "
        "that cannot stop loses its lease. Unlimited when omitted.",
    )
    cancel_epoch: Epoch = Field(
        0,
        description="Raise to cancel the Run: the operator stops the current Attempt and refuses any "
        "result from it. The value only grows (a decrease is refused) and is frozen once the Run is "
        "Succeeded or Cancelled.",
        json_schema_extra=validation_rules(
            cel(
                "self >= oldSelf",
                "spec.cancelEpoch only grows: to cancel, set it to a value greater than the current one",
                reason="FieldValueForbidden",
            )
        ),
    )
    resume: ResumeRequest | None = Field(
        None,
        description="The answer to the Run's pending request (phase InputRequired, AuthRequired or Paused).",
    )
    retry_request: RetryRequest | None = Field(
        None, description="Ask for one more Attempt of a Failed or NeedsReconciliation Run."
    )
    pause: PauseRequest | None = Field(
        None, description="Ask the running agent to pause at its next step boundary."
    )
    approvals: Approvals | None = Field(
        None, description="Side effects that wait for a person's approval before they are sent."
    )
    cancel_request: CancelRequest | None = Field(
        None,
        description="Explains a cancel: set it with the spec.cancelEpoch bump; the operator records it in "
        "status.controls with op Cancel.",
    )
    compensation: CompensationPolicy | None = Field(
        None,
        description="Whether a cancel or a final failure runs the compensations of the Run's side "
        "effects (default: neither; the report then lists what could be compensated).",
    )
    compensate_request: CompensateRequest | None = Field(
        None,
        description="Run the compensations now, on a Succeeded, Failed or Cancelled Run (or one left "
        "NeedsReconciliation by an incomplete compensation); the Run returns to its phase afterwards.",
    )
    notify: NotifySpec | None = Field(
        None,
        description="Where to send the notifications of this Run (default: the operator's default sink).",
    )
    ttl_seconds_after_finished: int | None = Field(
        None,
        ge=-1,
        le=31536000,
        description="Seconds a Succeeded, Failed or Cancelled Run stays after it ended (from the "
        "lastTransitionTime of its Succeeded condition); then the operator writes its archive to the "
        "state store, verifies it and deletes the Run (status.expiresTime says when). -1 keeps the Run; "
        "unset: the operator's default (itself unset: kept). A Run with open side effects or "
        "NeedsReconciliation never expires; without a state store it is kept (condition Archived=False, "
        "NoStateStore).",
    )
    fork_from: ForkFrom | None = Field(
        None,
        description="Start this Run from another Run's State checkpoint instead of from the beginning: "
        "its first Attempt resumes there, and an effect the source confirmed before that checkpoint is "
        "not executed again. Immutable once the Run is created. A source that does not exist fails the "
        "Run before any Attempt (ForkSourceNotFound); a checkpoint that is not a State checkpoint, or "
        "this Run itself, fails it too (ForkSourceInvalid).",
    )
    checkpoint_retention: int = Field(
        20,
        ge=1,
        le=1000,
        description="How many Checkpoints to keep. Older ones are deleted, except the latest, any "
        "that a pending request or an Attempt resumes from, and the ancestors a kept one's state is "
        "rebuilt from (its deltaBase chain).",
    )
    pod_gc: PodGC = Field(
        PodGC.ON_ATTEMPT_END,
        alias="podGC",
        description="When an Attempt's Pod is deleted: OnAttemptEnd (the default: once the Attempt's "
        "outcome is recorded and its Pod has stopped), OnRunEnd (once the Run is Succeeded, Failed or "
        "Cancelled) or Never (kept until the Run is deleted). Before a Pod is deleted the tail of its log "
        "is kept with its Attempt (status.logTail: in the state store, or a short tail inline without "
        "one), for `kubectl agentrun logs`.",
    )


# --- status -------------------------------------------------------------------------------------------


MAX_REQUEST_LIFETIME_SECONDS = 366 * 24 * 3600


class RequestedAction(ApiModel):
    """The side effect an approval request asks about: exactly what is sent once it is approved."""

    tool: str = Field(min_length=1, max_length=MAX_TOOL_LENGTH, description="The tool or API to be called.")
    target: str | None = Field(
        None, max_length=MAX_REFERENCE_LENGTH, description="What the action acts on, e.g. a project or a URL."
    )
    idempotency_key: Identifier = Field(
        description="The action's idempotency key: its SideEffect is sfx-<hash of the Run and this key>."
    )
    request: FreeJson = Field(
        None,
        description="What the agent asks to send (any JSON), shown to the person approving; at most "
        f"{ACTION_REQUEST_BUDGET // KIB} KiB of JSON, else omitted (requestBytes says how large it is) "
        "and only requestDigest binds it.",
    )
    request_bytes: int | None = Field(
        None,
        ge=0,
        description="Set when the request was too large to show here: its size in bytes of JSON.",
    )
    request_digest: Digest = Field(
        description="sha256:<hex> of the RFC 8785 canonical JSON of {tool, target, request}: the approval "
        "binds to it (the request id carries its first digits), so an approval of one request never "
        "approves another; recompute it before approving."
    )
    reversible: bool | None = Field(
        None, description="Whether the action can be undone by a compensation; false: it cannot be undone."
    )


class PendingRequest(ApiModel):
    """What the Run is waiting for: answer it with spec.resume."""

    request_id: Identifier = Field(description="Id of the request; spec.resume.requestId must match it.")
    reason: InterruptReason = Field(
        description="Why the Run waits: input_required, auth_required (an approval) or paused."
    )
    checkpoint_id: Identifier = Field(
        description="The checkpoint the Run continues from once answered; spec.resume.checkpointId must "
        "match it."
    )
    prompt: str | None = Field(None, max_length=4096, description="The question, for the person answering.")
    accepted_schema: FreeJsonObject | None = Field(
        None,
        description="A JSON Schema that spec.resume.value must satisfy; at most "
        f"{ACCEPTED_SCHEMA_BUDGET // KIB} KiB of JSON.",
        json_schema_extra={"maxProperties": 64},
    )
    expires_in_seconds: int | None = Field(
        None,
        ge=1,
        le=MAX_REQUEST_LIFETIME_SECONDS,
        description="How long the request stays open, as the worker asked; the operator turns it into "
        "expiresAt on its own clock when it first sees the request.",
    )
    expires_at: datetime | None = Field(
        None,
        description="After this time (RFC 3339) an answer is refused and the Run fails with class "
        "input_expired. Set by the operator from expiresInSeconds (never by a worker: clocks differ).",
    )
    action: RequestedAction | None = Field(
        None,
        description="For an approval (reason auth_required, requestId approve-...): the action it "
        "approves, written by the worker with the request.",
    )
    hold_seconds: int | None = Field(
        None,
        ge=1,
        le=3600,
        description="How long the asking Attempt keeps its lease and waits for the answer (its hold "
        "window): an answer accepted within it continues the same Attempt, without a new Pod.",
    )
    held_by: AttemptName | None = Field(
        None,
        description="The Attempt that holds this request and waits for its answer. Its worker clears it "
        "when the hold ends (a preconditioned write); an answer accepted before that continues it, one "
        "accepted after starts a new Attempt.",
    )


class RecordedInput(ApiModel):
    """A resume input the operator accepted."""

    request_id: Identifier = Field(description="The request that was answered.")
    checkpoint_id: Identifier = Field(description="The checkpoint the Run continued from.")
    digest: Digest = Field(description="sha256 of the canonical JSON of the answer (sha256:<hex>).")
    idempotency_key: Identifier = Field(description="The idempotencyKey of the resume.")
    answered_by: UserName | None = Field(
        None, description="Who answered (spec.resume.answeredBy, checked by the API server)."
    )
    reason: InterruptReason | None = Field(
        None,
        description="The reason of the request it answered (input_required, auth_required, paused): an "
        "answer to a pause never answers the agent's own question.",
    )
    time: datetime = Field(description="When the input was accepted (RFC 3339).")


class AcceptedInput(ApiModel):
    """The value of the newest accepted resume input, as accepted."""

    request_id: Identifier = Field(description="The request it answered (an entry of status.inputs).")
    idempotency_key: Identifier = Field(description="The idempotencyKey of the resume that brought it.")
    value: FreeJson = Field(
        description="The answer, as it was in spec.resume.value when the operator accepted it (its digest "
        f"is the status.inputs entry's). At most {RESUME_VALUE_BUDGET // KIB} KiB of JSON."
    )


class SpentKey(ApiModel):
    """An idempotency key the operator has processed: never processed again with other parameters."""

    key: Annotated[str, Field(min_length=1, max_length=MAX_REMEMBERED_KEY_LENGTH)] = Field(
        description=f"The key as written when it has at most {MAX_REMEMBERED_KEY_LENGTH} characters, else "
        "sha256:<first 32 hex digits> of it."
    )
    op: ControlOp = Field(
        description="The operation it was spent on: Resume, Retry, Pause, Cancel or Compensate."
    )
    digest: ShortDigest = Field(
        description="sha256:<first 32 hex digits> of the request's canonical JSON: a request with the same "
        "key and another digest is Rejected (IdempotencyKeyReused)."
    )


class ControlRecord(ApiModel):
    """The outcome of one control request; a repeat of the same key changes nothing."""

    idempotency_key: Identifier = Field(
        description="Key of the request (for a pause, its requestId); at most one record per key."
    )
    op: ControlOp = Field(description="The operation: Resume, Retry, Pause, Cancel or Compensate.")
    digest: Digest = Field(
        description="sha256 of the request's canonical JSON, to recognise a repeat of the same key."
    )
    outcome: ControlOutcome = Field(description="Accepted or Rejected.")
    reason: Reason | None = Field(
        None,
        description="CamelCase reason of the outcome, e.g. Accepted, UnknownRequest, SchemaMismatch or "
        "IdempotencyKeyReused.",
    )
    message: str | None = Field(
        None, max_length=MAX_CONTROL_MESSAGE_LENGTH, description="What happened, for people."
    )
    requested_by: UserName | None = Field(
        None,
        description="Who sent the request, as it named them (spec.resume.answeredBy, or requestedBy of "
        "spec.cancelRequest, spec.retryRequest or spec.compensateRequest; checked by the API server).",
    )
    time: datetime = Field(description="When the request was processed (RFC 3339).")


class CompensationProgress(ApiModel):
    """The compensation under way (phase Compensating), or the last one that did not complete."""

    return_phase: Literal["Succeeded", "Failed", "Cancelled"] = Field(
        description="The phase the Run returns to once its side effects are compensated."
    )
    first_attempt: int = Field(
        ge=1,
        le=MAX_EPOCH,
        description="Number of the compensation's first Attempt: spec.compensation.maxAttempts counts "
        "the Attempts from it on.",
    )
    effects: list[Identifier] | None = Field(
        None,
        max_length=MAX_COMPENSATE_EFFECTS,
        description="Idempotency keys of the side effects to compensate; omitted: all of them.",
    )


class CommitRecord(ApiModel):
    """Who committed the Run's result, with the fence values the write was checked against."""

    attempt: AttemptName = Field(description="Name of the Attempt that committed the result.")
    lease_epoch: Epoch = Field(description="The lease epoch the Attempt held; equals status.leaseEpoch.")
    cancel_epoch: Epoch = Field(
        description="The cancel epoch the Attempt was granted with; equals spec.cancelEpoch."
    )


class RunFailure(FailureInfo):
    """Why the Run failed."""

    reason: Reason | None = Field(
        None,
        description="CamelCase reason, e.g. RetryBudgetExhausted, RepeatedFailure or DeadlineExceeded.",
    )


class SideEffectCounts(ApiModel):
    """How many of the Run's external side effects are in each state that matters after the Run."""

    confirmed: int = Field(0, ge=0, description="Side effects that happened.")
    compensated: int = Field(0, ge=0, description="Side effects that happened and were undone.")
    unknown: int = Field(
        0, ge=0, description="Side effects whose outcome nobody knows yet; a person must resolve them."
    )
    irreversible: int = Field(
        0, ge=0, description="Confirmed side effects that cannot be undone (no compensation)."
    )


MAX_REPORT_NOTE_LENGTH = 256


class ReportedEffect(ApiModel):
    """One external side effect of the Run, as the final report states it."""

    name: ObjectName = Field(description="Name of the SideEffect object with the full record.")
    tool: str = Field(max_length=128, description="The tool that caused the effect.")
    target: str | None = Field(None, max_length=MAX_REFERENCE_LENGTH, description="What the effect acted on.")
    state: SideEffectState = Field(
        description="Final state: Confirmed, Compensated, Failed, Unknown or Pending."
    )
    external_reference: str | None = Field(
        None,
        max_length=MAX_REFERENCE_LENGTH,
        description="The external system's id of the effect, e.g. a ticket number.",
    )
    reversible: bool = Field(description="Whether the effect can be undone by its compensation.")
    note: str | None = Field(
        None,
        max_length=MAX_REPORT_NOTE_LENGTH,
        description="For an effect whose outcome is not Confirmed: why, e.g. it was in flight when the Run "
        "was cancelled, or the reason the ledger stopped.",
    )
    approved_by: UserName | None = Field(
        None, description="Who approved the effect before it was sent, for an effect that waited for one."
    )
    resolved_by: ResolverName | None = Field(
        None,
        description="Who established an outcome nobody knew: a person's user name, or the lookup that "
        "found it (lookup by <attempt>).",
    )
    inherited: bool | None = Field(
        None,
        description="True for a forked Run's record inherited from its source (SideEffect "
        "status.inheritedFrom): the source's action, reused by this Run, never executed nor compensated "
        "by it; listed in none of happened, compensated and cannotBeUndone.",
    )


class RunReport(ApiModel):
    """What the Run did to the outside world: what happened, what was compensated, what cannot be undone."""

    effects: list[ReportedEffect] = Field(
        default_factory=list,
        max_length=MAX_REPORTED_EFFECTS,
        description="The side effects, oldest first. Confirmed and not reversible means it cannot be "
        "undone; Unknown means nobody knows whether it happened.",
    )
    omitted: int = Field(
        0, ge=0, description="Side effects left out of the list to bound its size; see the SideEffects."
    )
    happened: list[SideEffectName] | None = Field(
        None,
        max_length=MAX_REPORTED_EFFECTS,
        description="SideEffects that happened and stand (Confirmed), oldest first.",
    )
    compensated: list[SideEffectName] | None = Field(
        None,
        max_length=MAX_REPORTED_EFFECTS,
        description="SideEffects that happened and were undone by their compensation.",
    )
    cannot_be_undone: list[SideEffectName] | None = Field(
        None,
        max_length=MAX_REPORTED_EFFECTS,
        description="SideEffects that happened and have no compensation that undoes them (irreversible).",
    )
    unknown: list[SideEffectName] | None = Field(
        None,
        max_length=MAX_REPORTED_EFFECTS,
        description="SideEffects whose outcome nobody knows yet (Pending or Unknown): a person resolves "
        "them.",
    )


class ForkSource(ApiModel):
    """The source a forked Run started from, as the operator resolved it before its first Attempt."""

    run: RunName = Field(description="Name of the source Run.")
    uid: str = Field(
        min_length=1,
        max_length=64,
        description="UID of the source Run (a later Run of that name is another).",
    )
    checkpoint_id: Identifier = Field(description="The source's State checkpoint the fork continues from.")
    ledger_mark: Epoch = Field(
        description="The checkpoint's ledger mark: the source's SideEffects with a ledgerSequence up to it "
        "were inherited."
    )
    inherited: int = Field(0, ge=0, description="How many of the source's SideEffects the fork inherited.")
    archived: bool = Field(
        False, description="True when the source was read from its archive (the Run itself was gone)."
    )


# Counters the fences are built on: a write that lowers or removes one would reopen an old epoch.
MONOTONIC_STATUS_FIELDS: Final = ("attempts", "currentAttempt", "leaseEpoch", "observedCancelEpoch")


class RunStatus(ApiModel):
    """The observed state of a Run, written by the operator (and the fenced commit by the worker)."""

    model_config = ConfigDict(
        json_schema_extra=validation_rules(
            *(
                cel(
                    f"!has(oldSelf.{field}) || (has(self.{field}) && self.{field} >= oldSelf.{field})",
                    f"status.{field} never decreases nor disappears: the fences compare epochs with it",
                    reason="FieldValueForbidden",
                    field_path=f".{field}",
                )
                for field in MONOTONIC_STATUS_FIELDS
            )
        )
    )

    phase: RunPhase | None = Field(None, description="Where the Run is in its life cycle.")
    observed_generation: int | None = Field(
        None, ge=0, description="The metadata.generation of the spec the operator last acted on."
    )
    message: Message | None = Field(None, description="A human-readable summary of the current phase.")
    conditions: list[Condition] | None = Field(
        None,
        max_length=MAX_CONDITIONS,
        description="The same facts as the phase for tools, per the API conventions: Succeeded, "
        "Waiting, CancelRequested, LeaseHeld; and Archived=False when a finished Run cannot be archived "
        "(NoStateStore) or its archive is delayed.",
        json_schema_extra=CONDITIONS_SCHEMA,
    )
    attempts: int | None = Field(
        None, ge=0, le=MAX_EPOCH, description="How many Attempts the Run has started."
    )
    state_store: StateStoreMode | None = Field(
        None,
        description="Where the operator keeps agent state, written with each phase change: Bundled (the "
        "bundled object store, the namespace's access made by the operator), External (the store the "
        "operator's URL names) or Inline (no store: state stays in the cluster within its byte budgets, "
        "finished Runs are never archived).",
    )
    current_attempt: int | None = Field(
        None,
        ge=1,
        le=MAX_EPOCH,
        description="Number of the latest Attempt; its Attempt object is named <run>-a<number>.",
    )
    lease_epoch: Epoch | None = Field(
        None,
        description="The epoch of the lease the current Attempt holds. It grows with every takeover; a "
        "write carrying an older epoch comes from a stale worker and is refused.",
    )
    observed_cancel_epoch: Epoch | None = Field(
        None, description="The spec.cancelEpoch the operator last acted on."
    )
    next_attempt_time: datetime | None = Field(
        None,
        description="In phase RetryBackoff: when the next Attempt starts (RFC 3339), after capped "
        "exponential backoff with jitter.",
    )
    latest_checkpoint: Identifier | None = Field(
        None, description="Id of the latest Checkpoint: where the next Attempt continues."
    )
    pending_request: PendingRequest | None = Field(
        None, description="The request the Run waits for; answer it with spec.resume."
    )
    inputs: list[RecordedInput] | None = Field(
        None,
        max_length=MAX_RECORDED_CONTROLS,
        description="The most recent accepted resume inputs, one per request.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["requestId"]},
    )
    accepted_input: AcceptedInput | None = Field(
        None,
        description="The value of the newest accepted input, kept by the operator: an Attempt that starts or "
        "continues with that answer takes it from here, since the next answer may replace spec.resume before "
        "then (the key of an accepted resume is spent, so the API server lets a new answer replace it).",
    )
    controls: list[ControlRecord] | None = Field(
        None,
        max_length=MAX_RECORDED_CONTROLS,
        description="The outcome of the most recent control requests, one per idempotencyKey.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["idempotencyKey"],
        },
    )
    spent_keys: list[SpentKey] | None = Field(
        None,
        max_length=MAX_SPENT_KEYS,
        description=f"Every idempotency key processed so far (up to {MAX_SPENT_KEYS}), whatever came "
        "between: a key is never processed again with other parameters (IdempotencyKeyReused); past the "
        "bound a new key is Rejected (KeyMemoryFull), nothing is forgotten silently.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["key"]},
    )
    result: FreeJsonObject | None = Field(
        None,
        description="The agent's result, a JSON object. The API server only accepts it from the lease "
        "holder: committedBy must carry the current lease and cancel epochs. At most "
        f"{RESULT_BUDGET // KIB} KiB of JSON (the SDK refuses a larger one). With a state store "
        "configured, a result over the inline threshold (16 KiB) is in resultRef, and this field is "
        "absent.",
        json_schema_extra={"maxProperties": 256},
    )
    result_ref: BlobRef | None = Field(
        None,
        description="The agent's result stored in the agent-state store, when it is over the inline "
        "threshold: written with committedBy under the same commit fence as result (only the lease "
        "holder's Pod, with the current epochs). Readers fetch the blob and verify its size and sha256.",
    )
    committed_by: CommitRecord | None = Field(
        None, description="Who committed the result, under which fences."
    )
    failure: RunFailure | None = Field(None, description="Why the Run failed, when it did.")
    side_effects: SideEffectCounts | None = Field(
        None, description="Counts of the Run's external side effects by what became of them."
    )
    report: RunReport | None = Field(
        None, description="Once the Run has ended: the list of its external side effects and their fate."
    )
    compensating: CompensationProgress | None = Field(
        None,
        description="The compensation under way (phase Compensating), or the one that left the Run "
        "NeedsReconciliation (CompensationIncomplete); cleared when the Run returns to its phase.",
    )
    usage: Usage | None = Field(
        None,
        description="The sum of its Attempts' usage (failed Attempts included), written by the operator.",
    )
    expires_time: datetime | None = Field(
        None,
        description="When the operator archives and deletes this finished Run (spec.ttlSecondsAfterFinished "
        "or the operator's default); absent while it is kept.",
    )
    fork: ForkSource | None = Field(
        None,
        description="For a Run with spec.forkFrom: the source Run (with its uid) and checkpoint it started "
        "from, and how many SideEffects it inherited.",
    )
    checkpoint_index: BlobRef | None = Field(
        None,
        description="Once the Run has ended (Succeeded, Failed or Cancelled) with a state store configured: "
        "its Checkpoint index in the store (every Checkpoint's id, parent, kind, step, attempt, lease epoch, "
        "sequence and thread, and its state as a blob reference), a document whose references the store's "
        "collector follows (links). Written by the operator before it deletes the superseded Checkpoints and "
        "the Lease; `kubectl agentrun describe` and `state` read a compacted Run's Checkpoints from it.",
    )


# --- the object ---------------------------------------------------------------------------------------


class Run(KubernetesObject):
    """A durable piece of agent work. The operator runs it as a series of Attempts, each a Pod, that
    continue from Checkpoints; it can be interrupted and resumed, retried and cancelled, and records
    every external side effect in SideEffects."""

    plural: ClassVar[str] = "runs"
    short_name: ClassVar[str] = "arun"
    printer_columns: ClassVar[tuple[PrinterColumn, ...]] = (
        PrinterColumn("Phase", ".status.phase", "string", "Where the Run is in its life cycle."),
        PrinterColumn("Attempt", ".status.currentAttempt", "integer", "Number of the latest Attempt."),
        PrinterColumn("Lease Epoch", ".status.leaseEpoch", "integer", "Epoch of the current lease."),
        PrinterColumn("Cancel Epoch", ".spec.cancelEpoch", "integer", "Raised to cancel the Run."),
        PrinterColumn("Waiting For", ".status.pendingRequest.requestId", "string", "The request to answer."),
        PrinterColumn(
            "Held By", ".status.pendingRequest.heldBy", "string", "The Attempt that holds the request."
        ),
        PrinterColumn("Message", ".status.message", "string", "Summary of the phase.", priority=1),
    )
    model_config = ConfigDict(
        json_schema_extra=validation_rules(
            cel(
                f"size(self.metadata.name) <= {MAX_RUN_NAME_LENGTH}",
                f"a Run name has at most {MAX_RUN_NAME_LENGTH} characters, so that the names derived from "
                "it (Attempt <run>-a<number>, its Pod, the Lease, label values of at most 63 characters) "
                "stay valid: choose a shorter metadata.name",
            ),
            cel(
                "!has(self.spec.forkFrom) || self.spec.forkFrom.run != self.metadata.name",
                "spec.forkFrom.run names this Run itself: a Run forks from another Run's checkpoint",
                reason="FieldValueInvalid",
                field_path=".spec.forkFrom.run",
            ),
            cel(
                "has(self.spec.forkFrom) == has(oldSelf.spec.forkFrom)"
                " && (!has(self.spec.forkFrom) || self.spec.forkFrom == oldSelf.spec.forkFrom)",
                "spec.forkFrom is immutable: it is set when the Run is created and never changed or "
                "removed; create another Run to fork from another checkpoint",
                reason="FieldValueForbidden",
                field_path=".spec.forkFrom",
            ),
            cel(
                "!has(oldSelf.status) || !has(oldSelf.status.phase)"
                f" || !(oldSelf.status.phase in {cel_list(CANCEL_FROZEN_PHASES)})"
                " || self.spec.cancelEpoch == oldSelf.spec.cancelEpoch",
                "spec.cancelEpoch cannot change once the Run is Succeeded or Cancelled (it has ended), nor "
                "while it is Compensating (a compensation runs to its end)",
                reason="FieldValueForbidden",
                field_path=".spec.cancelEpoch",
            ),
            # One answer at a time: the second of two people answering at once is refused here (a merge
            # patch would otherwise overwrite the first answer before the operator saw it). A key the
            # operator processed is in spentKeys (as written when short) or in controls (the newest).
            cel(
                "!has(oldSelf.spec.resume)"
                " || (has(self.spec.resume) && self.spec.resume == oldSelf.spec.resume)"
                " || (has(oldSelf.status) && ((has(oldSelf.status.spentKeys)"
                " && oldSelf.status.spentKeys.exists(k, k.key == oldSelf.spec.resume.idempotencyKey))"
                " || (has(oldSelf.status.controls) && oldSelf.status.controls.exists("
                "c, c.idempotencyKey == oldSelf.spec.resume.idempotencyKey))))",
                "spec.resume holds an answer the operator has not processed yet: it cannot be replaced or "
                "removed until its outcome is in status.controls; read the Run again and answer only if its "
                "request is still pending",
                reason="FieldValueForbidden",
                field_path=".spec.resume",
                message_expression=(
                    "'spec.resume holds an answer to ' + oldSelf.spec.resume.requestId + ' (idempotencyKey '"
                    " + oldSelf.spec.resume.idempotencyKey"
                    " + (has(oldSelf.spec.resume.answeredBy) ? ', by ' + oldSelf.spec.resume.answeredBy : '')"
                    " + ') that the operator has not processed yet: it cannot be replaced or removed until"
                    " its outcome is in status.controls; read the Run again (kubectl agentrun describe '"
                    " + self.metadata.name + ') and answer only if its request is still pending'"
                ),
            ),
            # The server-side backstop of the commit fence. A result that stays as it was, under the
            # same committedBy, stays valid when the epochs move on (a later takeover, a cancel).
            # committedBy must stay equal too because CEL compares free-form objects only by their
            # shared keys: a writer that swaps the result also writes its own (stale) committedBy.
            cel(
                "!has(self.status) || !has(self.status.result)"
                " || (has(oldSelf.status) && has(oldSelf.status.result)"
                " && has(oldSelf.status.committedBy) && has(self.status.committedBy)"
                " && oldSelf.status.result == self.status.result"
                " && oldSelf.status.committedBy == self.status.committedBy)"
                " || (has(self.status.committedBy) && has(self.status.leaseEpoch)"
                " && self.status.committedBy.cancelEpoch == self.spec.cancelEpoch"
                " && self.status.committedBy.leaseEpoch == self.status.leaseEpoch)",
                # Named StaleWorker, like the admission policies' fence refusals: the SDK classifies it.
                RefusalCause.STALE_WORKER.says(
                    "status.result can only be written by the current lease holder: status.committedBy "
                    "must have cancelEpoch equal to spec.cancelEpoch and leaseEpoch equal to "
                    "status.leaseEpoch (a result from a cancelled or superseded Attempt is refused)"
                ),
                reason="FieldValueForbidden",
                field_path=".status.result",
            ),
            # The same fence for a result stored in the state store: its reference is the result.
            cel(
                "!has(self.status) || !has(self.status.resultRef)"
                " || (has(oldSelf.status) && has(oldSelf.status.resultRef)"
                " && has(oldSelf.status.committedBy) && has(self.status.committedBy)"
                " && oldSelf.status.resultRef == self.status.resultRef"
                " && oldSelf.status.committedBy == self.status.committedBy)"
                " || (has(self.status.committedBy) && has(self.status.leaseEpoch)"
                " && self.status.committedBy.cancelEpoch == self.spec.cancelEpoch"
                " && self.status.committedBy.leaseEpoch == self.status.leaseEpoch)",
                "status.resultRef can only be written by the current lease holder: status.committedBy "
                "must have cancelEpoch equal to spec.cancelEpoch and leaseEpoch equal to status.leaseEpoch "
                "(a result from a cancelled or superseded Attempt is refused)",
                reason="FieldValueForbidden",
                field_path=".status.resultRef",
            ),
        )
    )

    kind: Literal["Run"] = Field("Run", description="Run.")
    spec: RunSpec = Field(description="What to run and how: set by the user.")
    status: RunStatus = Field(
        default_factory=RunStatus, description="What happened so far: set by the operator and the worker."
    )
