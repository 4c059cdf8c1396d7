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
  step:                 # optional: a ctx.step call in agent step `atStep` (default 1), before `fail`
    name: model
    calls: /tmp/calls   # a file that gets a line per call of the step's function (counts them)
    failTimes: 2        # its first failTimes calls (in all, across Attempts) raise `how`
    how: transient      # transient | ratelimited
    journal: false
    retry: {maxAttempts: 4, initialSeconds: 0.1, maxSeconds: 0.2}
    repeat: 1           # how many times the step is called there
  usage:                # optional: ctx.add_usage in every agent step, `times` times
    inputTokens: 100
    outputTokens: 10
    costUSD: 0.001
    modelCalls: 1
    times: 1
  reportRequests: true  # the result carries the API requests this Attempt made so far (apiRequests)
  gate:                 # optional: before step `atStep` (default 2) wait until `file` exists, so a test
    file: /tmp/gate     # holds the Run Running (at a step boundary to come) until it has done something
    atStep: 2
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

from agentrun import worker


async def _step(ctx: worker.Context, spec: dict[str, Any]) -> Any:
    calls = Path(str(spec["calls"]))
    fail_times, how = int(spec.get("failTimes", 0)), str(spec.get("how", "transient"))

    def call() -> dict[str, Any]:
        with calls.open("a") as f:
            f.write(f"{ctx.attempt}\n")
        count = len(calls.read_text().splitlines())
        if count <= fail_times:
            _fail(how, f"call {count} of {spec.get('name', 'model')} failed")
        return {"call": count, "by": ctx.attempt}

    retry = spec.get("retry") or {}
    policy = worker.StepRetry(
        max_attempts=int(retry.get("maxAttempts", 3)),
        initial_seconds=float(retry.get("initialSeconds", 0.1)),
        max_seconds=float(retry.get("maxSeconds", 1.0)),
    )
    name, journal = str(spec.get("name", "model")), bool(spec.get("journal", False))
    return [
        await ctx.step(name, call, retry=policy, journal=journal) for _ in range(int(spec.get("repeat", 1)))
    ]


def _add_usage(ctx: worker.Context, usage: dict[str, Any]) -> None:
    for _ in range(int(usage.get("times", 1))):
        ctx.add_usage(
            input_tokens=int(usage.get("inputTokens", 0)),
            output_tokens=int(usage.get("outputTokens", 0)),
            cost_usd=float(usage.get("costUSD", 0.0)),
            model_calls=int(usage.get("modelCalls", 0)),
        )


def _wait_for_file(path: Path) -> None:
    while not path.exists():
        time.sleep(0.05)  # clock-exempt: an agent's own code (a thread polling a file), not the SDK's


def _fail(how: str, message: str) -> None:
    if how == "transient":
        raise worker.TransientError(message)
    if how == "ratelimited":
        raise worker.RateLimited(message, retry_after=1)
    if how == "permanent":
        raise worker.PermanentError(message)
    if how == "crash":
        # SIGKILL, as the kernel kills. In a container the agent is often PID 1 of its PID namespace, which
        # ignores SIGKILL sent from inside: there it exits with the status a SIGKILL gives (128 + 9).
        if os.getpid() == 1:
            os._exit(128 + signal.SIGKILL)
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
    step_spec: dict[str, Any] = spec.get("step") or {}
    gate: dict[str, Any] = spec.get("gate") or {}
    step_results: list[Any] = []
    for step in range(start + 1, steps + 1):
        if spec.get("usage"):
            _add_usage(ctx, spec["usage"])
        if step_spec and step == int(step_spec.get("atStep", 1)):
            step_results = await _step(ctx, step_spec)
        if ask and step == int(ask.get("atStep", 1)) and "answer" not in state:
            state["answer"] = await ctx.interrupt(
                reason=str(ask.get("reason", "input_required")),
                prompt=ask.get("prompt"),
                schema=ask.get("schema"),
                expires_in=ask.get("expiresInSeconds"),
                hold_seconds=ask.get("holdSeconds"),
            )
        if gate and step == int(gate.get("atStep", 2)):
            await asyncio.to_thread(_wait_for_file, Path(str(gate["file"])))
        if fail and failing and step == int(fail.get("atStep", 1)):
            how = str(fail.get("how", "error"))
            if how == "hang":
                await asyncio.Event().wait()  # forever: only a stop from outside ends it
            _fail(how, str(fail.get("message", f"scenario failure at step {step}")))
        await asyncio.sleep(step_seconds)  # clock-exempt: an agent's own work, not the SDK's
        state["step"] = step
        await ctx.checkpoint(dict(state), step=f"step-{step}")
    result: dict[str, Any] = {
        "steps": steps,
        "resumedAt": start,
        "attempt": ctx.attempt,
        "resumed": ctx.resumed,
        "resumeReason": ctx.resume_reason,
    }
    if step_results:
        result["stepResults"] = step_results
    if spec.get("reportRequests"):
        result["apiRequests"] = ctx.store.api.requests
    if "answer" in state:
        result["answer"] = state["answer"]
    if padding.get("result"):
        result["padding"] = "x" * int(padding["result"])
    return result


if __name__ == "__main__":
    worker.main(agent)
