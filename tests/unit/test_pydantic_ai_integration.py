"""agentrun.integrations.pydantic_ai without a cluster: the approval request's shape, the answers as
Pydantic AI takes them, ledger keys, and the capability passing through outside an Attempt."""

from __future__ import annotations

import asyncio

import jsonschema
import pytest
from pydantic_ai import Agent, ToolDenied
from pydantic_ai.models.function import FunctionModel

from agentrun.examples.pydantic_ai_agent import scripted_model
from agentrun.integrations.pydantic_ai import (
    APPROVAL,
    AgentrunDurability,
    approval_schema,
    ledger_key,
    tool_key,
)
from agentrun.integrations.pydantic_ai.runner import _results
from agentrun.worker.errors import PermanentError

ONE = [{"toolCallId": "c1", "tool": "create_ticket", "args": {"title": "x"}}]
TWO = [*ONE, {"toolCallId": "c2", "tool": "close_ticket", "args": {"id": "T-1"}}]


def test_one_call_is_asked_with_the_plain_approval_schema_and_several_keyed_by_call_id() -> None:
    assert approval_schema(ONE) == APPROVAL
    jsonschema.validate({"approved": False, "comment": "no"}, APPROVAL)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"approved": "yes"}, APPROVAL)
    several = approval_schema(TWO)
    jsonschema.validate({"c1": {"approved": True}, "c2": {"approved": False}}, several)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"c1": {"approved": True}}, several)  # every call is answered


def test_a_refusal_is_pydantic_ais_tool_denied_with_the_comment() -> None:
    assert _results(ONE, {"approved": True}).approvals == {"c1": True}
    assert _results(ONE, {"approved": False, "comment": "not now"}).approvals == {"c1": ToolDenied("not now")}
    both = _results(TWO, {"c1": {"approved": True}, "c2": {"approved": False}}).approvals
    assert both["c1"] is True
    assert isinstance(both["c2"], ToolDenied)


def test_ledger_keys_name_the_run_tool_and_call_and_stay_bounded() -> None:
    assert ledger_key("run", "create_ticket", "pyd_ai_1") == "run.create_ticket.pyd_ai_1"
    long = ledger_key("run", "t" * 100, "c" * 100)
    assert long.startswith("run.") and len(long) <= 120
    assert long != ledger_key("run", "t" * 100, "c" * 99 + "d")


def test_outside_an_attempt_the_agent_runs_as_plain_pydantic_ai() -> None:
    agent = Agent(FunctionModel(scripted_model), name="plain", capabilities=[AgentrunDurability()])
    calls: list[str] = []

    @agent.tool_plain
    def create_ticket(title: str) -> dict[str, str]:
        calls.append(title)
        return {"id": "T-9"}

    assert AgentrunDurability.from_agent(agent) is not None
    result = asyncio.run(agent.run("Printer on fire"))  # no Attempt: the capability passes through
    assert (result.output, calls) == ("Opened T-9.", ["Printer on fire"])


def test_tool_key_outside_a_tool_call_says_where_it_belongs() -> None:
    with pytest.raises(PermanentError, match="AgentrunDurability"):
        tool_key()
