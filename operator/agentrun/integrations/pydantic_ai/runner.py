"""run_agent: a Pydantic AI agent as an agentrun agent.

The agent's message history is the Run's state (a Checkpoint, JSON, read back through Pydantic AI's
closed message types: a Checkpoint cannot name a class to build). What the agent gets:
- the first Attempt: the prompt (ctx.input's "prompt", or `prompt=`);
- an Attempt that brings the answer to its tool approvals: the stored history and DeferredToolResults;
- an Attempt that continues after a crash or a retry: the prompt again, from the start; its model
  requests are replayed from the journal and its finished tool calls from the ledger, so neither the
  model nor a tool is called twice for the same thing.
Deferred tool approvals (`requires_approval` tools, DeferredToolRequests) become one agentrun interrupt
with reason auth_required; {"approved": false} denies the call: the tool never runs and the model is
told so (Pydantic AI's ToolDenied), as if a person had refused it in the agent's own loop.
"""

from __future__ import annotations

import json
from typing import Any, Final

from pydantic import TypeAdapter
from pydantic_ai import DeferredToolRequests, DeferredToolResults, ToolDenied
from pydantic_ai.agent import AbstractAgent
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ToolCallPart
from pydantic_core import to_jsonable_python

from agentrun.api import InterruptReason
from agentrun.integrations.pydantic_ai.durability import CURRENT, AgentrunDurability
from agentrun.worker import Context, PermanentError

_DENIED: Final = "The tool call was denied."
PROMPT_LIMIT: Final = 4096
_UNSET: Any = object()

APPROVAL: dict[str, Any] = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}, "comment": {"type": "string", "maxLength": 1024}},
    "required": ["approved"],
    "additionalProperties": False,
}


def approval_schema(calls: list[dict[str, Any]]) -> dict[str, Any]:
    """One approval for one call; for several, an object keyed by tool call id."""
    if len(calls) == 1:
        return APPROVAL
    ids = [c["toolCallId"] for c in calls]
    return {
        "type": "object",
        "properties": dict.fromkeys(ids, APPROVAL),
        "required": ids,
        "additionalProperties": False,
    }


def _prompt(calls: list[dict[str, Any]]) -> str:
    lines = [
        f"Approve {c['tool']} {json.dumps(c['args'], sort_keys=True)} (tool call {c['toolCallId']})?"
        for c in calls
    ]
    text = (
        "\n".join(lines)
        + '\nAnswer {"approved": true} or false'
        + (", keyed by tool call id." if len(calls) > 1 else ".")
    )
    return text if len(text) <= PROMPT_LIMIT else text[: PROMPT_LIMIT - 1] + "…"


def _decision(answer: dict[str, Any]) -> bool | ToolDenied:
    if answer.get("approved") is True:
        return True
    return ToolDenied(str(answer.get("comment") or _DENIED))


def _results(calls: list[dict[str, Any]], answer: Any) -> DeferredToolResults:
    if len(calls) == 1:
        return DeferredToolResults(approvals={calls[0]["toolCallId"]: _decision(answer)})
    return DeferredToolResults(approvals={c["toolCallId"]: _decision(answer[c["toolCallId"]]) for c in calls})


def _pending(requests: DeferredToolRequests) -> list[dict[str, Any]]:
    if requests.calls:
        names = ", ".join(sorted({c.tool_name for c in requests.calls}))
        raise PermanentError(f"tools deferred for external execution are not supported on agentrun: {names}")
    return [{"toolCallId": c.tool_call_id, "tool": c.tool_name, "args": _args(c)} for c in requests.approvals]


def _args(call: ToolCallPart) -> Any:
    args = call.args_as_dict() if call.args else {}
    return to_jsonable_python(args, fallback=str)


def _dump(messages: list[ModelMessage]) -> Any:
    return ModelMessagesTypeAdapter.dump_python(messages, mode="json", exclude_none=True)


def _load(data: Any) -> list[ModelMessage]:
    return ModelMessagesTypeAdapter.validate_python(data)


async def run_agent(
    ctx: Context,
    agent: AbstractAgent[Any, Any],
    prompt: Any = _UNSET,
    *,
    deps: Any = None,
    output_adapter: TypeAdapter[Any] | None = None,
) -> dict[str, Any]:
    """Runs `agent` (built with AgentrunDurability among its capabilities, and DeferredToolRequests in
    its output types when a tool requires approval) as this Attempt of the Run; returns
    {"output": its output as JSON}: the Run's committed result, when the agent returns it."""
    if AgentrunDurability.from_agent(agent) is None:
        raise PermanentError("run_agent runs an agent built with capabilities=[AgentrunDurability()]")
    state: dict[str, Any] = dict(ctx.state or {})
    if "output" in state:  # finished, the commit was lost: the output is in the last checkpoint
        return {"output": state["output"]}
    if prompt is _UNSET:
        prompt = (ctx.input or {}).get("prompt") if isinstance(ctx.input, dict) else ctx.input
    history: list[ModelMessage] | None = None
    results: DeferredToolResults | None = None
    if (calls := state.get("approvals")) and "answer" not in state:
        # Asked before: this returns the answer in the Attempt that brings it, and asks again otherwise.
        answer = await ctx.interrupt(
            reason=InterruptReason.AUTH_REQUIRED, prompt=_prompt(calls), schema=approval_schema(calls)
        )
        # Kept in the state at once: an Attempt after a crash does not bring the answer again.
        state = {**state, "answer": answer}
        await ctx.checkpoint(state, step="pydantic-ai:answered")
    if calls and "answer" in state:
        history, results, prompt = _load(state["messages"]), _results(calls, state["answer"]), None
    elif "messages" in state:
        history, prompt = _load(state["messages"]), None
    token = CURRENT.set(ctx)
    try:
        result = await agent.run(prompt, message_history=history, deferred_tool_results=results, deps=deps)
    finally:
        CURRENT.reset(token)
    messages = _dump(result.all_messages())
    if isinstance(result.output, DeferredToolRequests):
        calls = _pending(result.output)
        await ctx.interrupt(
            reason=InterruptReason.AUTH_REQUIRED,
            prompt=_prompt(calls),
            schema=approval_schema(calls),
            state={"messages": messages, "approvals": calls},
        )
        raise AssertionError("unreachable: an interrupt without a hold ends the Attempt")
    adapter = output_adapter or TypeAdapter(Any)
    output = adapter.dump_python(result.output, mode="json", exclude_none=True)
    await ctx.checkpoint({"messages": messages, "output": output}, step="pydantic-ai:done")
    return {"output": output}
