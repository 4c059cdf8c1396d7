"""A ReAct-style LangGraph agent whose tool returns a large output per call (a file, a web page, a query
result), for the state-store tests and bench/langgraph_state.py: a model node asks for one tool call at
a time until `calls` were made, a tool node answers each with `outputBytes` characters. The message
list is LangGraph's ordinary `Annotated[list, operator.add]` (or a DeltaChannel, `delta: true`).

    input: {calls: 50, outputBytes: 40000, delta: false, killAt: null, ledger: false}
The first Attempt kills itself (SIGKILL) as it starts tool call `killAt` (`build(kills=...)`: Attempt `aN`
as it starts call `kills["aN"]`, as bench/killed_react_agent.py runs it). Every tool call appends
"<attempt> start|end <call>" to AGENTRUN_TOOL_LOG when set. With `ledger`, each tool call is a side
effect through the Run's ledger (agentrun.integrations.langgraph.side_effect, keyed by the task and the
tool call id), whose send appends "<attempt> send <call>": the log counts what was sent.
"""

from __future__ import annotations

import operator
import os
import signal
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from agentrun import worker
from agentrun.integrations.langgraph import run_graph, side_effect


def append(messages: list[AnyMessage], writes: Sequence[list[AnyMessage]]) -> list[AnyMessage]:
    return [*messages, *(message for write in writes for message in write)]


class Conversation(TypedDict):
    messages: Annotated[list[AnyMessage], operator.add]


class DeltaConversation(TypedDict):
    messages: Annotated[list[AnyMessage], DeltaChannel(append)]


def output(call: int, size: int) -> str:
    return f"output {call}: " + "abcdefghij"[call % 10] * size


def calls_made(messages: list[AnyMessage]) -> int:
    return sum(1 for m in messages if isinstance(m, ToolMessage))


def _record(line: str) -> None:
    if path := os.environ.get("AGENTRUN_TOOL_LOG"):
        with open(path, "a") as log:
            log.write(f"{line}\n")


def build(
    calls: int,
    output_bytes: int,
    *,
    delta: bool = False,
    kill_at: int | None = None,
    kills: Mapping[str, int] | None = None,
    ledger: bool = False,
) -> StateGraph[Any]:
    """The graph; its tool kills its own process (SIGKILL) as Attempt `aN` starts call `kills["aN"]`
    (`kill_at`: the first Attempt's)."""
    killing = {**({"a1": kill_at} if kill_at is not None else {}), **(kills or {})}

    def model(state: Any) -> dict[str, Any]:
        made = calls_made(state["messages"])
        if made >= calls:
            return {"messages": [AIMessage(f"read {made} files", id=f"answer-{made}")]}
        call = {"name": "read_file", "args": {"n": made}, "id": f"call-{made}"}
        return {"messages": [AIMessage("", tool_calls=[call], id=f"ask-{made}")]}

    def tools(state: Any) -> dict[str, Any]:
        ask = state["messages"][-1]
        call = int(ask.tool_calls[0]["args"]["n"])
        attempt = os.environ.get("AGENTRUN_ATTEMPT", "outside-an-attempt")
        _record(f"{attempt} start {call}")
        if call == killing.get(attempt.rsplit("-", 1)[-1]):
            os.kill(os.getpid(), signal.SIGKILL)  # killed mid-run, its checkpoints saved so far
        _record(f"{attempt} end {call}")
        call_id = ask.tool_calls[0]["id"]
        return {"messages": [ToolMessage(output(call, output_bytes), tool_call_id=call_id, id=f"out-{call}")]}

    async def sent_tools(state: Any) -> dict[str, Any]:
        ask = state["messages"][-1]
        call, call_id = int(ask.tool_calls[0]["args"]["n"]), ask.tool_calls[0]["id"]
        attempt = os.environ.get("AGENTRUN_ATTEMPT", "outside-an-attempt")

        def send(key: str) -> dict[str, Any]:
            _record(f"{attempt} send {call}")
            return {"reference": key}

        await side_effect("read_file", send, call_id=call_id)
        return {"messages": [ToolMessage(output(call, output_bytes), tool_call_id=call_id, id=f"out-{call}")]}

    builder: StateGraph[Any] = StateGraph(DeltaConversation if delta else Conversation)
    builder.add_node("model", model)
    builder.add_node("tools", sent_tools if ledger else tools)
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", lambda s: "tools" if s["messages"][-1].tool_calls else END)
    builder.add_edge("tools", "model")
    return builder


def task() -> dict[str, Any]:
    return {"messages": [HumanMessage("read every file and summarize them", id="task")]}


async def agent(ctx: worker.Context) -> Any:
    spec: dict[str, Any] = ctx.input or {}
    calls = int(spec.get("calls", 50))
    graph = build(
        calls,
        int(spec.get("outputBytes", 40_000)),
        delta=bool(spec.get("delta")),
        kill_at=spec.get("killAt"),
        ledger=bool(spec.get("ledger")),
    )
    final = await run_graph(ctx, graph, input=task(), config={"recursion_limit": 2 * calls + 10})
    return {"messages": len(final["messages"]), "last": final["messages"][-1]["content"]}


if __name__ == "__main__":
    worker.main(agent)
