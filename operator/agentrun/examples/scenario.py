"""An agent whose behaviour is written in its Run's spec.input, for demos and tests.

input:
  steps: 3              # checkpoints to save, one per step (resumes after the last saved one)
  stepSeconds: 0.2      # work per step
  fail:                 # optional: how selected Attempts end
    attempts: [1]       # attempt numbers that fail (default: all)
    atStep: 2           # before this step (default 1)
    how: transient      # transient | ratelimited | permanent | error | crash | hang | exit75
    message: "upstream 503"
  padding:              # optional: characters added to the result or to every checkpoint state,
    result: 70000       # e.g. to go past their byte budgets
    state: 300000
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from agentrun import worker


def _fail(how: str, message: str) -> None:
    if how == "transient":
        raise worker.TransientError(message)
    if how == "ratelimited":
        raise worker.RateLimited(message, retry_after=1)
    if how == "permanent":
        raise worker.PermanentError(message)
    if how == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "exit75":
        os._exit(75)
    raise RuntimeError(message)


async def agent(ctx: worker.Context) -> dict[str, Any]:
    spec: dict[str, Any] = ctx.input or {}
    steps = int(spec.get("steps", 1))
    step_seconds = float(spec.get("stepSeconds", 0.0))
    fail: dict[str, Any] = spec.get("fail") or {}
    failing = not fail.get("attempts") or ctx.attempt_number in fail["attempts"]
    ask: dict[str, Any] = spec.get("ask") or {}
    padding: dict[str, Any] = spec.get("padding") or {}
    state: dict[str, Any] = dict(ctx.state or {})
    if padding.get("state"):
        state["padding"] = "x" * int(padding["state"])
    start = int(state.get("step", 0))
    for step in range(start + 1, steps + 1):
        if ask and step == int(ask.get("atStep", 1)) and "answer" not in state:
            state["answer"] = await ctx.interrupt(
                reason=str(ask.get("reason", "input_required")),
                prompt=ask.get("prompt"),
                schema=ask.get("schema"),
                expires_in=ask.get("expiresInSeconds"),
                hold_seconds=ask.get("holdSeconds"),
            )
        if fail and failing and step == int(fail.get("atStep", 1)):
            how = str(fail.get("how", "error"))
            if how == "hang":
                await asyncio.sleep(3600)
            _fail(how, str(fail.get("message", f"scenario failure at step {step}")))
        await asyncio.sleep(step_seconds)
        state["step"] = step
        await ctx.checkpoint(dict(state), step=f"step-{step}")
    result = {
        "steps": steps,
        "resumedAt": start,
        "attempt": ctx.attempt,
        "resumed": ctx.resumed,
        "resumeReason": ctx.resume_reason,
    }
    if "answer" in state:
        result["answer"] = state["answer"]
    if padding.get("result"):
        result["padding"] = "x" * int(padding["result"])
    return result


if __name__ == "__main__":
    worker.main(agent)
