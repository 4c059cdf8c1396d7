"""An agent whose state outgrows the inline threshold, for the state-store tests: it adds one output per
step to its state and checkpoints after each; a journaled step fetches a large document; it returns a
large result.

    input: {steps: 5, outputBytes: 20000, killAt: 3, askAt: null, resultBytes: 40000, stampAttempt: false}
The first Attempt kills itself (SIGKILL) right after the journaled fetch of step `killAt`; with `askAt`,
the agent asks a question after checkpointing step `askAt` (the Run waits; the test may tamper with the
stored state meanwhile). With `stampAttempt` each checkpoint's state also names the Attempt that saved it
(`by`), as most agents' states differ from one Attempt to the next (ids, times): a retried step then
saves other bytes, at another address. The result says what the agent saw: every output it holds, who
fetched the document, and a digest of its whole state.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
from typing import Any

from agentrun import worker


def output(step: int, size: int) -> str:
    return f"output {step}: " + "abcdefghij"[step % 10] * size


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


async def agent(ctx: worker.Context) -> dict[str, Any]:
    spec = ctx.input
    steps, size = int(spec["steps"]), int(spec["outputBytes"])
    kill_at, ask_at = spec.get("killAt"), spec.get("askAt")
    state: dict[str, Any] = ctx.state or {"outputs": [], "fetched": None}
    first_attempt = ctx.attempt.endswith("-a1")
    for step in range(len(state["outputs"]), steps):
        state["outputs"].append(output(step, size))
        if step == kill_at:

            def fetch() -> dict[str, str]:
                return {"by": ctx.attempt, "document": "d" * size}

            state["fetched"] = (await ctx.step("fetch", fetch, journal=True))["by"]
            if first_attempt:
                # In a container this agent is PID 1 of its PID namespace, which ignores SIGKILL sent
                # from inside: there it exits with the status a SIGKILL gives (128 + 9).
                if os.getpid() == 1:
                    os._exit(128 + signal.SIGKILL)
                os.kill(os.getpid(), signal.SIGKILL)
        if spec.get("stampAttempt"):
            state["by"] = ctx.attempt
        await ctx.checkpoint(state, step=f"step-{step}")
        if step == ask_at and not ctx.resumed:
            await ctx.interrupt(prompt="carry on?")
    return {
        "outputs": [o[: len(f"output {i}: ") + 1] for i, o in enumerate(state["outputs"])],
        "complete": state["outputs"] == [output(i, size) for i in range(steps)],
        "fetchedBy": state["fetched"],
        "stateDigest": digest(state),
        "attempt": ctx.attempt,
        "padding": "p" * int(spec.get("resultBytes", 0)),
    }


if __name__ == "__main__":
    worker.main(agent)
