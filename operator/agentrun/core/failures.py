"""Failure classification: from what a finished attempt Pod says to a class that decides the retry.

Sources, most specific first: the JSON the SDK writes as the termination message ({class, message,
fingerprint, retryAfterSeconds}); the container runtime's reason (OOMKilled) and the Pod's (Evicted,
node lost); the exit code (75 = transient; death by a signal = infrastructure; any other non-zero =
deterministic). And from a Pod whose containers never started: the kubelet's waiting reason (an image that
cannot be pulled, a missing Secret or ConfigMap), judged against spec.startTimeoutSeconds.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Final

from agentrun.api import (
    AGENT_SDK_TOO_OLD,
    CONFIG_MISSING,
    IMAGE_NOT_FOUND,
    IMAGE_PULL_FAILED,
    AttemptFailure,
    FailureClass,
)

EX_TEMPFAIL = 75  # sysexits.h: "temporary failure, try again later"
_SIGNAL_BASE = 128
# Numbers, hex literals, long hex ids and UUIDs (whose short groups the other patterns would only half mask).
_CAMEL = re.compile(r"[A-Z][A-Za-z0-9]*")
_VOLATILE = re.compile(r"[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}|0x[0-9a-f]+|\b[0-9a-f]{8,}\b|\d+")
MAX_RETRY_AFTER_SECONDS = 86400  # AttemptFailure.retryAfterSeconds' bound


@dataclass(frozen=True)
class ContainerExit:
    """How the agent container of an attempt Pod ended, as the kubelet reported it."""

    exit_code: int
    reason: str | None = None  # container state reason: Completed, Error, OOMKilled, ...
    message: str | None = None  # the termination message
    pod_reason: str | None = None  # Pod-level reason: Evicted, NodeLost, ...
    memory_limit: str | None = None  # the container's resources.limits.memory, to say which limit it hit


@dataclass(frozen=True)
class ContainerWaiting:
    """Why a container of an attempt Pod has not started, as the kubelet reported it (state.waiting)."""

    container: str
    reason: str  # ErrImageNeverPull, ImagePullBackOff, CreateContainerConfigError, ...
    message: str | None = None  # the kubelet's: it names the image, or the Secret or ConfigMap
    image: str | None = None


# The kubelet's waiting reasons that keep a container from starting: an image that can never be pulled (no
# retry can help), a pull that keeps failing (a registry outage clears; a wrong name does not), and a
# Secret or ConfigMap the container needs that is missing (it may be created yet).
NEVER_PULLED: Final = frozenset({"ErrImageNeverPull", "InvalidImageName"})
PULL_FAILING: Final = frozenset({"ErrImagePull", "ImagePullBackOff"})
CONFIG_UNRESOLVED: Final = frozenset({"CreateContainerConfigError"})
START_BLOCKERS: Final = NEVER_PULLED | PULL_FAILING | CONFIG_UNRESOLVED


def fingerprint(failure_class: str, message: str) -> str:
    """A stable digest of an error: numbers and hex ids are masked so that "timeout after 3012 ms" and
    "timeout after 2990 ms" count as the same error."""
    normalised = _VOLATILE.sub("#", message.strip().lower())
    return hashlib.sha256(f"{failure_class}\0{normalised}".encode()).hexdigest()[:16]


def failure(failure_class: FailureClass, message: str, exit_code: int | None = None) -> AttemptFailure:
    return AttemptFailure.model_validate(
        {
            "class": failure_class,
            "message": message[:1024],
            "fingerprint": fingerprint(failure_class, message),
            "exitCode": exit_code,
        }
    )


def _retry_after(value: Any) -> int | None:
    """retryAfterSeconds as the model accepts it: whole seconds, rounded up (the next Attempt starts no
    sooner) and clamped to [0, 86400]. The termination message is the agent's to write: a value out of
    bounds must not make the failure unparseable, nor the Run undecidable."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return min(max(math.ceil(value), 0), MAX_RETRY_AFTER_SECONDS)


def _reported_by_sdk(message: str | None, exit_code: int) -> AttemptFailure | None:
    if not message or not message.lstrip().startswith("{"):
        return None
    try:
        reported: Any = json.loads(message)
        cls = FailureClass(reported["class"])
    except (ValueError, KeyError, TypeError):
        return None
    text = str(reported.get("message") or cls.value)
    retry_after = _retry_after(reported.get("retryAfterSeconds"))
    reason = reported.get("reason")
    return AttemptFailure.model_validate(
        {
            "class": cls,
            "message": text[:1024],
            "fingerprint": str(reported.get("fingerprint") or fingerprint(cls, text))[:64],
            "exitCode": exit_code,
            "retryAfterSeconds": retry_after,
            # The agent writes it: one that is not a CamelCase reason is dropped, never fatal.
            "reason": reason if isinstance(reason, str) and _CAMEL.fullmatch(reason[:128]) else None,
        }
    )


def classify_exit(end: ContainerExit) -> AttemptFailure | None:
    """The failure of a finished attempt container, or None when it exited 0."""
    if reported := _reported_by_sdk(end.message, end.exit_code):
        return reported
    if end.exit_code == 0:
        return None
    if (killed := _killed(end)) is not None:
        return failure(FailureClass.INFRASTRUCTURE, killed, end.exit_code)
    if end.exit_code == EX_TEMPFAIL:
        return failure(FailureClass.TRANSIENT, end.message or "the agent exited with code 75", end.exit_code)
    return failure(
        FailureClass.DETERMINISTIC,
        end.message or f"the agent exited with code {end.exit_code}",
        end.exit_code,
    )


