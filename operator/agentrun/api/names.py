"""Names, labels and annotations that tie the objects of one Run together."""

from __future__ import annotations

from typing import Final

from agentrun.api.common import GROUP

# On every object agentrun creates for a Run: Attempts, Pods, Checkpoints, SideEffects, the Lease.
RUN_LABEL: Final = f"{GROUP}/run"
# On a ServiceAccount an administrator lets attempt Pods run as (value "true").
AGENT_LABEL: Final = f"{GROUP}/agent"
# On a namespace, "true": the notifications of its Runs carry the agent's prompt (else ids and a link only).
NOTIFY_PROMPT_LABEL: Final = f"{GROUP}/notify-prompt"

# On every attempt Pod; the worker SDK reads them through the downward API.
ATTEMPT_ANNOTATION: Final = f"{GROUP}/attempt"
LEASE_EPOCH_ANNOTATION: Final = f"{GROUP}/lease-epoch"
CANCEL_EPOCH_ANNOTATION: Final = f"{GROUP}/cancel-epoch"
RESUME_FROM_ANNOTATION: Final = f"{GROUP}/resume-from"
# What the SDK would otherwise read at start: the Attempt's reason, whether it carries an input value
# ("true"), and the resourceVersion of the Lease as the operator wrote it for this Attempt.
ATTEMPT_REASON_ANNOTATION: Final = f"{GROUP}/attempt-reason"
ATTEMPT_INPUT_ANNOTATION: Final = f"{GROUP}/attempt-input"
LEASE_VERSION_ANNOTATION: Final = f"{GROUP}/lease-resource-version"


def attempt_name(run_name: str, number: int) -> str:
    """The name of a Run's Attempt (and of its Pod): `<run>-a<number>`."""
    return f"{run_name}-a{number}"


def lease_name(run_name: str) -> str:
    """The Run's coordination.k8s.io Lease. The suffix keeps it apart from unrelated Leases."""
    return f"{run_name}.run.agentrun.dev"
