"""A LangGraph agent that asks two questions at once (two parallel nodes, each interrupting), for the
tests: both are one agentrun request, answered with one resume. input: {"holdSeconds": N} holds it."""

from __future__ import annotations

from typing import Any

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt
from typing_extensions import TypedDict

from agentrun import worker
from agentrun.integrations.langgraph import run_graph

COLOR = {"type": "object", "properties": {"color": {"enum": ["red", "blue"]}}, "required": ["color"]}
SIZE = {"type": "object", "properties": {"size": {"type": "integer"}}, "required": ["size"]}


class Answers(TypedDict, total=False):
    color: str
    size: int


def color(state: Answers) -> dict[str, Any]:
    return {"color": interrupt("color?", response_schema=COLOR)["color"]}


def size(state: Answers) -> dict[str, Any]:
    return {"size": interrupt("size?", response_schema=SIZE)["size"]}


def build() -> StateGraph[Answers]:
    builder = StateGraph(Answers)
    builder.add_node("color", color)
    builder.add_node("size", size)
    builder.add_edge(START, "color")
    builder.add_edge(START, "size")
    builder.add_edge("color", END)
    builder.add_edge("size", END)
    return builder


async def agent(ctx: worker.Context) -> Any:
    return await run_graph(ctx, build(), input={}, hold_seconds=(ctx.input or {}).get("holdSeconds"))


if __name__ == "__main__":
    worker.main(agent)