def _killed(end: ContainerExit) -> str | None:
    """How the attempt was stopped from outside (memory, the node, a signal), if it was: the agent did
    not fail on its own account."""
    if end.reason == "OOMKilled":
        limit = (
            f" at its memory limit of {end.memory_limit}"
            if end.memory_limit
            else " (it sets no memory limit)"
        )
        return f"the agent container was OOMKilled{limit}"
    if end.pod_reason in ("Evicted", "NodeLost", "Preempting", "NodeShutdown"):
        return f"the attempt Pod was {end.pod_reason}"
    if end.exit_code > _SIGNAL_BASE:  # SIGKILL, SIGTERM...
        return f"the agent process was killed by signal {end.exit_code - _SIGNAL_BASE}"
    return None


def unreported_crash(end: ContainerExit, failed: AttemptFailure) -> bool:
    """The agent container failed on its own (not killed, not transient) and wrote no SDK report: e.g.
    an SDK that stopped before it knew its Attempt."""
    return (
        failed.failure_class == FailureClass.DETERMINISTIC
        and _reported_by_sdk(end.message, end.exit_code) is None
    )


def sdk_too_old(failed: AttemptFailure) -> AttemptFailure:
    """An Attempt started with stateInStore ended without its SDK stating that it reads references
    (status.sdkReads): its image's SDK predates the state store (it stops at once: its Pod has no
    AGENTRUN_NAMESPACE), or the agent stopped before its SDK started. The end of what it printed is kept
    (the log's last lines, where a traceback ends)."""
    message = (
        "this Run's state may be in the state store, and the Attempt's SDK did not state that it reads "
        "references (Attempt status.sdkReads): the agent image's agentrun-k8s predates the state store, or "
        f"the agent stopped before its SDK started (it ended: ...{(failed.message or '')[-400:]})"
    )
    return AttemptFailure.model_validate(
        {
            "class": FailureClass.DETERMINISTIC,
            "reason": AGENT_SDK_TOO_OLD,
            "message": message[:1024],
            "fingerprint": fingerprint(FailureClass.DETERMINISTIC, AGENT_SDK_TOO_OLD),
            "exitCode": failed.exit_code,
        }
    )


def start_failure(
    waiting: ContainerWaiting, waited_seconds: float, limit_seconds: int
) -> AttemptFailure | None:
    """The failure of an Attempt whose Pod cannot start `waiting.container`, `waited_seconds` after the Pod
    was created: at once for an image that can never be pulled (ImageNotFound); once limit_seconds
    (spec.startTimeoutSeconds) have passed for a pull that keeps failing (ImagePullFailed) or a missing
    Secret or ConfigMap (ConfigMissing); None while it may still clear. Each is deterministic: the Run is
    not retried on a configuration error, and its message says what to fix."""
    said = f"{waiting.reason}: {waiting.message}" if waiting.message else waiting.reason
    image = waiting.image or "(none set)"
    if waiting.reason in NEVER_PULLED:
        reason = IMAGE_NOT_FOUND
        message = (
            f"the image {image} of container {waiting.container} can never be pulled ({said}): set "
            "spec.agent.image to an image the node has, or let it be pulled"
        )
    elif waited_seconds < limit_seconds or waiting.reason not in PULL_FAILING | CONFIG_UNRESOLVED:
        return None
    elif waiting.reason in PULL_FAILING:
        reason = IMAGE_PULL_FAILED
        message = (
            f"the image {image} of container {waiting.container} was not pulled within startTimeoutSeconds "
            f"({limit_seconds}s): {said}"
        )
    else:
        reason = CONFIG_MISSING
        message = (
            f"container {waiting.container} could not be created within startTimeoutSeconds "
            f"({limit_seconds}s): {said}: create what it names in the Run's namespace, or change the Run's "
            "pod template"
        )
    return AttemptFailure.model_validate(
        {
            "class": FailureClass.DETERMINISTIC,
            "reason": reason,
            "message": message[:1024],
            "fingerprint": fingerprint(FailureClass.DETERMINISTIC, message),
        }
    )


def stopped_from_outside(reported: AttemptFailure) -> AttemptFailure:
    """An Attempt whose agent reported itself cancelled while its Run was not: an SDK older than
    PodTerminated took the SIGTERM of its Pod's deletion (a person, an eviction, a drain) for a cancel.
    Not the agent's failure: infrastructure, retried from the latest Checkpoint."""
    message = (
        "the attempt Pod was stopped from outside (deleted, evicted or its node drained) while the Run was "
        f"not cancelled (the agent said: {reported.message})"
    )
    return failure(FailureClass.INFRASTRUCTURE, message, reported.exit_code)


def pod_lost() -> AttemptFailure:
    return failure(FailureClass.INFRASTRUCTURE, "the attempt Pod disappeared before it finished")


def lease_lost(duration_seconds: int) -> AttemptFailure:
    return failure(
        FailureClass.LEASE_LOST,
        f"the worker did not renew its lease within {duration_seconds}s",
    )
