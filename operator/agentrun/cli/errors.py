"""Errors the plugin reports on stderr, and how API refusals read to a person."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from agentrun.api.causes import RefusalCause
from agentrun.kubeapi import ApiError

# Exit codes: 0 done (or nothing to do), 1 refused, failed or not found, 2 wrong usage.
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class CliError(Exception):
    """Ends the command with `message` on stderr and exit code `code`."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class NotFound(CliError):
    """What the command names is not in the cluster."""


def not_found(kind: str, name: str, namespace: str) -> CliError:
    return NotFound(f'{kind} "{name}" not found in namespace "{namespace}"')


# What a person does about a refusal whose cause (agentrun.api.causes) a write of the plugin can meet:
# its writes name their sender (spec.resume.answeredBy, requestedBy, a SideEffect's resolvedBy) as
# SelfSubjectReview says, and a ServiceAccount's write of a SideEffect's status is judged as an agent's.
_AS_A_PERSON: Final = (
    "send it with a person's credentials: a ServiceAccount writing this is taken for an agent"
)
ADVICE: Final[Mapping[RefusalCause, str]] = {
    RefusalCause.NOT_THE_SENDER: (
        "the plugin sends the name `kubectl auth whoami` shows: check it is who this context writes as"
    ),
    RefusalCause.NOT_NAMED: (
        "the plugin names you from `kubectl auth whoami`: once that shows your name, send again"
    ),
    RefusalCause.NOT_POD_BOUND: _AS_A_PERSON,
    RefusalCause.NOT_OWN_RUN: _AS_A_PERSON,
    RefusalCause.NOT_OPERATOR_FIELD: (
        "send it with your own credentials, not the agentrun operator's (it may change only managedFields)"
    ),
}
# The causes no write of the plugin meets: the fences and the fields of an attempt Pod (they need a
# token of the Run's own Attempt), and what only the operator creates (the Pods and Leases of a Run).
BEYOND_THE_PLUGIN: Final = frozenset(
    {
        RefusalCause.STALE_AFTER_CANCEL,
        RefusalCause.STALE_WORKER,
        RefusalCause.NOT_CURRENT_ATTEMPT,
        RefusalCause.NOT_WORKER_FIELD,
        RefusalCause.NOT_OPERATOR,
    }
)


def advice(message: str) -> str | None:
    """What to do about a refusal, from the cause its message starts with; None for another refusal."""
    cause = RefusalCause.of(message)
    return ADVICE.get(cause) if cause is not None else None


def describe_api_error(exc: ApiError, doing: str = "") -> str:
    """One line for a refusal of the API server: what it was, and the server's own words; then, when
    its cause is one a person meets, a line of what to do."""
    prefix = f"{doing}: " if doing else ""
    kinds = {
        400: "bad request",
        401: "unauthorized (check your kubeconfig credentials)",
        403: "forbidden",
        404: "not found",
        409: "conflict",
        422: "invalid",
        429: "too many requests",
    }
    kind = kinds.get(exc.status, "server error" if exc.status >= 500 else f"HTTP {exc.status}")
    message = exc.message.strip() or exc.reason
    if exc.status == 404 and "could not find the requested resource" in message:
        message += " (are the agentrun CRDs installed in this cluster?)"
    said = f"{prefix}{kind}: {message}"
    todo = advice(message)
    return f"{said}\nwhat to do: {todo}" if todo else said


def api_error_from(exc: BaseException) -> ApiError | None:
    """The API server's refusal behind `exc`, or None when it is something else."""
    return exc if isinstance(exc, ApiError) else None
