"""A LangGraph ReAct-style research agent whose every tool call reads a 40 KB document, offline (a scripted
model). Its message list (`add_messages`, the ordinary way) outgrows what a Kubernetes object may hold
after a handful of calls; with the agent-state store configured its checkpoints go there and the Run's
objects keep references only (docs/state-store.md). `make demo` runs it, kills it mid-way, and shows it
finish with every document read once.

    input:
      documents: 12          # how many documents the model asks to read, one tool call each
      documentBytes: 40000   # the size of each
      holdAt: [1, 7]         # for the demo and tests: in Attempt 1, the read of document 7 waits forever
                             # once it has started (so the worker can be killed right there)

With AGENTRUN_TOOL_LOG set, every read appends "<attempt> start|end <document>" to that file. The result is
small: how many documents the final state holds, their bytes, and a digest of them in order.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Sequence
from typing import Annotated, Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from typing_extensions import TypedDict

from agentrun import worker
from agentrun.integrations.langgraph import run_graph


class Research(TypedDict, total=False):
    messages: Annotated[list[BaseMessage], add_messages]


def document(number: int, size: int) -> str:
    """Document `number`: the same text on every read, as a file or a web page would be."""
    return f"document {number}\n" + "abcdefghijklmnopqrstuvwxyz"[number % 26] * size


class ScriptedResearcher(FakeMessagesListChatModel):
    """A fake chat model that reads `documents` documents, one tool call at a time, then answers. Each call
    has its own id: a real model's ids are unique too."""

    documents: int = 12

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedResearcher:
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        read = sum(1 for message in messages if isinstance(message, ToolMessage))
        if read < self.documents:
            call = {"name": "read_document", "args": {"number": read}, "id": f"read-{read}"}
            reply = AIMessage(content="", tool_calls=[call])
        else:
            reply = AIMessage(content=f"Read {read} documents.")
        return ChatResult(generations=[ChatGeneration(message=reply)])


def _log(event: str, number: int) -> None:
    if path := os.environ.get("AGENTRUN_TOOL_LOG"):
        with open(path, "a") as log:
            log.write(f"{os.environ.get('AGENTRUN_ATTEMPT', '-')} {event} {number}\n")


def _attempt_number() -> int:
    return int(os.environ.get("AGENTRUN_ATTEMPT", "x-a0").rsplit("-a", 1)[1])


def build(documents: int, size: int, hold_at: Sequence[int] = ()) -> StateGraph[Research]:
    @tool
    async def read_document(number: int) -> str:
        """Reads one document of the corpus."""
        _log("start", number)
        if list(hold_at) == [_attempt_number(), number]:
            await asyncio.Event().wait()  # for the demo and tests: killed here, mid-read
        _log("end", number)
        return document(number, size)

    model = ScriptedResearcher(responses=[], documents=documents)

    async def agent(state: Research) -> dict[str, Any]:
        return {"messages": [await model.bind_tools([read_document]).ainvoke(state["messages"])]}

    builder = StateGraph(Research)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([read_document]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: END})
    builder.add_edge("tools", "agent")
    return builder


def summary(messages: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What the final state holds: the documents read, in order, their bytes and their digest."""
    read = [str(m.get("content", "")) for m in messages if m.get("type") == "tool"]
    return {
        "documents": len(read),
        "bytes": sum(len(text) for text in read),
        "sha256": hashlib.sha256("\n".join(read).encode()).hexdigest(),
    }


async def agent(ctx: worker.Context) -> dict[str, Any]:
    spec: dict[str, Any] = ctx.input or {}
    documents, size = int(spec.get("documents", 12)), int(spec.get("documentBytes", 40_000))
    graph = build(documents, size, spec.get("holdAt", ()))
    state = await run_graph(
        ctx,
        graph,
        input={"messages": [HumanMessage("Read the corpus and summarise it.")]},
        config={"recursion_limit": 4 * documents + 10},
    )
    return summary(state["messages"])


if __name__ == "__main__":
    worker.main(agent)
