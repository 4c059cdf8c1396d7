"""An agent for the tests and the benchmark of a finished Run's lifecycle (compaction, Pods collected):
it prints a line per step, saves `checkpoints` Checkpoints of about `stateBytes` each, makes `effects`
side effects through the ledger, and fails (an error, after printing `failMarker`) in the Attempts listed
in `failAttempts`.

    input: {checkpoints: 10, stateBytes: 20000, effects: 2, failAttempts: [1], failMarker: "boom-1234"}
"""

from __future__ import annotations

from typing import Any

from agentrun import worker


async def agent(ctx: worker.Context) -> dict[str, Any]:
    spec = ctx.input or {}
    count, size = int(spec.get("checkpoints", 3)), int(spec.get("stateBytes", 100))
    number = int(ctx.attempt.rsplit("-a", 1)[1])
    start = int((ctx.state or {}).get("step", 0))
    for step in range(start, count):
        print(f"{ctx.attempt}: step {step + 1} of {count}", flush=True)
        await ctx.checkpoint({"step": step + 1, "padding": "x" * size}, step=f"step-{step + 1}")
    for n in range(int(spec.get("effects", 0))):
        await ctx.side_effect(tool="note", key=f"{ctx.run_name}-note-{n}", execute=lambda key: {"id": key})
    if number in spec.get("failAttempts", []):
        print(f"{ctx.attempt}: {spec.get('failMarker', 'failing')}", flush=True)
        raise RuntimeError(f"{ctx.attempt} fails as its input asks")
    return {"done": True, "attempt": ctx.attempt}


if __name__ == "__main__":
    worker.main(agent)
