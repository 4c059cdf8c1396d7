"""A ReAct-style LangGraph agent that reads files (a large output per tool call, support.langgraph_react's
`output`) into its message list and keeps what it read in a `files` channel: a dict merged call by call,
whose value after two calls is no pending write's value, so the saver stores it as a channel version blob
that only the checkpoint's manifest names (no Checkpoint object does). For the hostile-store tests: it asks
a person once (a LangGraph interrupt) after `askAt` calls, so that a Pod of the namespace can overwrite one
of its channel blobs while it waits.

    input: {calls: 4, outputBytes: 20000, askAt: 2}    env: AGENTRUN_TOOL_LOG (a file)
Every tool call appends "<attempt> start|end <call>" to AGENTRUN_TOOL_LOG when set. Its result is the
final state's digest: each tool output's and each file's sha256 (the whole state, not just its size).
"""

from __future__ import annotations

import hashlib
import operator
import os
from typing import Annotated, Any

from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt
from typing_extensions import TypedDict

from agentrun import worker
from agentrun.integrations.langgraph import run_graph
from support.langgraph_react import calls_made, output, task


def _record(line: str) -> None:
    if path := os.environ.get("AGENTRUN_TOOL_LOG"):
        with open(path, "a") as log:
            log.write(f"{line}\n")


def merge(files: dict[str, str], read: dict[str, str]) -> dict[str, str]:
    return {**files, **read}


class Reading(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], operator.add]
    files: Annotated[dict[str, str], merge]


def name(call: int) -> str:
    return f"file-{call}"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def summary(calls: int, size: int) -> dict[str, Any]:
    """The result of a run that read every file once, its state whole."""
    outputs = [sha(output(call, size)) for call in range(calls)]
    return {
        "toolOutputs": outputs,
        "files": {name(call): digest for call, digest in enumerate(outputs)},
        "last": f"read {calls} files",
    }


def build(calls: int, size: int, ask_at: int | None) -> StateGraph[Any]:
    def model(state: Any) -> dict[str, Any]:
        made = calls_made(state["messages"])
        if made == ask_at:
            interrupt(f"read {made} files: go on?")  # answered (or retried): the model goes on
        if made >= calls:
            return {"messages": [AIMessage(f"read {made} files", id=f"answer-{made}")]}
        call = {"name": "read_file", "args": {"n": made}, "id": f"call-{made}"}
        return {"messages": [AIMessage("", tool_calls=[call], id=f"ask-{made}")]}

    def tools(state: Any) -> dict[str, Any]:
        ask = state["messages"][-1]
        call, call_id = int(ask.tool_calls[0]["args"]["n"]), ask.tool_calls[0]["id"]
        attempt = os.environ.get("AGENTRUN_ATTEMPT", "outside-an-attempt")
        _record(f"{attempt} start {call}")
        content = output(call, size)
        _record(f"{attempt} end {call}")
        return {
            "messages": [ToolMessage(content, tool_call_id=call_id, id=f"out-{call}")],
            "files": {name(call): content},
        }

    builder: StateGraph[Any] = StateGraph(Reading)
    builder.add_node("model", model)
    builder.add_node("tools", tools)
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", lambda s: "tools" if s["messages"][-1].tool_calls else END)
    builder.add_edge("tools", "model")
    return builder


async def agent(ctx: worker.Context) -> Any:
    spec: dict[str, Any] = ctx.input or {}
    calls = int(spec.get("calls", 4))
    graph = build(calls, int(spec.get("outputBytes", 20_000)), spec.get("askAt"))
    final = await run_graph(
        ctx, graph, input={**task(), "files": {}}, config={"recursion_limit": 2 * calls + 10}
    )
    messages = final["messages"]
    return {
        "toolOutputs": [sha(m["content"]) for m in messages if m["type"] == "tool"],
        "files": {key: sha(value) for key, value in final["files"].items()},
        "last": messages[-1]["content"],
    }


if __name__ == "__main__":
    worker.main(agent)
