"""Errors an agent raises to say how it failed; the class decides whether the Run retries."""

from __future__ import annotations

from agentrun.api import STATE_UNVERIFIABLE, FailureClass
from agentrun.statestore import errors as store_errors


class AgentError(Exception):
    failure_class: FailureClass = FailureClass.DETERMINISTIC


class TransientError(AgentError):
    """Worth another try as is (a timeout, a 503)."""

    failure_class = FailureClass.TRANSIENT


class RateLimited(AgentError):
    """Told to slow down; the next Attempt waits at least retry_after seconds."""

    failure_class = FailureClass.RATE_LIMITED

    def __init__(self, message: str = "rate limited", retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PermanentError(AgentError):
    """Retrying cannot help without new information."""

    failure_class = FailureClass.DETERMINISTIC


class StateUnverifiable(PermanentError, store_errors.StateUnverifiable):
    """A saved state cannot be rebuilt and verified (an ancestor or entries it is rebuilt from are
    missing, or a blob in the state store is missing or not the content its reference names): the agent
    must not continue from a shorter or different state. Deterministic, reason StateUnverifiable: never
    retried as transient; a person restores the state or retries from an earlier checkpoint.

    The one class the SDK raises: it is also the state store's StateUnverifiable, so code that catches
    the store's error catches this one too. `key` names the blob (or the checkpoint) that failed."""

    reason = STATE_UNVERIFIABLE

    def __init__(self, message: str, *, key: str = "", missing: bool = False) -> None:
        Exception.__init__(self, message)
        self.key = key
        self.detail = message
        self.missing = missing

    @classmethod
    def of_blob(cls, error: store_errors.StateUnverifiable) -> StateUnverifiable:
        """The SDK's error for the store's: the same message, naming the same blob."""
        return cls(str(error), key=error.key, missing=error.missing)


class StoreUnavailable(TransientError):
    """The state store could not be reached or answered badly in time (down, slow, 5xx, a timeout):
    transient, retried inside a step, then by a new Attempt; never a permanent failure."""

    def __init__(self, message: str, *, key: str = "") -> None:
        super().__init__(message)
        self.key = key


class LeaseLost(AgentError):
    """Another Attempt holds the Run's lease now: this worker must stop writing."""

    failure_class = FailureClass.LEASE_LOST


class Cancelled(AgentError):
    """The Run was cancelled (spec.cancelEpoch grew)."""

    failure_class = FailureClass.CANCELLED


class PodTerminated(AgentError):
    """The attempt Pod was told to stop (SIGTERM) while the Run was not cancelled: deleted by a person,
    evicted or its node drained. Not the agent's failure: the next Attempt continues from the latest
    Checkpoint."""

    failure_class = FailureClass.INFRASTRUCTURE


class FenceRejected(AgentError):
    """A write lost its fence (stale_after_cancel or stale_worker): it was dropped and recorded."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.failure_class = (
            FailureClass.CANCELLED if reason == "stale_after_cancel" else FailureClass.LEASE_LOST
        )


class UnknownSideEffect(AgentError):
    """An external action may or may not have happened, or its sends reached their bounds: automation
    stops until it is reconciled. `reason` (MaxSendsReached, LookupUnavailable, ConflictingResults,
    IrreversibleUnknown, UnknownSideEffect) becomes the Run's status.failure.reason."""

    failure_class = FailureClass.UNKNOWN_SIDE_EFFECT

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class KeyReused(AgentError):
    """The idempotency key was used for another request: refused, never sent (IdempotencyKeyReused)."""

    failure_class = FailureClass.DETERMINISTIC
    reason = "IdempotencyKeyReused"


class ConflictingResult(Exception):
    """Raised by a lookup that found something other than what was asked (e.g. a ticket under the key
    with other content): the ledger records the conflict and a person decides."""


class Interrupted(BaseException):
    """Not an error: the agent asked to pause. Ends the Attempt cleanly (the worker is released)."""

    def __init__(self, request_id: str) -> None:
        super().__init__(request_id)
        self.request_id = request_id
