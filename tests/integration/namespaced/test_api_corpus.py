"""A corpus of bad input, sent to a real API server: every case is refused with a message that says what
to fix, and nothing is stored (a refused create leaves no object, a refused update leaves the object as
it was). Together the cases hit every CEL rule of the CRDs (checked below), plus the OpenAPI bounds:
wrong types, missing fields, unknown enum values, negative numbers and oversized strings."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from agentrun.api.run import MONOTONIC_STATUS_FIELDS
from support.agentrun import Api, Rule, crd_rules, rule
from support.corpus import (
    BAD_OBJECTS,
    BAD_POD_TEMPLATES,
    BAD_RUNS,
    DELETE,
    GOOD_POD_TEMPLATES,
    VALID_OBJECTS,
    bad_input_id,
    valid_object,
    with_changes,
)
from support.kube import Kube

pytestmark = pytest.mark.cluster


Expect = str | Rule


@dataclass(frozen=True)
class Write:
    """A JSON merge patch: of the object (spec, metadata) or, through the status subresource, of status."""

    to: Literal["object", "status"]
    patch: dict[str, Any] | None


def spec(**fields: Any) -> Write:
    return Write("object", {"spec": fields})


def status(**fields: Any) -> Write:
    return Write("status", fields)


@dataclass(frozen=True)
class Bad:
    kind: str
    expect: tuple[Expect, ...]
    name: str | None = None  # for a create: the name to try (default: a fresh one)
    changes: dict[str, Any] = field(default_factory=dict)  # to the valid object, before it is sent
    setup: tuple[Write, ...] = ()  # accepted writes that bring an existing object into shape
    write: Write | None = None  # the refused write; None: the create itself is refused


def created(kind: str, changes: dict[str, Any], *expect: Expect, name: str | None = None) -> Bad:
    return Bad(kind, expect, name=name, changes=changes)


def updated(
    kind: str,
    write: Write,
    *expect: Expect,
    base: dict[str, Any] | None = None,
    setup: tuple[Write, ...] = (),
) -> Bad:
    return Bad(kind, expect, changes=base or {}, setup=setup, write=write)


# The rules, looked up in crds/ so the assertions follow the messages the CRDs actually carry.
AGENT_NEEDS_IMAGE = rule("Run", ".spec.agent")
ENV_VALUE_OR_VALUE_FROM = rule("Run", ".spec.agent.env[*]")
ENV_ONE_SOURCE = rule("Run", ".spec.agent.env[*].valueFrom")
RENEW_BEFORE_EXPIRY = rule("Run", ".spec.lease")
BACKOFF_WITHIN_CAP = rule("Run", ".spec.retry.backoff")
RUN_NAME_LENGTH = rule("Run", "", "size(self.metadata.name)")
CANCEL_EPOCH_GROWS = rule("Run", ".spec.cancelEpoch")
CANCEL_EPOCH_FROZEN = rule("Run", "", "oldSelf.status.phase")
RESUME_KEY_REUSED = rule("Run", ".spec.resume")
FORK_NOT_ITSELF = rule("Run", "", "self.spec.forkFrom.run != self.metadata.name")
FORK_FROZEN = rule("Run", "", "has(oldSelf.spec.forkFrom)")
FORK = {"run": "source", "checkpointId": "source-a1-s2"}
ONE_ANSWER_AT_A_TIME = rule("Run", "", "oldSelf.status.spentKeys")
RETRY_KEY_REUSED = rule("Run", ".spec.retryRequest")
PAUSE_ID_REUSED = rule("Run", ".spec.pause")
RESULT_FENCED = rule("Run", "", "has(self.status.result)")
RESULT_REF_FENCED = rule("Run", "", "self.status.resultRef")
STORED_RESULT = {"key": "runs/ns/uid/sha256/" + "1" * 64, "sha256": "1" * 64, "size": 40000}
ATTEMPT_SPEC_IMMUTABLE = rule("Attempt", ".spec")
ATTEMPT_PHASE_FINAL = rule("Attempt", ".status.phase")
ATTEMPT_PHASE_KEPT = rule("Attempt", "", "has(self.status.phase)")
CHECKPOINT_IMMUTABLE = rule("Checkpoint", ".spec")
SIDE_EFFECT_SPEC_IMMUTABLE = rule("SideEffect", ".spec")
LEDGER_TRANSITION = rule("SideEffect", ".status.state")
LEDGER_RESOLVED_BY = rule("SideEffect", ".status", "oldSelf.state != 'Unknown'")
LEDGER_AGAIN_AFTER_ABSENT = rule("SideEffect", ".status", "resolvedSends")
LEDGER_RESOLUTION_BY = rule("SideEffect", ".status", "has(self.resolution)")
LEDGER_STARTS_PENDING = rule("SideEffect", "", "'Compensated'")
LEDGER_STATUS_KEPT = rule("SideEffect", "", "|| has(self.status)")
BOUNDED_LIMIT_KEYS = rule("Run", ".spec.agent.resources.limits")
BOUNDED_REQUEST_KEYS = rule("Run", ".spec.agent.resources.requests")
BOUNDED_LABEL_KEYS = rule("Run", ".spec.agent.podTemplate.metadata.labels")
BOUNDED_ANNOTATION_KEYS = rule("Run", ".spec.agent.podTemplate.metadata.annotations")

POD_SPEC = ".spec.agent.podTemplate.spec"
POD_TEMPLATE_RULES = {
    **{f: rule("Run", POD_SPEC, f"self.{f}") for f in ("serviceAccountName", "nodeName", "hostNetwork")},
    **{f: rule("Run", POD_SPEC, f"self.{f}") for f in ("hostPID", "hostIPC", "volumes")},
    "serviceAccount": rule("Run", POD_SPEC, "!has(self.serviceAccount)"),
    **{f: rule("Run", f"{POD_SPEC}.{f}[*]") for f in ("containers", "initContainers", "ephemeralContainers")},
}

RESUME = {
    "requestId": "req-1",
    "checkpointId": "ckpt-2",
    "value": {"approved": True},
    "idempotencyKey": "k-1",
}
RETRY = {"idempotencyKey": "retry-1", "reason": "the API is back"}
CANCEL = {"idempotencyKey": "cancel-1", "reason": "not needed any more"}
PAUSE = {"requestId": "pause-1", "reason": "maintenance"}
FIELD_REF = {"fieldRef": {"fieldPath": "metadata.name"}}
SECRET_REF = {"secretKeyRef": {"name": "llm", "key": "token"}}
DIGEST = "sha256:" + "0" * 64


def pod_template(**metadata: dict[str, str]) -> dict[str, Any]:
    return {"metadata": metadata, "spec": {"containers": [{"name": "agent", "image": "agentrun/agent:dev"}]}}


def committed_by(lease_epoch: int, cancel_epoch: int) -> dict[str, Any]:
    return {"attempt": "echo-a1", "leaseEpoch": lease_epoch, "cancelEpoch": cancel_epoch}


BAD_INPUT: dict[str, Bad] = {
    # --- Run: missing fields and wrong types -----------------------------------------------------------
    "a Run without spec.agent is refused because the field is required": created(
        "Run", {".spec.agent": DELETE}, "spec.agent: Required value"
    ),
    "a Run whose agent has neither image nor podTemplate is told to add one": created(
        "Run", {".spec.agent": {"command": ["python", "-m", "agent"]}}, AGENT_NEEDS_IMAGE
    ),
    "a Run with maxAttempts written as a word is told it must be an integer": created(
        "Run", {".spec.retry.maxAttempts": "three"}, "spec.retry.maxAttempts", "must be of type integer"
    ),
    "a Run whose command is one string instead of a list is told it must be an array": created(
        "Run", {".spec.agent.command": "python -m agent"}, "spec.agent.command", "must be of type array"
    ),
    "a resume without an idempotencyKey is refused because the key is required": created(
        "Run",
        {".spec.resume": RESUME, ".spec.resume.idempotencyKey": DELETE},
        "spec.resume.idempotencyKey: Required",
    ),
    "a resume without a value is refused because the answer is required": created(
        "Run",
        {".spec.resume": {"requestId": "r", "checkpointId": "c", "idempotencyKey": "k"}},
        "spec.resume.value: Required value",
    ),
    "a retryRequest without an idempotencyKey is refused because the key is required": created(
        "Run", {".spec.retryRequest": {"reason": "again"}}, "spec.retryRequest.idempotencyKey: Required value"
    ),
    # --- Run: bounds ----------------------------------------------------------------------------------
    "a Run with maxAttempts 0 is told at least one attempt is needed": created(
        "Run", {".spec.retry.maxAttempts": 0}, "spec.retry.maxAttempts", "greater than or equal to 1"
    ),
    "a Run with maxAttempts 101 is told the limit is 100": created(
        "Run", {".spec.retry.maxAttempts": 101}, "spec.retry.maxAttempts", "less than or equal to 100"
    ),
    "a Run with a negative lease duration is told the minimum of 5 seconds": created(
        "Run",
        {".spec.lease.durationSeconds": -60},
        "spec.lease.durationSeconds",
        "greater than or equal to 5",
    ),
    "a Run with a lease longer than an hour is told the maximum": created(
        "Run",
        {".spec.lease.durationSeconds": 3601},
        "spec.lease.durationSeconds",
        "less than or equal to 3600",
    ),
    "a Run with a negative renew interval is told the minimum": created(
        "Run", {".spec.lease.renewSeconds": -1}, "spec.lease.renewSeconds", "greater than or equal to 1"
    ),
    "a Run that renews its lease only when it expires is told to renew sooner": created(
        "Run", {".spec.lease": {"durationSeconds": 30, "renewSeconds": 30}}, RENEW_BEFORE_EXPIRY
    ),
    "a Run whose lease is shorter than the default renew interval is told to renew sooner": created(
        "Run", {".spec.lease": {"durationSeconds": 10}}, RENEW_BEFORE_EXPIRY
    ),
    "a Run with a negative deadline is refused": created(
        "Run", {".spec.deadlineSeconds": -1}, "spec.deadlineSeconds", "greater than or equal to 1"
    ),
    "a Run with a deadline beyond 30 days is refused": created(
        "Run", {".spec.deadlineSeconds": 2592001}, "spec.deadlineSeconds", "less than or equal to 2592000"
    ),
    "a Run with a negative cancelEpoch is refused": created(
        "Run", {".spec.cancelEpoch": -1}, "spec.cancelEpoch", "greater than or equal to 0"
    ),
    "a Run that would keep no checkpoint is refused": created(
        "Run", {".spec.checkpointRetention": 0}, "spec.checkpointRetention", "greater than or equal to 1"
    ),
    "a Run whose backoff starts above its cap is told to fix the order": created(
        "Run", {".spec.retry.backoff": {"initialSeconds": 600, "maxSeconds": 60}}, BACKOFF_WITHIN_CAP
    ),
    "a Run whose backoff would shrink is refused": created(
        "Run", {".spec.retry.backoff.factor": 0.5}, "spec.retry.backoff.factor", "greater than or equal to 1"
    ),
    "a Run with a 513 character image is told the 512 character limit": created(
        "Run", {".spec.agent.image": "x" * 513}, "spec.agent.image: Too long", "512"
    ),
    "a resume idempotencyKey of 129 characters is told the 128 character limit": created(
        "Run",
        {".spec.resume": {**RESUME, "idempotencyKey": "k" * 129}},
        "spec.resume.idempotencyKey: Too long",
        "128",
    ),
    "a retry reason longer than 1024 characters is refused": created(
        "Run", {".spec.retryRequest": {**RETRY, "reason": "x" * 1025}}, "spec.retryRequest.reason: Too long"
    ),
    "a command of 33 words is told the limit": created(
        "Run", {".spec.agent.command": ["x"] * 33}, "spec.agent.command: Too many", "at most 32"
    ),
    # --- byte budgets: every bound that keeps a Run's declared maxima inside etcd's limit -----------------
    "an env value of 2049 characters is told the 2048 character limit": created(
        "Run",
        {".spec.agent.env": [{"name": "BIG", "value": "x" * 2049}]},
        "spec.agent.env[0].value: Too long",
    ),
    "a cancelEpoch past an int32 is refused": created(
        "Run", {".spec.cancelEpoch": 2**31}, "spec.cancelEpoch", "less than or equal to 2147483647"
    ),
    "a result with 257 keys is refused": updated(
        "Run",
        status(result={f"k{n}": n for n in range(257)}, committedBy=committed_by(0, 0), leaseEpoch=0),
        "status.result: Too many",
    ),
    "a resource limit named with 318 characters is told the key limit": created(
        "Run", {".spec.agent.resources": {"limits": {"x" * 318: "1"}}}, BOUNDED_LIMIT_KEYS
    ),
    "a resource request named with 318 characters is told the key limit": created(
        "Run", {".spec.agent.resources": {"requests": {"x" * 318: "1"}}}, BOUNDED_REQUEST_KEYS
    ),
    "a Pod label key of 318 characters is told the key limit": created(
        "Run", {".spec.agent.podTemplate": pod_template(labels={"x" * 318: "v"})}, BOUNDED_LABEL_KEYS
    ),
    "a Pod annotation key of 318 characters is told the key limit": created(
        "Run",
        {".spec.agent.podTemplate": pod_template(annotations={"x" * 318: "v"})},
        BOUNDED_ANNOTATION_KEYS,
    ),
    "a negative usage counter is refused": updated(
        "Attempt", status(usage={"inputTokens": -1}), "status.usage.inputTokens", "greater than or equal to 0"
    ),
    "a cost that is not a whole number of micro-USD is refused": updated(
        "Attempt", status(usage={"costMicroUSD": 0.5}), "status.usage.costMicroUSD", "integer"
    ),
    "an Attempt leaseEpoch past an int32 is refused": created(
        "Attempt", {".spec.leaseEpoch": 2**31}, "spec.leaseEpoch", "less than or equal to 2147483647"
    ),
    "a Checkpoint sequence past an int32 is refused": created(
        "Checkpoint", {".spec.sequence": 2**31}, "spec.sequence", "less than or equal to 2147483647"
    ),
    "a Run with a 49 character name is told the 48 character limit and why": created(
        "Run", {}, RUN_NAME_LENGTH, name="r" * 49
    ),
    # --- Run: a podTemplate that would borrow an identity or the node ---------------------------------
    **{
        f"a podTemplate setting {field} is refused and told what to do instead": created(
            "Run",
            {".spec.agent": {"podTemplate": {"spec": pod_spec}}},
            POD_TEMPLATE_RULES[field],
            f"spec.agent.podTemplate.spec.{field}",
        )
        for field, pod_spec in BAD_POD_TEMPLATES.items()
    },
    # --- Run: formats and closed enums ----------------------------------------------------------------
    "a Run name with capitals and underscores is refused as not a DNS name": created(
        "Run", {}, "metadata.name", "RFC 1123", name="Echo_Run"
    ),
    "a Run retrying an unknown failure class is shown the supported ones": created(
        "Run",
        {".spec.retry.retryOn": ["transient", "sometimes"]},
        "spec.retry.retryOn[1]",
        'Unsupported value: "sometimes"',
        "rate_limited",
    ),
    "a Run listing a failure class twice in retryOn is refused": created(
        "Run", {".spec.retry.retryOn": ["transient", "transient"]}, 'Duplicate value: "transient"'
    ),
    "a resume idempotencyKey with a space is refused": created(
        "Run",
        {".spec.resume": {**RESUME, "idempotencyKey": "has space"}},
        "spec.resume.idempotencyKey",
        "should match",
    ),
    "a pause with an empty requestId is refused": created(
        "Run", {".spec.pause": {"requestId": ""}}, "spec.pause.requestId", "at least 1 chars long"
    ),
    "an environment variable name starting with a digit is refused": created(
        "Run", {".spec.agent.env": [{"name": "1BAD", "value": "x"}]}, "spec.agent.env[0].name", "should match"
    ),
    "two environment variables with the same name are refused": created(
        "Run",
        {".spec.agent.env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]},
        "spec.agent.env[1]",
        "Duplicate value",
    ),
    "an environment variable with both value and valueFrom is told to pick one": created(
        "Run",
        {".spec.agent.env": [{"name": "A", "value": "x", "valueFrom": FIELD_REF}]},
        ENV_VALUE_OR_VALUE_FROM,
    ),
    "an environment variable reading from two sources is told to pick one": created(
        "Run", {".spec.agent.env": [{"name": "A", "valueFrom": {**FIELD_REF, **SECRET_REF}}]}, ENV_ONE_SOURCE
    ),
    "an environment variable reading from no source is told to name one": created(
        "Run", {".spec.agent.env": [{"name": "A", "valueFrom": {}}]}, ENV_ONE_SOURCE
    ),
    "a memory limit that is not a quantity is refused": created(
        "Run",
        {".spec.agent.resources": {"limits": {"memory": "lots"}}},
        "spec.agent.resources.limits.memory",
        "should match",
    ),
    # --- Attempt, Checkpoint, SideEffect: creates -----------------------------------------------------
    "an Attempt numbered 0 is refused because numbers start at 1": created(
        "Attempt", {".spec.number": 0}, "spec.number", "greater than or equal to 1"
    ),
    "an Attempt with a made up reason is refused": created(
        "Attempt", {".spec.reason": "because"}, "spec.reason", "should match"
    ),
    "an Attempt retrying an unknown failure class is refused": created(
        "Attempt", {".spec.reason": "retry:bad_luck"}, "spec.reason", "should match"
    ),
    "an Attempt without runName is refused because the field is required": created(
        "Attempt", {".spec.runName": DELETE}, "spec.runName: Required value"
    ),
    "an Attempt whose leaseEpoch is a string is told it must be an integer": created(
        "Attempt", {".spec.leaseEpoch": "1"}, "spec.leaseEpoch", "must be of type integer"
    ),
    "an Attempt with a negative cancelEpoch is refused": created(
        "Attempt", {".spec.cancelEpoch": -1}, "spec.cancelEpoch", "greater than or equal to 0"
    ),
    "a Checkpoint whose stateRef digest is not hex is refused": created(
        "Checkpoint",
        {".spec.stateRef": {"key": "r/ns/u/sha256/" + "0" * 64, "sha256": "xyz", "size": 3}},
        "spec.stateRef.sha256",
    ),
    "a Checkpoint naming a Run that cannot exist is refused": created(
        "Checkpoint", {".spec.runName": "Not_A_Name"}, "spec.runName", "should match"
    ),
    "a Checkpoint with a negative sequence is refused": created(
        "Checkpoint", {".spec.sequence": -1}, "spec.sequence", "greater than or equal to 0"
    ),
    "a Checkpoint without an id is refused because the field is required": created(
        "Checkpoint", {".spec.id": DELETE}, "spec.id: Required value"
    ),
    "a SideEffect without an idempotencyKey is refused because the key is required": created(
        "SideEffect", {".spec.idempotencyKey": DELETE}, "spec.idempotencyKey: Required value"
    ),
    "a SideEffect with a 129 character tool name is told the limit": created(
        "SideEffect", {".spec.tool": "t" * 129}, "spec.tool: Too long", "128"
    ),
    "a SideEffect whose reversible flag is a string is told it must be a boolean": created(
        "SideEffect", {".spec.reversible": "yes"}, "spec.reversible", "must be of type boolean"
    ),
    "a SideEffect with a digest that is not sha256 is refused": created(
        "SideEffect", {".spec.requestDigest": "md5:abc"}, "spec.requestDigest", "should match"
    ),
    # --- Run updates: the cancel epoch ----------------------------------------------------------------
    "lowering cancelEpoch from 2 to 1 is refused because it only grows": updated(
        "Run", spec(cancelEpoch=1), CANCEL_EPOCH_GROWS, base={".spec.cancelEpoch": 2}
    ),
    "removing cancelEpoch after a cancel is refused because it would fall back to 0": updated(
        "Run", spec(cancelEpoch=None), CANCEL_EPOCH_GROWS, base={".spec.cancelEpoch": 2}
    ),
    "cancelling a Succeeded Run is refused because it has ended": updated(
        "Run", spec(cancelEpoch=1), CANCEL_EPOCH_FROZEN, setup=(status(phase="Succeeded"),)
    ),
    "cancelling a Cancelled Run again is refused because it has ended": updated(
        "Run",
        spec(cancelEpoch=2),
        CANCEL_EPOCH_FROZEN,
        base={".spec.cancelEpoch": 1},
        setup=(status(phase="Cancelled"),),
    ),
    # --- Run: forks -----------------------------------------------------------------------------------
    "a Run that forks from itself is told a Run forks from another Run": created(
        "Run", {".spec.forkFrom": {**FORK, "run": "self-fork"}}, FORK_NOT_ITSELF, name="self-fork"
    ),
    "moving a fork to another checkpoint is refused: forkFrom is set once, at creation": updated(
        "Run", spec(forkFrom={"checkpointId": "source-a1-s1"}), FORK_FROZEN, base={".spec.forkFrom": FORK}
    ),
    "making a running Run a fork afterwards is refused": updated("Run", spec(forkFrom=FORK), FORK_FROZEN),
    # --- Run updates: idempotency keys ----------------------------------------------------------------
    "reusing a resume idempotencyKey with a different answer is refused": updated(
        "Run", spec(resume={"value": {"approved": False}}), RESUME_KEY_REUSED, base={".spec.resume": RESUME}
    ),
    "reusing a resume idempotencyKey with an answer that grew a field is refused": updated(
        "Run",
        spec(resume={"value": {"approved": True, "note": "and more"}}),
        RESUME_KEY_REUSED,
        base={".spec.resume": RESUME},
    ),
    "reusing a resume idempotencyKey for another request is refused": updated(
        "Run", spec(resume={"requestId": "req-2"}), RESUME_KEY_REUSED, base={".spec.resume": RESUME}
    ),
    "a second answer before the first one's key is spent is refused (one answer at a time)": updated(
        "Run",
        spec(resume={"requestId": "req-2", "idempotencyKey": "k-second", "value": {"approved": False}}),
        ONE_ANSWER_AT_A_TIME,
        "spec.resume holds an answer to req-1",
        "read the Run again (kubectl agentrun describe",
        base={".spec.resume": RESUME},
    ),
    "reusing a resume idempotencyKey for another checkpoint is refused": updated(
        "Run", spec(resume={"checkpointId": "ckpt-3"}), RESUME_KEY_REUSED, base={".spec.resume": RESUME}
    ),
    "reusing a cancelRequest idempotencyKey with another reason is refused": updated(
        "Run",
        spec(cancelRequest={"reason": "changed my mind"}),
        rule("Run", ".spec.cancelRequest"),
        base={".spec.cancelRequest": CANCEL},
    ),
    "reusing a retryRequest idempotencyKey from another checkpoint is refused": updated(
        "Run",
        spec(retryRequest={"fromCheckpoint": "ckpt-1"}),
        RETRY_KEY_REUSED,
        base={".spec.retryRequest": RETRY},
    ),
    "reusing a retryRequest idempotencyKey with another reason is refused": updated(
        "Run",
        spec(retryRequest={"reason": "try harder"}),
        RETRY_KEY_REUSED,
        base={".spec.retryRequest": RETRY},
    ),
    "reusing a compensateRequest idempotencyKey for other effects is refused": updated(
        "Run",
        spec(compensateRequest={"effects": ["ticket-2"]}),
        rule("Run", ".spec.compensateRequest"),
        base={".spec.compensateRequest": {"idempotencyKey": "undo-1", "effects": ["ticket-1"]}},
    ),
    "reusing a pause requestId with another reason is refused": updated(
        "Run", spec(pause={"reason": "another window"}), PAUSE_ID_REUSED, base={".spec.pause": PAUSE}
    ),
    # --- Run updates: the commit fence ----------------------------------------------------------------
    "a result committed under an older lease epoch is refused": updated(
        "Run",
        status(result={"ticket": "T-1"}, committedBy=committed_by(1, 0)),
        RESULT_FENCED,
        setup=(status(phase="Running", leaseEpoch=2),),
    ),
    "a result committed under an older cancel epoch is refused": updated(
        "Run",
        status(result={"ticket": "T-1"}, committedBy=committed_by(1, 0)),
        RESULT_FENCED,
        base={".spec.cancelEpoch": 1},
        setup=(status(phase="CancelRequested", leaseEpoch=1),),
    ),
    "a result without committedBy is refused": updated(
        "Run", status(result={"ticket": "T-1"}), RESULT_FENCED, setup=(status(leaseEpoch=1),)
    ),
    "a result written before any lease was granted is refused": updated(
        "Run", status(result={"ticket": "T-1"}, committedBy=committed_by(0, 0)), RESULT_FENCED
    ),
    "a stale worker adding to a committed result is refused": updated(
        "Run",
        status(result={"extra": "from a stale worker"}),
        RESULT_FENCED,
        setup=(
            status(leaseEpoch=1),
            status(result={"ticket": "T-1"}, committedBy=committed_by(1, 0)),
            status(leaseEpoch=2),
        ),
    ),
    "a stale worker recommitting under its old epochs is refused": updated(
        "Run",
        status(result={"ticket": "T-2"}, committedBy=committed_by(1, 0)),
        RESULT_FENCED,
        setup=(
            status(leaseEpoch=1),
            status(result={"ticket": "T-1"}, committedBy=committed_by(1, 0)),
            status(leaseEpoch=2),
        ),
    ),
    "a result stored by reference under an older lease epoch is refused": updated(
        "Run",
        status(resultRef=STORED_RESULT, committedBy=committed_by(1, 0)),
        RESULT_REF_FENCED,
        setup=(status(phase="Running", leaseEpoch=2),),
    ),
    "a stale worker replacing a result stored by reference is refused": updated(
        "Run",
        status(resultRef={**STORED_RESULT, "size": 1}, committedBy=committed_by(1, 0)),
        RESULT_REF_FENCED,
        setup=(
            status(leaseEpoch=1),
            status(resultRef=STORED_RESULT, committedBy=committed_by(1, 0)),
            status(leaseEpoch=2),
        ),
    ),
    # --- Run updates: status enums and bounds ---------------------------------------------------------
    "an unknown Run phase is shown the supported phases": updated(
        "Run", status(phase="Sleeping"), "status.phase", 'Unsupported value: "Sleeping"', "InputRequired"
    ),
    "a negative lease epoch in the Run status is refused": updated(
        "Run", status(leaseEpoch=-3), "status.leaseEpoch", "greater than or equal to 0"
    ),
    "an unknown failure class in the Run status is refused": updated(
        "Run", status(failure={"class": "bad_luck"}), "status.failure.class", 'Unsupported value: "bad_luck"'
    ),
    "an unknown control operation in the Run status is refused": updated(
        "Run",
        status(
            controls=[
                {
                    "idempotencyKey": "k",
                    "op": "Undo",
                    "digest": DIGEST,
                    "outcome": "Accepted",
                    "time": "2026-01-01T00:00:00Z",
                }
            ]
        ),
        "status.controls[0].op",
        'Unsupported value: "Undo"',
    ),
    "a pending request with an unknown reason is refused": updated(
        "Run",
        status(pendingRequest={"requestId": "r", "checkpointId": "c", "reason": "bored"}),
        "status.pendingRequest.reason",
        'Unsupported value: "bored"',
    ),
    # --- Attempt updates ------------------------------------------------------------------------------
    "changing an Attempt's lease epoch is refused because history is never rewritten": updated(
        "Attempt", spec(leaseEpoch=2), ATTEMPT_SPEC_IMMUTABLE
    ),
    "changing an Attempt's resume input is refused": updated(
        "Attempt",
        spec(input={"approved": False}),
        ATTEMPT_SPEC_IMMUTABLE,
        base={".spec.input": {"approved": True}},
    ),
    "giving an Attempt a resume point after the fact is refused": updated(
        "Attempt", spec(resumeFrom="ckpt-1"), ATTEMPT_SPEC_IMMUTABLE
    ),
    **{
        f"lowering status.{counter} is refused because the fences compare epochs with it": updated(
            "Run",
            status(**{counter: 1}),
            rule("Run", ".status", f"oldSelf.{counter}"),
            setup=(status(**{counter: 2}),),
        )
        for counter in MONOTONIC_STATUS_FIELDS
    },
    **{
        f"removing status.{counter} is refused because it would fall back to nothing": updated(
            "Run",
            status(**{counter: None}),
            rule("Run", ".status", f"oldSelf.{counter}"),
            setup=(status(**{counter: 2}),),
        )
        for counter in MONOTONIC_STATUS_FIELDS
    },
    "rewriting a Succeeded Attempt as Failed is refused": updated(
        "Attempt", status(phase="Failed"), ATTEMPT_PHASE_FINAL, setup=(status(phase="Succeeded"),)
    ),
    "rejecting the commit of a Succeeded Attempt after the fact is refused": updated(
        "Attempt", status(phase="Rejected"), ATTEMPT_PHASE_FINAL, setup=(status(phase="Succeeded"),)
    ),
    "reviving a Failed Attempt as Running is refused": updated(
        "Attempt", status(phase="Running"), ATTEMPT_PHASE_FINAL, setup=(status(phase="Failed"),)
    ),
    "removing the phase of an ended Attempt is refused": updated(
        "Attempt", status(phase=None), ATTEMPT_PHASE_KEPT, setup=(status(phase="Succeeded"),)
    ),
    "removing the whole status of an ended Attempt is refused": updated(
        "Attempt", Write("status", None), ATTEMPT_PHASE_KEPT, setup=(status(phase="Aborted"),)
    ),
    "a rejected commit with an unknown reason is refused": updated(
        "Attempt",
        status(rejectedCommit={"reason": "late"}),
        "status.rejectedCommit.reason",
        'Unsupported value: "late"',
    ),
    "an exit code above 255 is refused": updated(
        "Attempt",
        status(failure={"class": "transient", "exitCode": 256}),
        "status.failure.exitCode",
        "less than or equal to 255",
    ),
    # --- Checkpoint updates ---------------------------------------------------------------------------
    "changing a Checkpoint's state is refused: save a new Checkpoint instead": updated(
        "Checkpoint", spec(state={"step": 2}), CHECKPOINT_IMMUTABLE, base={".spec.state": {"step": 1}}
    ),
    "moving a Checkpoint to another sequence number is refused": updated(
        "Checkpoint", spec(sequence=7), CHECKPOINT_IMMUTABLE
    ),
    "adding a stateRef to a saved Checkpoint is refused": updated(
        "Checkpoint",
        spec(stateRef={"key": "r/ns/u/sha256/" + "0" * 64, "sha256": "0" * 64, "size": 3}),
        CHECKPOINT_IMMUTABLE,
    ),
    "cutting a Checkpoint from its parent is refused": updated(
        "Checkpoint", spec(parent=None), CHECKPOINT_IMMUTABLE, base={".spec.parent": "ckpt-0"}
    ),
    # --- SideEffect updates ---------------------------------------------------------------------------
    "changing a SideEffect's target is refused: a different action needs a new key": updated(
        "SideEffect", spec(target="projects/other"), SIDE_EFFECT_SPEC_IMMUTABLE
    ),
    "declaring a SideEffect reversible after the fact is refused": updated(
        "SideEffect", spec(reversible=True), SIDE_EFFECT_SPEC_IMMUTABLE
    ),
    "a Confirmed SideEffect going back to Pending is refused": updated(
        "SideEffect", status(state="Pending"), LEDGER_TRANSITION, setup=(status(state="Confirmed"),)
    ),
    "a Failed SideEffect turning Confirmed is refused": updated(
        "SideEffect", status(state="Confirmed"), LEDGER_TRANSITION, setup=(status(state="Failed"),)
    ),
    "a Failed SideEffect sent again without a person's resolution Absent is refused": updated(
        "SideEffect", status(state="Pending"), LEDGER_AGAIN_AFTER_ABSENT, setup=(status(state="Failed"),)
    ),
    "a resolution without resolvedBy is told to name who made it": updated(
        "SideEffect", status(state="Failed", resolution="Absent"), LEDGER_RESOLUTION_BY
    ),
    "a Compensated SideEffect turning Confirmed again is refused": updated(
        "SideEffect",
        status(state="Confirmed"),
        LEDGER_TRANSITION,
        setup=(status(state="Confirmed"), status(state="Compensated")),
    ),
    "a Pending SideEffect jumping to Compensated is refused": updated(
        "SideEffect", status(state="Compensated"), LEDGER_TRANSITION, setup=(status(state="Pending"),)
    ),
    "a new SideEffect recorded straight as Compensated is refused": updated(
        "SideEffect", status(state="Compensated"), LEDGER_STARTS_PENDING
    ),
    "an Unknown SideEffect confirmed without resolvedBy is told who must resolve it": updated(
        "SideEffect", status(state="Confirmed"), LEDGER_RESOLVED_BY, setup=(status(state="Unknown"),)
    ),
    "an Unknown SideEffect failed without resolvedBy is told who must resolve it": updated(
        "SideEffect", status(state="Failed"), LEDGER_RESOLVED_BY, setup=(status(state="Unknown"),)
    ),
    "removing the status of a SideEffect is refused because it is the ledger's record": updated(
        "SideEffect", Write("status", None), LEDGER_STATUS_KEPT, setup=(status(state="Confirmed"),)
    ),
    "an unknown SideEffect state is shown the supported states": updated(
        "SideEffect", status(state="Undone"), "status.state", 'Unsupported value: "Undone"', "Compensated"
    ),
}


@pytest.fixture(scope="module")
def api(kube: Kube, module_namespace: str) -> Api:
    return Api(kube, module_namespace)


def send(api: Api, kind: str, name: str, write: Write) -> dict[str, Any]:
    if write.to == "status":
        return api.patch_status(kind, name, write.patch)
    assert write.patch is not None
    return api.patch(kind, name, write.patch)


@pytest.mark.parametrize("case", list(BAD_INPUT.values()), ids=list(BAD_INPUT))
def test_bad_input_is_refused_with_a_message_and_nothing_is_stored(api: Api, case: Bad) -> None:
    name = case.name or f"bad-{uuid.uuid4().hex[:8]}"
    obj = valid_object(case.kind, name, case.changes)
    if case.write is None:
        message = api.refusal(lambda: api.create(obj))
        assert api.get(case.kind, name) is None
    else:
        api.create(obj)
        for write in case.setup:
            send(api, case.kind, name, write)
        before = api.get(case.kind, name)
        write = case.write
        message = api.refusal(lambda: send(api, case.kind, name, write))
        assert api.get(case.kind, name) == before, "a refused update must leave the object as it was"
    for expected in case.expect:
        if isinstance(expected, Rule) and expected.message_expression is not None:
            # the message is written by its expression: the case names what it must say, as text
            assert any(isinstance(e, str) for e in case.expect), f"{expected} needs its message as text"
            continue
        assert (expected.message if isinstance(expected, Rule) else expected) in message


def test_every_cel_rule_of_the_crds_has_a_refusal_case() -> None:
    covered = {
        expected for case in BAD_INPUT.values() for expected in case.expect if isinstance(expected, Rule)
    }
    missing = [str(r) for r in crd_rules() if r not in covered]
    assert missing == []
    assert len(BAD_INPUT) >= 25


# --- the unit-test corpus, which jsonschema and the models refuse, is refused by the server too ------

UNIT_CORPUS = [("Run", path, value) for path, value in BAD_RUNS] + BAD_OBJECTS


@pytest.mark.parametrize(
    ("kind", "path", "value"), UNIT_CORPUS, ids=[bad_input_id(*case) for case in UNIT_CORPUS]
)
def test_the_server_refuses_what_the_unit_tests_refuse(api: Api, kind: str, path: str, value: Any) -> None:
    name = f"unit-{uuid.uuid4().hex[:8]}"
    bad = with_changes(VALID_OBJECTS[kind], {path: value, ".metadata": {"name": name}})
    if path.startswith(".status"):  # a create drops status: the status subresource is where it is written
        api.create(valid_object(kind, name))
        before = api.get(kind, name)
        message = api.refusal(lambda: api.patch_status(kind, name, bad["status"]))
        assert api.get(kind, name) == before
    else:
        message = api.refusal(lambda: api.create(bad))
        assert api.get(kind, name) is None
    assert path.strip(".") in message  # the message names the field to fix


@pytest.mark.parametrize("pod_spec", GOOD_POD_TEMPLATES.values(), ids=GOOD_POD_TEMPLATES.keys())
def test_a_harmless_pod_template_is_accepted(api: Api, pod_spec: dict[str, Any]) -> None:
    name = f"pod-{uuid.uuid4().hex[:8]}"
    api.create(valid_object("Run", name, {".spec.agent": {"podTemplate": {"spec": pod_spec}}}))
    assert api.get("Run", name) is not None
