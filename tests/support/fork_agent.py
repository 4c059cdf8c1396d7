"""An agent for the fork tests: two side effects between three checkpoints.

    input: {"dir": <a directory>, "first": <key>, "second": <key>, "pad": <characters of state>}

It checkpoints (step 1, "planned"), creates the file `dir/<first>` (a side effect under the key `first`),
checkpoints (step 2, "first-sent"), creates `dir/<second>`, checkpoints (step 3) and returns what became
of both. Each Attempt calls both side effects again, whatever its resume point, as an agent that re-runs
its steps does (LangGraph's time travel): the ledger decides what is executed. Each file is created with
"x": a second send under the same key fails loudly, so the files count the sends.

Run with PYTHONPATH=<repo>/tests: `python -m support.fork_agent`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrun import worker


def _sender(path: Path) -> Any:
    def send(key: str) -> dict[str, Any]:
        with path.open("x") as f:
            f.write(key)
        return {"reference": path.name}

    return send


def _outcome(effect: Any) -> dict[str, Any]:
    return {"reference": effect.reference, "executedNow": effect.executed_now, "inherited": effect.inherited}


async def agent(ctx: worker.Context) -> dict[str, Any]:
    spec: dict[str, Any] = ctx.input
    sent = Path(spec["dir"])
    resumed_at = (ctx.state or {}).get("step", 0)
    pad = "x" * int(spec.get("pad", 0))  # a state this large goes to the state store
    if resumed_at < 1:
        await ctx.checkpoint({"step": 1, "pad": pad}, step="planned")
    first = await ctx.side_effect(
        tool="send", key=spec["first"], execute=_sender(sent / spec["first"]), request={"n": 1}
    )
    if resumed_at < 2:
        await ctx.checkpoint({"step": 2, "pad": pad}, step="first-sent")
    second = await ctx.side_effect(
        tool="send", key=spec["second"], execute=_sender(sent / spec["second"]), request={"n": 2}
    )
    await ctx.checkpoint({"step": 3}, step="done")
    return {"resumedAt": resumed_at, "first": _outcome(first), "second": _outcome(second)}


if __name__ == "__main__":
    worker.main(agent)
