"""A cooperative agent that checkpoints, then waits until its `releaseFile` exists, then commits.

    input: {"releaseFile": "/path"}

The tests hold a Run Running this way while they do something to it (the file is on the same machine:
attempt Pods are local processes). Run with PYTHONPATH=<repo>/tests: `python -m support.gated_agent`.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from agentrun import worker


def _wait_for(release: Path) -> None:
    while not release.exists():
        time.sleep(0.05)


async def agent(ctx: worker.Context) -> dict[str, Any]:
    await ctx.checkpoint({"waiting": True}, step="wait")
    await asyncio.to_thread(_wait_for, Path(ctx.input["releaseFile"]))
    return {"by": ctx.attempt}


if __name__ == "__main__":
    worker.main(agent)
