"""A LangGraph ReAct-style ticket agent, durable on agentrun, offline (a scripted fake chat model).

    triage (asks a person for the priority: a LangGraph interrupt) -> agent (the model) -> tools
    (create_ticket, through the side-effect ledger) -> agent (the model answers) -> end

    input:
      title: "Printer on fire"
      body: "Third floor"
      holdAfterTicket: [2]   # for tests and the demo: in these Attempts the tool waits forever once
                             # its ticket is confirmed (so the worker can be killed right there)

It reaches the example ticket service (examples/tickets.yaml) where tickets.service_url() says. With
AGENTRUN_NODE_LOG set, every node appends "<attempt> start|end <node>" to that file (the tests count the
runs of each node).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Annotated, Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import interrupt
from typing_extensions import TypedDict

from agentrun import worker
from agentrun.examples import ticket_ledger, tickets
from agentrun.integrations.langgraph import run_graph, side_effect

PRIORITY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"priority": {"enum": ["low", "normal", "high"]}},
    "required": ["priority"],
    "additionalProperties": False,
}


class TicketState(TypedDict, total=False):
    title: str
    body: str
    priority: str
    messages: Annotated[list[BaseMessage], add_messages]


def _log(event: str, node: str) -> None:
    if path := os.environ.get("AGENTRUN_NODE_LOG"):
        with open(path, "a") as log:
            log.write(f"{os.environ.get('AGENTRUN_ATTEMPT', '-')} {event} {node}\n")


class ScriptedTicketModel(FakeMessagesListChatModel):
    """A fake chat model that can "call tools": it asks for create_ticket, then, once the tool has
    answered, says which ticket it opened. (langchain_core's fake models have no bind_tools.) Like
    fake models do, it repeats its tool call id: the ledger key also carries the LangGraph task id."""

    responses: list[BaseMessage] = []  # noqa: RUF012 (a pydantic field)

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedTicketModel:
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        last = messages[-1]
        if isinstance(last, ToolMessage):
            reply = AIMessage(content=f"Opened {last.content}.")
        else:
            args = {"title": str(last.content)}
            reply = AIMessage(
                content="", tool_calls=[{"name": "create_ticket", "args": args, "id": "call-1"}]
            )
        return ChatResult(generations=[ChatGeneration(message=reply)])


def build(hold_in: Sequence[int] = ()) -> StateGraph[TicketState]:
    @tool
    async def create_ticket(title: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
        """Opens a ticket in the ticket service."""
        body = os.environ.get("AGENTRUN_TICKET_BODY", "")
        effect = await side_effect(
            "create_ticket",
            lambda key: ticket_ledger.create(key, title, body),
            call_id=tool_call_id,
            target=tickets.service_url(),
            lookup=ticket_ledger.find_by_key,
            compensation="close_ticket",
            reversible=True,
            unknown_on=(tickets.OutcomeUnknown,),
        )
        if int(os.environ.get("AGENTRUN_ATTEMPT", "x-a0").rsplit("-a", 1)[1]) in hold_in:
            await asyncio.Event().wait()  # for tests and the demo: killed here, the ticket confirmed
        return str(effect.reference)

    model = ScriptedTicketModel(responses=[])
    tool_node = ToolNode([create_ticket])

    def triage(state: TicketState) -> dict[str, Any]:
        _log("start", "triage")
        answer = interrupt(
            f"Which priority for the ticket {state['title']!r}?", response_schema=PRIORITY_SCHEMA
        )
        _log("end", "triage")
        return {
            "priority": answer["priority"],
            "messages": [HumanMessage(f"[{answer['priority']}] {state['title']}")],
        }

    async def agent(state: TicketState) -> dict[str, Any]:
        _log("start", "agent")
        reply = await model.bind_tools([create_ticket]).ainvoke(state["messages"])
        _log("end", "agent")
        return {"messages": [reply]}

    async def tools(state: TicketState) -> dict[str, Any]:
        _log("start", "tools")
        update: dict[str, Any] = await tool_node.ainvoke(state)
        _log("end", "tools")
        return update

    builder = StateGraph(TicketState)
    builder.add_node("triage", triage)
    builder.add_node("agent", agent)
    builder.add_node("tools", tools)
    builder.add_edge(START, "triage")
    builder.add_edge("triage", "agent")
    builder.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: END})
    builder.add_edge("tools", "agent")
    return builder


async def agent(ctx: worker.Context) -> dict[str, Any]:
    spec: dict[str, Any] = ctx.input or {}
    os.environ["AGENTRUN_TICKET_BODY"] = str(spec.get("body", ""))
    graph = build(hold_in=spec.get("holdAfterTicket", []))
    state: dict[str, Any] = await run_graph(
        ctx, graph, input={"title": str(spec.get("title", "untitled")), "body": str(spec.get("body", ""))}
    )
    return state


# What a compensation Attempt runs: the close of an opened ticket, and the lookup of a create whose outcome
# is open (its ledger key is the key the ticket service got).
LOOKUPS = {"create_ticket": ticket_ledger.find_by_key}


if __name__ == "__main__":
    worker.main(agent, compensations=ticket_ledger.COMPENSATIONS, lookups=LOOKUPS)
