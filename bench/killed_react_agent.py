"""The big-state agent of bench/agent_state.py, killed at chosen tool calls: the ReAct-style graph of
tests/support/langgraph_react.py (a model node asks for one tool call at a time, the tool answers each
with `outputBytes` characters; the ordinary `operator.add` list or a DeltaChannel), whose tool kills its
own worker process (SIGKILL) as Attempt `aN` starts call `kills["aN"]`.

    input: {calls: 200, outputBytes: 40000, delta: false, kills: {"a1": 60, "a2": 140}}
    env: AGENTRUN_TOOL_LOG (a file: "<attempt> start|end <call>" per tool call)
The result names what the final state holds: the number of tool outputs and the sha256 of their texts
in order, for the benchmark to check against what the tool returned.
"""

from __future__ import annotations

import hashlib
import os
import signal
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langgraph.graph import END, START, StateGraph

from agentrun import worker
from agentrun.integrations.langgraph import run_graph
from support.langgraph_react import Conversation, DeltaConversation, calls_made, output, task


def outputs_digest(texts: list[str]) -> str:
    return hashlib.sha256("\n".join(texts).encode()).hexdigest()


def _record(line: str) -> None:
    if path := os.environ.get("AGENTRUN_TOOL_LOG"):
        with open(path, "a") as log:
            log.write(f"{line}\n")


def build(calls: int, output_bytes: int, *, delta: bool, kills: dict[str, int]) -> StateGraph[Any]:
    attempt = os.environ.get("AGENTRUN_ATTEMPT", "outside-an-attempt")
    kill_at = kills.get(attempt.rsplit("-", 1)[-1])

    def model(state: Any) -> dict[str, Any]:
        made = calls_made(state["messages"])
        if made >= calls:
            return {"messages": [AIMessage(f"read {made} files", id=f"answer-{made}")]}
        call = {"name": "read_file", "args": {"n": made}, "id": f"call-{made}"}
        return {"messages": [AIMessage("", tool_calls=[call], id=f"ask-{made}")]}

    def tools(state: Any) -> dict[str, Any]:
        ask = state["messages"][-1]
        call = int(ask.tool_calls[0]["args"]["n"])
        _record(f"{attempt} start {call}")
        if call == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # killed mid-run, its checkpoints saved so far
        _record(f"{attempt} end {call}")
        call_id = ask.tool_calls[0]["id"]
        return {"messages": [ToolMessage(output(call, output_bytes), tool_call_id=call_id, id=f"out-{call}")]}

    builder: StateGraph[Any] = StateGraph(DeltaConversation if delta else Conversation)
    builder.add_node("model", model)
    builder.add_node("tools", tools)
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", lambda s: "tools" if s["messages"][-1].tool_calls else END)
    builder.add_edge("tools", "model")
    return builder


async def agent(ctx: worker.Context) -> Any:
    spec: dict[str, Any] = ctx.input or {}
    calls = int(spec.get("calls", 200))
    kills = {str(k): int(v) for k, v in (spec.get("kills") or {}).items()}
    graph = build(calls, int(spec.get("outputBytes", 40_000)), delta=bool(spec.get("delta")), kills=kills)
    final = await run_graph(ctx, graph, input=task(), config={"recursion_limit": 2 * calls + 10})
    texts = [m["content"] for m in final["messages"] if m.get("type") == "tool"]
    return {"messages": len(final["messages"]), "toolOutputs": len(texts), "sha256": outputs_digest(texts)}


if __name__ == "__main__":
    worker.main(agent)
