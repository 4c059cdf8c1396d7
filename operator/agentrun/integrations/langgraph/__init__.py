"""LangGraph on agentrun (extra `agentrun-k8s[langgraph]`): a checkpointer whose checkpoints are the Run's
Checkpoints, and run_graph, which runs a graph as an agentrun agent.

    from agentrun import worker
    from agentrun.integrations.langgraph import run_graph

    async def agent(ctx: worker.Context) -> dict:
        return await run_graph(ctx, builder)   # a StateGraph or a compiled graph

    worker.main(agent)
"""

from agentrun.integrations.langgraph.runner import combined_schema, current_task_id, run_graph, side_effect
from agentrun.integrations.langgraph.saver import AgentrunSaver, PauseRequested
from agentrun.integrations.langgraph.serde import AllowListSerializer, UnsafeCheckpoint

__all__ = [
    "AgentrunSaver",
    "AllowListSerializer",
    "PauseRequested",
    "UnsafeCheckpoint",
    "combined_schema",
    "current_task_id",
    "run_graph",
    "side_effect",
]
