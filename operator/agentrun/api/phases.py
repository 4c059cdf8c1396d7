"""The sets of phases the operator, the worker and the CLI reason about, defined once."""

from __future__ import annotations

from typing import Final

from agentrun.api.attempt import FINISHED_ATTEMPT_PHASES, AttemptPhase
from agentrun.api.run import RunPhase

# The Run is over: nothing runs for it again (a Failed Run only on a manual retry).
TERMINAL_PHASES: Final = frozenset({RunPhase.SUCCEEDED, RunPhase.FAILED, RunPhase.CANCELLED})
# The Run waits for an answer to its pending request.
WAITING_PHASES: Final = frozenset({RunPhase.INPUT_REQUIRED, RunPhase.AUTH_REQUIRED, RunPhase.PAUSED})
# Nothing runs for the Run until a person acts: terminal, or a side effect to reconcile by hand.
STOPPED_PHASES: Final = TERMINAL_PHASES | {RunPhase.NEEDS_RECONCILIATION}
# The Run waits for a person: an answer, or a SideEffect to resolve.
WAITING_FOR_A_PERSON: Final = WAITING_PHASES | {RunPhase.NEEDS_RECONCILIATION}
# The Run phases in which its current Attempt runs (and a commit of it can land).
ATTEMPT_RUNS_IN: Final = frozenset({RunPhase.RUNNING, RunPhase.CANCEL_REQUESTED})
# The Attempt phases of an Attempt that has not ended (no phase yet: its Pod is being created).
UNFINISHED_ATTEMPT_PHASES: Final = frozenset(AttemptPhase) - FINISHED_ATTEMPT_PHASES

__all__ = [
    "ATTEMPT_RUNS_IN",
    "FINISHED_ATTEMPT_PHASES",
    "STOPPED_PHASES",
    "TERMINAL_PHASES",
    "UNFINISHED_ATTEMPT_PHASES",
    "WAITING_FOR_A_PERSON",
    "WAITING_PHASES",
]
