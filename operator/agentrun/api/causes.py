"""Why the API server refused a write: the causes every refusal message starts with (`<Cause>: ...`).

One list for every layer: the admission policies and the CRD's own rules write them (agentrun.admission,
agentrun.api.run), the worker SDK and the operator classify a refusal by them (agentrun.core.fence)
without reading the Run, and a person reads them in an error.
"""

from __future__ import annotations

from enum import StrEnum

from agentrun.api.attempt import RejectedCommitReason


class RefusalCause(StrEnum):
    """A refusal's cause, as its message names it."""

    # Fences a worker lost: recorded on its Attempt as a rejected commit.
    STALE_AFTER_CANCEL = "StaleAfterCancel"  # the Run's cancel epoch moved past the worker's
    STALE_WORKER = "StaleWorker"  # the Run's lease epoch moved past the worker's (or the Run stopped)
    NOT_CURRENT_ATTEMPT = "NotCurrentAttempt"  # another Attempt is the Run's current one
    # Mistakes: the same write is refused again, whatever happens.
    NOT_OWN_RUN = "NotOwnRun"  # a Pod wrote an object of another Run
    NOT_POD_BOUND = "NotPodBound"  # a service-account token not bound to a Pod
    NOT_WORKER_FIELD = "NotWorkerField"  # a field only the operator or a person writes
    NOT_OPERATOR = "NotOperator"  # an object only the operator creates
    NOT_OPERATOR_FIELD = "NotOperatorField"  # the operator's own write beyond what it is there to write
    # People: who decided is the API server's to say.
    NOT_THE_SENDER = "NotTheSender"  # a field names someone other than the requesting user
    NOT_NAMED = "NotNamed"  # a decision (an approval's answer, a resolution) names nobody

    @property
    def fence(self) -> RejectedCommitReason | None:
        """The fence a refusal for this cause means the worker lost, or None: a mistake (permanent)."""
        return _FENCES.get(self)

    def says(self, text: str) -> str:
        """A refusal message for this cause (the form the classifier reads)."""
        return f"{self.value}: {text}"

    @classmethod
    def of(cls, message: str) -> RefusalCause | None:
        """The cause a refusal's message names, or None."""
        return next((cause for cause in cls if f"{cause.value}:" in message), None)


_FENCES = {
    RefusalCause.STALE_AFTER_CANCEL: RejectedCommitReason.STALE_AFTER_CANCEL,
    RefusalCause.STALE_WORKER: RejectedCommitReason.STALE_WORKER,
    RefusalCause.NOT_CURRENT_ATTEMPT: RejectedCommitReason.STALE_WORKER,
}
