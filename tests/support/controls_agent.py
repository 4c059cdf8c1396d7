"""An agent for the control-operation tests (pause at every step boundary, re-observation).

    input: {"mode": "ask" | "loop" | "approve" | "observe", ...}

ask: checkpoints, waits for `gate` (a file), then asks a typed question (the PRIORITY schema).
loop: `count` side effects in a row, each creating a file in `dir` (creating it twice would fail); with
`gate` and `gateAfter`, it waits for `gate` after that many (the test asks for a pause meanwhile).
approve: checkpoints, waits for `gate`, then one side effect that needs approval (a file in `dir`).
observe: reads `world` (a file), checkpoints, waits for `gate`, checkpoints again, then acts on what it
saw; after a resume it looks at the world again first.

Run with PYTHONPATH=<repo>/tests: `python -m support.controls_agent`.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from agentrun import worker
from support.runs import PRIORITY


def _wait_for(path: Path) -> None:
    while not path.exists():
        time.sleep(0.05)


def _create(path: Path) -> dict[str, Any]:
    with path.open("x") as f:  # "x": a second send of the same effect fails loudly
        f.write("sent")
    return {"reference": path.name}


async def agent(ctx: worker.Context) -> dict[str, Any]:
    spec: dict[str, Any] = ctx.input
    state: dict[str, Any] = dict(ctx.state or {})
    result: dict[str, Any] = {"resumed": ctx.resumed, "resumeReason": ctx.resume_reason}
    match spec["mode"]:
        case "ask":
            await ctx.checkpoint({"step": 1}, step="before-question")
            await asyncio.to_thread(_wait_for, Path(spec["gate"]))
            result["answer"] = await ctx.interrupt(prompt="Priority?", schema=PRIORITY)
        case "loop":
            sent = Path(spec["dir"])
            for n in range(int(spec["count"])):
                if "gate" in spec and n == int(spec["gateAfter"]):
                    await asyncio.to_thread(_wait_for, Path(spec["gate"]))
                path = sent / f"{n:03d}"

                def send(_key: str, path: Path = path) -> dict[str, Any]:
                    return _create(path)

                await ctx.side_effect(tool="send", key=f"{ctx.run_name}-{n}", execute=send)
        case "approve":
            await ctx.checkpoint({"step": 1}, step="before-approval")
            await asyncio.to_thread(_wait_for, Path(spec["gate"]))
            path = Path(spec["dir"]) / "000"
            await ctx.side_effect(
                tool="deploy",
                key=f"{ctx.run_name}-deploy",
                execute=lambda _key: _create(path),
                requires_approval=True,
            )
        case "observe":
            world = Path(spec["world"])
            if ctx.resumed or "seen" not in state:
                # What was seen before a pause may have changed since: look again after any resume.
                state["seen"] = await asyncio.to_thread(world.read_text)
            await ctx.checkpoint(state, step="observed")
            await asyncio.to_thread(_wait_for, Path(spec.get("gate", world)))
            await ctx.checkpoint(state, step="before-acting")  # the boundary the pause stops at
            result["actedOn"] = state["seen"]
    return result


if __name__ == "__main__":
    worker.main(agent)
