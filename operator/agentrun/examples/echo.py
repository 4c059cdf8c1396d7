"""The smallest agent: returns its input."""

from __future__ import annotations

from typing import Any

from agentrun import worker


async def agent(ctx: worker.Context) -> dict[str, Any]:
    return {"echo": ctx.input}


if __name__ == "__main__":
    worker.main(agent)
