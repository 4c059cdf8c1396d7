"""The agentrun worker SDK: what an agent imports inside its attempt Pod.

from agentrun import worker

async def agent(ctx: worker.Context) -> dict:
    await ctx.checkpoint({"step": 1}, step="plan")
    return {"answer": 42}

worker.main(agent)
"""

from agentrun.core.steps import StepRetry
from agentrun.worker.compensation import Compensation
from agentrun.worker.context import Context
from agentrun.worker.effects import Effect
from agentrun.worker.errors import (
    ConflictingResult,
    KeyReused,
    PermanentError,
    RateLimited,
    StateUnverifiable,
    TransientError,
    UnknownSideEffect,
)
from agentrun.worker.main import main

__all__ = [
    "Compensation",
    "ConflictingResult",
    "Context",
    "Effect",
    "KeyReused",
    "PermanentError",
    "RateLimited",
    "StateUnverifiable",
    "StepRetry",
    "TransientError",
    "UnknownSideEffect",
    "main",
]
