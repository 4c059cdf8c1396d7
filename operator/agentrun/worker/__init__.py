"""The agentrun worker SDK: what an agent imports inside its attempt Pod.

from agentrun import worker

async def agent(ctx: worker.Context) -> dict:
    await ctx.checkpoint({"step": 1}, step="plan")
    return {"answer": 42}

worker.main(agent)

Framework integrations (agentrun.integrations) and the examples use this module's names only, and
`ctx.store` (a RunPort) for fenced access to the Run: never a submodule (an import contract holds it).
"""

from agentrun.core.steps import StepRetry
from agentrun.worker.blobs import INLINE_THRESHOLD, RunBlobs
from agentrun.worker.compensation import Compensation
from agentrun.worker.context import SCHEMA_ADVICE, Context
from agentrun.worker.effects import Effect
from agentrun.worker.errors import (
    ConflictingResult,
    Interrupted,
    KeyReused,
    PermanentError,
    RateLimited,
    StateUnverifiable,
    StoreUnavailable,
    TransientError,
    UnknownSideEffect,
)
from agentrun.worker.identity import Identity, NotInAttemptPod
from agentrun.worker.main import main
from agentrun.worker.port import RunPort
from agentrun.worker.session import refuse_over_budget

# The earlier name of ctx.store's class, kept for integrations written against it.
RunStore = RunPort

__all__ = [
    "INLINE_THRESHOLD",
    "SCHEMA_ADVICE",
    "Compensation",
    "ConflictingResult",
    "Context",
    "Effect",
    "Identity",
    "Interrupted",
    "KeyReused",
    "NotInAttemptPod",
    "PermanentError",
    "RateLimited",
    "RunBlobs",
    "RunPort",
    "RunStore",
    "StateUnverifiable",
    "StepRetry",
    "StoreUnavailable",
    "TransientError",
    "UnknownSideEffect",
    "main",
    "refuse_over_budget",
]
