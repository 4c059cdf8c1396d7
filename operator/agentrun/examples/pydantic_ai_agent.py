"""A Pydantic AI ticket agent, durable on agentrun, offline (a FunctionModel plays the model).

    the model asks for create_ticket -> (a person approves, when requireApproval) -> the tool opens the
    ticket through the side-effect ledger -> the model says which ticket it opened

    input:
      title: "Printer on fire"
      body: "Third floor"
      requireApproval: false   # create_ticket requires approval: an agentrun interrupt (auth_required)
      holdInTool: [1]          # for tests: in these Attempts the tool waits forever before it opens the
                               # ticket (the model's response is journaled: the worker can be killed there)

It reaches the example ticket service (examples/tickets.yaml) where tickets.service_url() says. With
AGENTRUN_MODEL_LOG set, every call of the model appends "<attempt> <what it answered>" to that file (the
tests count them).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from pydantic_ai import Agent, DeferredToolRequests, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from agentrun import worker
from agentrun.examples import ticket_ledger, tickets
from agentrun.integrations.pydantic_ai import AgentrunDurability, run_agent, tool_key


def _attempt_number() -> int:
    return int(os.environ.get("AGENTRUN_ATTEMPT", "x-a0").rsplit("-a", 1)[1])


def _log(what: str) -> None:
    if path := os.environ.get("AGENTRUN_MODEL_LOG"):
        with open(path, "a") as log:
            log.write(f"{_attempt_number()} {what}\n")


def scripted_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Asks for create_ticket with the user's words, then says what the tool answered. It gives no tool
    call id, so Pydantic AI makes a random one: only the journal makes it the same after a crash."""
    last = messages[-1]
    returned = (
        [p for p in last.parts if isinstance(p, ToolReturnPart)] if isinstance(last, ModelRequest) else []
    )
    if returned:
        content: Any = returned[-1].content
        text = f"Opened {content['id']}." if isinstance(content, dict) else f"No ticket: {content}"
        _log("answer")
        return ModelResponse(parts=[TextPart(text)])
    prompt = next(
        p.content
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if p.part_kind == "user-prompt"
    )
    _log("tool-call")
    return ModelResponse(parts=[ToolCallPart("create_ticket", {"title": str(prompt)})])


def build(*, require_approval: bool = False, hold_in: list[int] | None = None) -> Agent[None, Any]:
    agent: Agent[None, Any] = Agent(
        FunctionModel(scripted_model),
        name="ticket-agent",
        output_type=[str, DeferredToolRequests],
        capabilities=[AgentrunDurability()],
    )
    ledger = {
        "lookup": ticket_ledger.find_by_key,
        "compensation": "close_ticket",
        "reversible": True,
        "unknown_on": (tickets.OutcomeUnknown,),
    }

    @agent.tool(requires_approval=require_approval, metadata={"agentrun": ledger})
    async def create_ticket(ctx: RunContext[None], title: str) -> dict[str, Any]:
        """Opens a ticket in the ticket service."""
        if _attempt_number() in (hold_in or []):
            await asyncio.Event().wait()  # for tests: killed here, the model's response journaled
        ticket: dict[str, Any] = await asyncio.to_thread(
            ticket_ledger.create, tool_key(), title, os.environ.get("AGENTRUN_TICKET_BODY", "")
        )
        return ticket

    return agent


async def agent(ctx: worker.Context) -> dict[str, Any]:
    spec: dict[str, Any] = ctx.input or {}
    os.environ["AGENTRUN_TICKET_BODY"] = str(spec.get("body", ""))
    built = build(require_approval=bool(spec.get("requireApproval")), hold_in=spec.get("holdInTool", []))
    return await run_agent(ctx, built, str(spec.get("title", "untitled")))


# What a compensation Attempt runs: the close of an opened ticket, and the lookup of a create whose outcome
# is open (its ledger key is the key the ticket service got: tool_key()).
LOOKUPS = {"create_ticket": ticket_ledger.find_by_key}


if __name__ == "__main__":
    worker.main(agent, compensations=ticket_ledger.COMPENSATIONS, lookups=LOOKUPS)
