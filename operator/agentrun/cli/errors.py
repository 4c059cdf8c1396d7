"""Errors the plugin reports on stderr, and how API refusals read to a person."""

from __future__ import annotations

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


def not_found(kind: str, name: str, namespace: str) -> CliError:
    return CliError(f'{kind} "{name}" not found in namespace "{namespace}"')


def describe_api_error(exc: ApiError, doing: str = "") -> str:
    """One line for a refusal of the API server: what it was, and the server's own words."""
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
    return f"{prefix}{kind}: {message}"


def api_error_from(exc: BaseException) -> ApiError | None:
    """The API server's refusal behind `exc`, or None when it is something else."""
    return exc if isinstance(exc, ApiError) else None
