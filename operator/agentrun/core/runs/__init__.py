"""The Run state machine: `decide(world)` evaluates the table of rules (core.runs.table): the first rule
that applies gives a Transition (core.runs.transition), which `render` turns into the Plan."""

from agentrun.core.runs.table import TABLE, decide
from agentrun.core.runs.transition import EndAttempt, SetPhase, Transition, render
from agentrun.core.runs.world import RECHECK_SECONDS, World

__all__ = [
    "RECHECK_SECONDS",
    "TABLE",
    "EndAttempt",
    "SetPhase",
    "Transition",
    "World",
    "decide",
    "render",
]
