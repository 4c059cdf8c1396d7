"""The big-state agent of bench/agent_state.py, killed at chosen tool calls: the ReAct-style graph of
tests/support/langgraph_react.py itself (a model node asks for one tool call at a time, the tool answers
each with `outputBytes` characters; the ordinary `operator.add` list or a DeltaChannel), built with its
kill switch: the tool kills its own worker process (SIGKILL) as Attempt `aN` starts call `kills["aN"]`.

    input: {calls: 200, outputBytes: 40000, delta: false, kills: {"a1": 60, "a2": 140}}
    env: AGENTRUN_TOOL_LOG (a file: "<attempt> start|end <call>" per tool call)
The result names what the final state holds: the number of tool outputs and the sha256 of their texts
in order, for the benchmark to check against what the tool returned.
"""

from __future__ import annotations

import hashlib
from typing import Any

from agentrun import worker
from agentrun.integrations.langgraph import run_graph
from support.langgraph_react import build, task


def outputs_digest(texts: list[str]) -> str:
    return hashlib.sha256("\n".join(texts).encode()).hexdigest()


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
