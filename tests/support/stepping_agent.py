"""An agent that steps when a test says so: round r waits until `<dir>/go-<r>` exists, then makes `steps`
journaled ctx.step calls (each one Checkpoint, of kind Journal, and no Run write); after the last round it
waits until `<dir>/release` exists, then commits.

    input: {"dir": "/path", "rounds": 3, "steps": 20}

Attempt Pods are local processes, so the files are on the test's machine. Run with
PYTHONPATH=<repo>/tests: `python -m support.stepping_agent`.
"""

from __future__ import annotations

import asyncio
import functools
import time
from pathlib import Path
from typing import Any

from agentrun import worker


def _result(round_: int, step: int) -> dict[str, int]:
    return {"round": round_, "step": step}


def _wait_for(path: Path) -> None:
    while not path.exists():
        time.sleep(0.05)


async def agent(ctx: worker.Context) -> dict[str, Any]:
    folder = Path(ctx.input["dir"])
    made = 0
    for round_ in range(int(ctx.input["rounds"])):
        await asyncio.to_thread(_wait_for, folder / f"go-{round_}")
        for step in range(int(ctx.input["steps"])):
            await ctx.step(f"round-{round_}", functools.partial(_result, round_, step), journal=True)
            made += 1
    await asyncio.to_thread(_wait_for, folder / "release")
    return {"by": ctx.attempt, "steps": made}


if __name__ == "__main__":
    worker.main(agent)
