"""An agent for the fork tests: two side effects between three checkpoints.

    input: {"dir": <a directory>, "first": <key>, "second": <key>, "pad": <characters of state>,
            "holdFirst": <a gate: a path where no file is>}

It checkpoints (step 1, "planned"), creates the file `dir/<first>` (a side effect under the key `first`),
checkpoints (step 2, "first-sent"), creates `dir/<second>`, checkpoints (step 3) and returns what became
of both. Each Attempt calls both side effects again, whatever its resume point, as an agent that re-runs
its steps does (LangGraph's time travel): the ledger decides what is executed. Each file is created with
"x": a second send under the same key fails loudly, so the files count the sends.

With holdFirst, the first send waits until someone opens the gate (a FIFO it makes there) for writing,
and the second checkpoint ("first-in-flight") is saved while it waits: a fork from it inherits a record
whose outcome is open.

Run with PYTHONPATH=<repo>/tests: `python -m support.fork_agent`.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from agentrun import worker


def _sender(path: Path) -> Any:
    def send(key: str) -> dict[str, Any]:
        with path.open("x") as f:
            f.write(key)
        return {"reference": path.name}

    return send


def _held_sender(path: Path, gate: Path, started: asyncio.Event) -> Any:
    """A send that says it started, then waits until `gate` (a FIFO made there) is opened for writing
    before it creates its file: opening a FIFO for reading blocks until a writer comes, no polling."""
    loop = asyncio.get_running_loop()
    send = _sender(path)

    def held(key: str) -> dict[str, Any]:
        if not gate.exists():  # a later Attempt finds the one an earlier one made
            os.mkfifo(gate)
        loop.call_soon_threadsafe(started.set)
        with gate.open("rb"):
            pass
        result: dict[str, Any] = send(key)
        return result

    return held


async def _first_in_flight(ctx: worker.Context, spec: dict[str, Any], pad: str) -> Any:
    """The first side effect sent and held, a checkpoint saved meanwhile (its ledger mark counts the
    record in flight), then the answer awaited."""
    started = asyncio.Event()
    execute = _held_sender(Path(spec["dir"]) / spec["first"], Path(spec["holdFirst"]), started)
    sending = asyncio.create_task(
        ctx.side_effect(tool="send", key=spec["first"], execute=execute, request={"n": 1})
    )
    await started.wait()
    await ctx.checkpoint({"step": 2, "pad": pad}, step="first-in-flight")
    return await sending


def _outcome(effect: Any) -> dict[str, Any]:
    return {"reference": effect.reference, "executedNow": effect.executed_now, "inherited": effect.inherited}


async def agent(ctx: worker.Context) -> dict[str, Any]:
    spec: dict[str, Any] = ctx.input
    sent = Path(spec["dir"])
    resumed_at = (ctx.state or {}).get("step", 0)
    pad = "x" * int(spec.get("pad", 0))  # a state this large goes to the state store
    if resumed_at < 1:
        await ctx.checkpoint({"step": 1, "pad": pad}, step="planned")
    if "holdFirst" in spec and resumed_at < 2:
        first = await _first_in_flight(ctx, spec, pad)
    else:
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
