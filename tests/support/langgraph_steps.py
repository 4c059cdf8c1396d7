"""A LangGraph agent of plain steps (one node per superstep), for the tests: it counts the worker's API
requests per superstep, and can wait (at one step) for the test to say go, so that a pause asked
meanwhile is honoured at the next boundary.

    input: {steps: 5, waitAt: 2}    env: AGENTRUN_STEP_LOG (a file), AGENTRUN_GO (a file to wait for)
Every node appends "<attempt> <node> <API requests so far>" to AGENTRUN_STEP_LOG.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from agentrun import worker
from agentrun.integrations.langgraph import run_graph
from agentrun.kubeapi import KubeApi


class Steps(TypedDict, total=False):
    done: list[str]


def _record(name: str, requests: int, wait: bool) -> None:
    with open(os.environ["AGENTRUN_STEP_LOG"], "a") as log:
        log.write(f"{os.environ['AGENTRUN_ATTEMPT']} {name} {requests}\n")
    go = Path(os.environ.get("AGENTRUN_GO", "/nonexistent"))
    while wait and not go.exists():
        time.sleep(0.05)  # the test's go: it asked for a pause meanwhile


def build(api: KubeApi, steps: int, wait_at: int | None) -> StateGraph[Steps]:
    def node(name: str, index: int) -> Any:
        async def run(state: Steps) -> dict[str, Any]:
            await asyncio.to_thread(_record, name, api.requests, index == wait_at)
            return {"done": [*state.get("done", []), name]}

        return run

    builder = StateGraph(Steps)
    previous = START
    for index in range(1, steps + 1):
        builder.add_node(f"s{index}", node(f"s{index}", index))
        builder.add_edge(previous, f"s{index}")
        previous = f"s{index}"
    builder.add_edge(previous, END)
    return builder


async def agent(ctx: worker.Context) -> Any:
    spec: dict[str, Any] = ctx.input or {}
    api = ctx.store.api  # the worker's own client: its request counter
    return await run_graph(ctx, build(api, int(spec.get("steps", 5)), spec.get("waitAt")), input={"done": []})


if __name__ == "__main__":
    worker.main(agent)
