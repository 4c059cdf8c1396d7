"""A LangGraph agent whose message list grows with every tool call, kept in a DeltaChannel (as the saver
advises for such lists), for the tests: a model node asks for `calls` tool calls one at a time, a tool
node answers each; the first Attempt kills itself (SIGKILL) as it starts tool call `killAt`.

    input: {calls: 30, killAt: 15, snapshots: true}    env: AGENTRUN_TOOL_LOG (a file)
With snapshots, the channel stores its whole value every 10 updates; without, at LangGraph's default
frequency (every 100 updates). Every tool call appends "<attempt> start|end <call>" to AGENTRUN_TOOL_LOG.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from typing import Annotated, Any

from langgraph.channels.delta import DeltaChannel
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from agentrun import worker
from agentrun.integrations.langgraph import run_graph


def append(messages: list[str], writes: Sequence[list[str]]) -> list[str]:
    return [*messages, *(message for write in writes for message in write)]


class Conversation(TypedDict, total=False):
    messages: Annotated[list[str], DeltaChannel(append)]


class Snapshotted(TypedDict, total=False):
    messages: Annotated[list[str], DeltaChannel(append, snapshot_frequency=10)]


def output(call: int) -> str:
    return f"output {call}: " + "x" * 200  # what a tool returns, a little of it


def calls_made(messages: list[str]) -> int:
    return sum(1 for m in messages if m.startswith("call "))


def _record(line: str) -> None:
    if path := os.environ.get("AGENTRUN_TOOL_LOG"):
        with open(path, "a") as log:
            log.write(f"{line}\n")


def build(calls: int, kill_at: int | None, snapshots: bool) -> StateGraph[Any]:
    def model(state: Any) -> dict[str, Any]:
        made = calls_made(state.get("messages", []))
        return {"messages": [f"call {made}" if made < calls else "done"]}

    def tools(state: Any) -> dict[str, Any]:
        call = calls_made(state["messages"]) - 1
        attempt = os.environ.get("AGENTRUN_ATTEMPT", "outside-an-attempt")
        _record(f"{attempt} start {call}")
        if call == kill_at and attempt.endswith("-a1"):
            os.kill(os.getpid(), signal.SIGKILL)  # killed mid-run, its checkpoints saved so far
        _record(f"{attempt} end {call}")
        return {"messages": [output(call)]}

    builder: StateGraph[Any] = StateGraph(Snapshotted if snapshots else Conversation)
    builder.add_node("model", model)
    builder.add_node("tools", tools)
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", lambda s: END if s["messages"][-1] == "done" else "tools")
    builder.add_edge("tools", "model")
    return builder


async def agent(ctx: worker.Context) -> Any:
    spec: dict[str, Any] = ctx.input or {}
    graph = build(int(spec.get("calls", 30)), spec.get("killAt"), bool(spec.get("snapshots")))
    return await run_graph(ctx, graph, input={"messages": ["task"]}, config={"recursion_limit": 1000})


if __name__ == "__main__":
    worker.main(agent)
