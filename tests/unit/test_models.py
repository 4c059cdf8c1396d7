"""The pydantic models: camelCase on the wire, snake_case in Python, defaults, closed enums, helpers."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import pydantic
import pytest

from agentrun.api import (
    AgentSpec,
    Attempt,
    AttemptPhase,
    AttemptReason,
    AttemptSpec,
    Checkpoint,
    ConditionStatus,
    ControlOp,
    ControlOutcome,
    FailureClass,
    FailureInfo,
    InterruptReason,
    KubernetesObject,
    RejectedCommitReason,
    Run,
    RunPhase,
    RunSpec,
    RunStatus,
    SideEffect,
    SideEffectState,
    attempt_name,
    is_allowed_transition,
    json_digest,
)

T0 = "2026-01-02T03:04:05Z"
DIGEST = "sha256:" + "ab" * 32

# Complete objects as the API server returns them (defaults applied): every field of every kind.
FULL_RUN: dict[str, Any] = {
    "apiVersion": "agentrun.dev/v1alpha1",
    "kind": "Run",
    "metadata": {"name": "triage", "namespace": "team-a", "uid": "0b6c", "generation": 3},
    "spec": {
        "agent": {
            "image": "agentrun/agent:dev",
            "command": ["python", "-m", "agentrun.examples.echo"],
            "args": ["--verbose"],
            "env": [
                {"name": "MODE", "value": "fast"},
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "llm", "key": "token"}}},
            ],
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": 2}},
            "serviceAccountName": "agent",
            "podTemplate": {
                "metadata": {"labels": {"team": "a"}},
                "spec": {"nodeSelector": {"pool": "agents"}, "containers": [{"name": "agent"}]},
            },
        },
        "input": {"ticket": 42, "tags": ["urgent", None]},
        "lease": {"durationSeconds": 30, "renewSeconds": 10},
        "retry": {
            "maxAttempts": 5,
            "backoff": {"initialSeconds": 2, "factor": 3.0, "maxSeconds": 60},
            "retryOn": ["transient", "lease_lost"],
            "sameErrorLimit": 3,
        },
        "deadlineSeconds": 3600,
        "startTimeoutSeconds": 120,
        "cancelEpoch": 1,
        "resume": {"requestId": "req-1", "checkpointId": "ckpt-2", "value": True, "idempotencyKey": "k-1"},
        "retryRequest": {"idempotencyKey": "retry-1", "fromCheckpoint": "ckpt-1", "reason": "fixed the API"},
        "pause": {"requestId": "pause-1", "reason": "maintenance"},
        "checkpointRetention": 10,
        "podGC": "OnRunEnd",
    },
    "status": {
        "phase": "InputRequired",
        "observedGeneration": 3,
        "message": "waiting for approval",
        "conditions": [
            {
                "type": "Waiting",
                "status": "True",
                "observedGeneration": 3,
                "lastTransitionTime": T0,
                "reason": "InputRequired",
                "message": "approve the plan",
            }
        ],
        "attempts": 2,
        "currentAttempt": 2,
        "leaseEpoch": 2,
        "observedCancelEpoch": 1,
        "latestCheckpoint": "ckpt-2",
        "pendingRequest": {
            "requestId": "req-1",
            "reason": "auth_required",
            "checkpointId": "ckpt-2",
            "prompt": "Approve the plan?",
            "acceptedSchema": {"type": "boolean"},
            "expiresAt": T0,
        },
        "inputs": [
            {
                "requestId": "req-0",
                "checkpointId": "ckpt-1",
                "digest": DIGEST,
                "idempotencyKey": "k-0",
                "time": T0,
            }
        ],
        "controls": [
            {
                "idempotencyKey": "k-0",
                "op": "Resume",
                "digest": DIGEST,
                "outcome": "Accepted",
                "reason": "InputRecorded",
                "message": "resuming from ckpt-1",
                "time": T0,
            }
        ],
        "result": {"ticket": "T-42"},
        "committedBy": {"attempt": "triage-a2", "leaseEpoch": 2, "cancelEpoch": 1},
        "failure": {
            "class": "transient",
            "reason": "RetriesExhausted",
            "message": "503 from the LLM API",
            "fingerprint": "f1",
        },
        "sideEffects": {"confirmed": 2, "compensated": 1, "unknown": 0, "irreversible": 1},
        "report": {
            "effects": [
                {
                    "name": "triage-sfx-1",
                    "tool": "create_ticket",
                    "target": "project/a",
                    "state": "Confirmed",
                    "externalReference": "T-42",
                    "reversible": False,
                }
            ],
            "omitted": 0,
        },
    },
}
FULL_ATTEMPT: dict[str, Any] = {
    "apiVersion": "agentrun.dev/v1alpha1",
    "kind": "Attempt",
    "metadata": {"name": "triage-a2", "namespace": "team-a"},
    "spec": {
        "runName": "triage",
        "number": 2,
        "leaseEpoch": 2,
        "cancelEpoch": 1,
        "resumeFrom": "ckpt-2",
        "reason": "resume:req-1",
        "input": {"approved": True},
    },
    "status": {
        "phase": "Rejected",
        "podName": "triage-a2",
        "startTime": T0,
        "completionTime": T0,
        "failure": {"class": "deterministic", "message": "boom", "fingerprint": "f2", "exitCode": 1},
        "rejectedCommit": {"reason": "stale_after_cancel", "message": "cancelled", "time": T0},
        "usage": {
            "inputTokens": 1200,
            "outputTokens": 310,
            "costMicroUSD": 4000,
            "modelCalls": 2,
            "stepRetries": 1,
        },
        "traceId": "4bf92f3577b34da6a3ce929d0e0e4736",
    },
}
FULL_CHECKPOINT: dict[str, Any] = {
    "apiVersion": "agentrun.dev/v1alpha1",
    "kind": "Checkpoint",
    "metadata": {"name": "triage-ckpt-2"},
    "spec": {
        "runName": "triage",
        "id": "ckpt-2",
        "sequence": 2,
        "parent": "ckpt-1",
        "attempt": "triage-a1",
        "leaseEpoch": 1,
        "step": "plan",
        "kind": "State",
        "thread": {"id": "triage", "ns": ""},
        "state": {"plan": ["a", "b"]},
        "stateRef": {"key": "runs/triage-ns/uid-1/sha256/" + "cd" * 32, "sha256": "cd" * 32, "size": 41213},
    },
    "status": {},
}
FULL_SIDE_EFFECT: dict[str, Any] = {
    "apiVersion": "agentrun.dev/v1alpha1",
    "kind": "SideEffect",
    "metadata": {"name": "triage-sfx-1"},
    "spec": {
        "runName": "triage",
        "operationId": "plan/1",
        "step": "plan",
        "tool": "create_ticket",
        "idempotencyKey": "triage/create_ticket/1",
        "target": "project/a",
        "requestDigest": DIGEST,
        "compensation": "close_ticket",
        "reversible": True,
        "resend": "WithSameKey",
        "maxSends": 3,
        "sendDeadlineSeconds": 300,
    },
    "status": {
        "state": "Confirmed",
        "externalReference": "T-42",
        "result": {"id": "T-42"},
        "attempt": "triage-a1",
        "leaseEpoch": 1,
        "resolvedBy": "alice",
        "approval": {"requestId": "req-1", "requestDigest": DIGEST, "time": T0},
        "sends": [
            {
                "sendId": "op-1-s1",
                "attempt": "triage-a1",
                "time": T0,
                "outcome": "Unknown",
                "message": "timeout",
            },
            {
                "sendId": "op-1-s2",
                "attempt": "triage-a1",
                "time": T0,
                "outcome": "Confirmed",
                "callId": "c-2",
                "reference": "T-42",
            },
        ],
        "conflict": {"message": "two tickets", "references": ["T-41", "T-42"], "time": T0},
        "resolution": "Confirmed",
        "resolutionMessage": "checked by hand",
        "resolvedSends": 2,
        "history": [
            {"state": "Pending", "time": T0, "attempt": "triage-a1"},
            {"state": "Unknown", "time": T0, "attempt": "triage-a1", "message": "timeout after send"},
            {"state": "Confirmed", "time": T0, "message": "found by lookup"},
        ],
    },
}
FULL_OBJECTS: list[tuple[type[KubernetesObject], dict[str, Any]]] = [
    (Run, FULL_RUN),
    (Attempt, FULL_ATTEMPT),
    (Checkpoint, FULL_CHECKPOINT),
    (SideEffect, FULL_SIDE_EFFECT),
]


@pytest.mark.parametrize(("model", "wire"), FULL_OBJECTS, ids=lambda value: getattr(value, "__name__", ""))
def test_full_object_round_trips_in_camel_case(model: type[KubernetesObject], wire: dict[str, Any]) -> None:
    assert model.model_validate(wire).to_api() == wire


def test_fields_are_snake_case_in_python() -> None:
    run = Run.model_validate(FULL_RUN)
    assert run.spec.agent.service_account_name == "agent"
    assert run.spec.retry.backoff.initial_seconds == 2
    assert run.status.committed_by is not None
    assert run.status.committed_by.lease_epoch == 2
    assert run.status.failure is not None
    assert run.status.failure.failure_class is FailureClass.TRANSIENT


def test_models_accept_python_names_and_emit_camel_case() -> None:
    spec = RunSpec(agent=AgentSpec(image="agentrun/agent:dev"), cancel_epoch=2, deadline_seconds=60)
    assert spec.to_api()["cancelEpoch"] == 2
    assert RunSpec.model_validate({"agent": {"image": "i"}, "cancel_epoch": 3}).cancel_epoch == 3
    assert FailureInfo(failure_class=FailureClass.RATE_LIMITED).to_api() == {"class": "rate_limited"}


def test_unknown_fields_from_the_server_are_ignored() -> None:
    wire = copy.deepcopy(FULL_RUN)
    wire["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    wire["spec"]["futureField"] = {"x": 1}
    wire["status"]["pendingRequest"]["futureField"] = 1
    assert Run.model_validate(wire).to_api() == FULL_RUN


def test_to_patch_holds_only_what_was_set() -> None:
    patch = RunStatus(phase=RunPhase.RUNNING, pending_request=None).to_patch()
    assert patch == {"phase": "Running", "pendingRequest": None}  # null deletes in a merge patch


def test_owner_reference_points_at_the_object() -> None:
    owner = Run.model_validate(FULL_RUN).owner_reference()
    assert owner.to_api() == {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "Run",
        "name": "triage",
        "uid": "0b6c",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    with pytest.raises(ValueError, match="uid"):
        Run(spec=RunSpec(agent=AgentSpec(image="i"))).owner_reference()


# --- defaults -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("lease.duration_seconds", 100),
        ("lease.renew_seconds", 60),
        ("retry.max_attempts", 3),
        ("retry.backoff.initial_seconds", 5),
        ("retry.backoff.factor", 2.0),
        ("retry.backoff.max_seconds", 300),
        (
            "retry.retry_on",
            [
                FailureClass.TRANSIENT,
                FailureClass.RATE_LIMITED,
                FailureClass.INFRASTRUCTURE,
                FailureClass.LEASE_LOST,
            ],
        ),
        ("retry.same_error_limit", 2),
        ("cancel_epoch", 0),
        ("checkpoint_retention", 20),
        ("deadline_seconds", None),
        ("resume", None),
    ],
)
def test_run_spec_defaults(path: str, expected: Any) -> None:
    value: Any = RunSpec.model_validate({"agent": {"image": "agentrun/agent:dev"}})
    for name in path.split("."):
        value = getattr(value, name)
    assert value == expected


def test_defaults_are_not_shared_between_instances() -> None:
    first = RunSpec(agent=AgentSpec(image="i"))
    first.retry.retry_on.append(FailureClass.DETERMINISTIC)
    assert FailureClass.DETERMINISTIC not in RunSpec(agent=AgentSpec(image="i")).retry.retry_on


# --- enums --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("enum", "values"),
    [
        (
            RunPhase,
            [
                "Queued",
                "Running",
                "InputRequired",
                "AuthRequired",
                "Paused",
                "RetryBackoff",
                "CancelRequested",
                "Compensating",
                "Cancelled",
                "Succeeded",
                "Failed",
                "NeedsReconciliation",
            ],
        ),
        (
            AttemptPhase,
            ["Pending", "Running", "Succeeded", "Failed", "Interrupted", "Aborted", "LeaseLost", "Rejected"],
        ),
        (SideEffectState, ["Pending", "Confirmed", "Failed", "Unknown", "Compensated"]),
        (
            FailureClass,
            [
                "transient",
                "rate_limited",
                "infrastructure",
                "lease_lost",
                "deterministic",
                "cancelled",
                "unknown_side_effect",
                "input_expired",
            ],
        ),
        (ControlOp, ["Resume", "Retry", "Pause", "Cancel", "Compensate"]),
        (ControlOutcome, ["Accepted", "Rejected"]),
        (RejectedCommitReason, ["stale_after_cancel", "stale_worker"]),
        (InterruptReason, ["input_required", "auth_required", "paused"]),
        (ConditionStatus, ["True", "False", "Unknown"]),
    ],
    ids=lambda value: getattr(value, "__name__", ""),
)
def test_enum_values_follow_the_design(enum: type[StrEnum], values: list[str]) -> None:
    assert [member.value for member in enum] == values


def test_enum_members_are_plain_strings() -> None:
    phase: str = RunPhase.RUNNING
    assert phase == "Running"
    assert f"{AttemptPhase.LEASE_LOST}" == "LeaseLost"
    assert Run.model_validate(FULL_RUN).status.phase is RunPhase.INPUT_REQUIRED


def test_enums_are_closed() -> None:
    wire = copy.deepcopy(FULL_RUN)
    wire["status"]["phase"] = "Sleeping"
    with pytest.raises(pydantic.ValidationError, match="phase"):
        Run.model_validate(wire)


# --- validation mirrors the schema bounds -------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        {"agent": {"image": "i"}, "retry": {"maxAttempts": 0}},
        {"agent": {"image": "i"}, "retry": {"maxAttempts": 101}},
        {"agent": {"image": "i"}, "lease": {"durationSeconds": 4}},
        {"agent": {"image": "i"}, "cancelEpoch": -1},
        {"agent": {"image": "i"}, "deadlineSeconds": 2592001},
        {"agent": {"image": "i"}, "retryRequest": {"idempotencyKey": "x" * 129}},
        {"agent": {"image": "i"}, "retryRequest": {"idempotencyKey": "two words"}},
        {"agent": {"image": "i"}, "resume": {"requestId": "r", "checkpointId": "c", "idempotencyKey": "k"}},
    ],
)
def test_out_of_bounds_spec_is_refused(spec: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        RunSpec.model_validate(spec)


# --- helpers ------------------------------------------------------------------------------------------


def test_attempt_names_and_reasons() -> None:
    assert attempt_name("triage", 12) == "triage-a12"
    reasons = [
        AttemptReason.INITIAL,
        AttemptReason.LEASE_EXPIRED,
        AttemptReason.MANUAL_RETRY,
        AttemptReason.resume("req-1"),
        *(AttemptReason.retry(failure_class) for failure_class in FailureClass),
    ]
    for reason in reasons:
        AttemptSpec(run_name="triage", number=1, lease_epoch=1, cancel_epoch=0, reason=reason)
    assert AttemptReason.retry(FailureClass.RATE_LIMITED) == "retry:rate_limited"


ALLOWED_TRANSITIONS = {
    ("Pending", "Confirmed"),
    ("Pending", "Failed"),
    ("Pending", "Unknown"),
    ("Unknown", "Confirmed"),
    ("Unknown", "Failed"),
    ("Confirmed", "Compensated"),
    ("Failed", "Pending"),  # only after a resolution Absent (a rule on the status, tested on the API server)
}


@pytest.mark.parametrize("old", list(SideEffectState))
@pytest.mark.parametrize("new", list(SideEffectState))
def test_side_effect_transitions(old: SideEffectState, new: SideEffectState) -> None:
    assert is_allowed_transition(old, new) == (old == new or (old, new) in ALLOWED_TRANSITIONS)


def test_json_digest_is_canonical() -> None:
    assert json_digest({"b": 1, "a": [1, "é"]}) == json_digest({"a": [1, "é"], "b": 1})
    assert json_digest({"a": 1}) != json_digest({"a": 2})
    assert json_digest(None).startswith("sha256:")
    assert len(json_digest("x")) == len("sha256:") + 64


def test_timestamps_parse_as_aware_datetimes() -> None:
    attempt = Attempt.model_validate(FULL_ATTEMPT)
    assert attempt.status.start_time == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
