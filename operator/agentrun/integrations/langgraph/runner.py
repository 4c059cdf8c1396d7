"""run_graph: a LangGraph graph as an agentrun agent, and side_effect for its tools.

The thread is the Run (thread id = the Run's name), checkpointed by AgentrunSaver with durability
"sync": each superstep's checkpoint is saved (and the Run's latestCheckpoint moved, fenced) before the
next one starts, so after a crash the next Attempt continues from the last finished superstep and the
nodes that finished before it never run again. What the graph gets as input:
- the first Attempt (nothing checkpointed yet): ctx.input;
- an Attempt that brings the answer to the graph's interrupts: Command(resume={interrupt id: value});
- any other continuing Attempt (a retry, a lease takeover, after a pause): None, i.e. "continue".
"""

from __future__ import annotations

import contextvars
import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

from langchain_core.runnables import RunnableConfig
from langgraph.config import get_config
from langgraph.graph import StateGraph
from langgraph.pregel import Pregel
from langgraph.types import Command, Interrupt, StateSnapshot
from pydantic_core import to_jsonable_python

from agentrun.api import InterruptReason
from agentrun.api.budgets import ACCEPTED_SCHEMA_BUDGET
from agentrun.integrations.langgraph.saver import AgentrunSaver, PauseRequested
from agentrun.integrations.langgraph.serde import TypeKey
from agentrun.worker import (
    SCHEMA_ADVICE,
    Context,
    Effect,
    Interrupted,
    PermanentError,
    refuse_over_budget,
)

_CURRENT: contextvars.ContextVar[Context] = contextvars.ContextVar("agentrun_langgraph_context")
PROMPT_LIMIT: Final = 4096
_UNSET: Any = object()


def combined_schema(interrupts: Sequence[Interrupt]) -> dict[str, Any] | None:
    """The accepted schema of one agentrun request for the graph's pending interrupts: the interrupt's
    own response schema when there is one; for several, an object keyed by interrupt id."""
    if len(interrupts) == 1:
        schema = interrupts[0].response_schema
        return dict(schema) if isinstance(schema, dict) else None
    return {
        "type": "object",
        "properties": {
            i.id: dict(i.response_schema) if isinstance(i.response_schema, dict) else {} for i in interrupts
        },
        "required": [i.id for i in interrupts],
        "additionalProperties": False,
    }


def _prompt(interrupts: Sequence[Interrupt]) -> str:
    if len(interrupts) == 1 and isinstance(interrupts[0].value, str):
        text = interrupts[0].value
    else:
        values = {i.id: i.value for i in interrupts} if len(interrupts) > 1 else interrupts[0].value
        text = json.dumps(to_jsonable_python(values, fallback=str), sort_keys=True)
    return text if len(text) <= PROMPT_LIMIT else text[: PROMPT_LIMIT - 1] + "…"


def _resume(interrupts: Sequence[Interrupt], value: Any) -> Command[Any]:
    """The answer as LangGraph takes it: by interrupt id, always (a single answer that is a dict
    could otherwise be taken for a map of ids)."""
    if len(interrupts) == 1:
        return Command(resume={interrupts[0].id: value})
    if not isinstance(value, dict):
        raise PermanentError("the answer to several interrupts is an object keyed by interrupt id")
    return Command(resume={i.id: value[i.id] for i in interrupts if i.id in value})


def _with_saver(graph: StateGraph[Any] | Pregel[Any, Any], saver: AgentrunSaver) -> Pregel[Any, Any]:
    if isinstance(graph, StateGraph):
        return graph.compile(checkpointer=saver)
    return graph.copy(update={"checkpointer": saver})


async def _ask(
    saver: AgentrunSaver,
    reason: InterruptReason,
    *,
    request_id: str,
    prompt: str | None,
    schema: dict[str, Any] | None,
    expires_in: float | None,
    hold: tuple[Context, float] | None = None,
) -> Any:
    """Writes the Run's input request for the checkpoint the graph stopped at, then ends the Attempt; or,
    with `hold` (the Context and its hold_seconds), returns the answer accepted within the hold."""
    if saver.latest is None:
        raise PermanentError("the graph stopped before its first checkpoint: nothing to continue from")
    pending: dict[str, Any] = {"requestId": request_id, "reason": reason.value, "checkpointId": saver.latest}
    if prompt:
        pending["prompt"] = prompt
    if schema is not None:
        refuse_over_budget("the interrupt's response schema", schema, ACCEPTED_SCHEMA_BUDGET, SCHEMA_ADVICE)
        pending["acceptedSchema"] = schema
    if expires_in:
        pending["expiresInSeconds"] = max(1, int(expires_in + 0.999))
    if hold is not None:
        pending["holdSeconds"] = max(1, int(hold[1] + 0.999))
        pending["heldBy"] = hold[0].attempt
    session = saver.session
    assert session is not None
    await session.fenced_status_write({"pendingRequest": pending}, f"input request {request_id}")
    if hold is None:
        raise Interrupted(request_id)
    return await hold[0].held_answer(request_id, hold[1])


async def run_graph(
    ctx: Context,
    graph: StateGraph[Any] | Pregel[Any, Any],
    *,
    input: Any = _UNSET,
    config: RunnableConfig | None = None,
    allowed_types: Iterable[TypeKey | type] = (),
    expires_in: float | None = None,
    hold_seconds: float | None = None,
) -> Any:
    """Runs `graph` (a StateGraph or a compiled graph) as this Attempt of the Run and returns its final
    state as JSON (the Run's committed result, when the agent returns it).

    A LangGraph interrupt() becomes an agentrun interrupt (reason input_required; its response_schema
    the accepted schema, several pending interrupts one request keyed by interrupt id; `expires_in`
    seconds to answer; with `hold_seconds`, this Attempt holds the request that long and an answer accepted
    in time resumes the graph in this same Attempt); spec.pause is honoured after each superstep's
    checkpoint. `input` replaces
    ctx.input as the first Attempt's graph input; `allowed_types` are classes a checkpoint may contain
    beyond the graph's own state types and LangGraph's safe ones.
    """
    saver = AgentrunSaver.for_attempt(ctx, allowed_types=allowed_types)
    session = saver.session
    assert session is not None
    answering = await session.answered_request()
    if answering is not None:
        saver.ignore_pause(answering)  # the pause (or question) this Attempt continues after
    compiled = _with_saver(graph, saver)
    run_config: RunnableConfig = {**(config or {})}
    run_config["configurable"] = {**run_config.get("configurable", {}), "thread_id": ctx.run_name}
    token = _CURRENT.set(ctx)
    try:
        start: StateSnapshot = await compiled.aget_state(run_config)
        if not start.config.get("configurable", {}).get("checkpoint_id"):
            graph_input = ctx.input if input is _UNSET else input
        elif ctx.resumed and start.interrupts:
            graph_input = _resume(start.interrupts, ctx.resume_value)
        else:
            graph_input = None
        while True:
            try:
                await compiled.ainvoke(graph_input, run_config, durability="sync")
            except PauseRequested as pause:
                await _ask(
                    saver,
                    InterruptReason.PAUSED,
                    request_id=pause.request_id,
                    prompt=pause.reason,
                    schema=None,
                    expires_in=None,
                )
            end: StateSnapshot = await compiled.aget_state(run_config)
            if not end.interrupts:
                break
            asked = "\0".join([str(saver.latest), *sorted(i.id for i in end.interrupts)])
            request_id = f"{ctx.run_name}-lg-{hashlib.sha256(asked.encode()).hexdigest()[:12]}"
            answer = await _ask(
                saver,
                InterruptReason.INPUT_REQUIRED,
                request_id=request_id,
                prompt=_prompt(end.interrupts),
                schema=combined_schema(end.interrupts),
                expires_in=expires_in,
                hold=(ctx, hold_seconds) if hold_seconds else None,
            )
            graph_input = _resume(end.interrupts, answer)  # answered within the hold: go on here
    finally:
        _CURRENT.reset(token)
    # Without nulls: the commit is a JSON merge patch, in which a null deletes a key, so the stored
    # result would otherwise differ from the one returned.
    return to_jsonable_python(end.values, fallback=str, exclude_none=True)


def current_task_id() -> str:
    """The id of the LangGraph task running now: the same when a task runs again from the same
    checkpoint (after a crash), another for every other task."""
    configurable = get_config().get("configurable") or {}
    task_id = configurable.get("__pregel_task_id")
    if not task_id:
        # the task's own namespace segment ("node:<task id>"), in graphs that do not expose it
        task_id = str(configurable.get("checkpoint_ns", "")).split("|")[-1].rpartition(":")[2]
    if not task_id:
        raise PermanentError("side_effect is called from a node or tool of a graph that run_graph runs")
    return str(task_id)


async def side_effect(
    tool: str,
    execute: Callable[[str], Any],
    *,
    call_id: str,
    target: str | None = None,
    lookup: Callable[[str], Any] | None = None,
    compensation: str | None = None,
    reversible: bool = False,
    reference_of: Callable[[Any], str | None] | None = None,
    unknown_on: tuple[type[BaseException], ...] = (),
    requires_approval: bool = False,
) -> Effect:
    """ctx.side_effect for a node or tool of a graph that run_graph runs: the idempotency key is
    derived from the Run, the LangGraph task id and `call_id` (a tool call's id), so a task that runs
    again after a crash finds its record (and never sends twice), while the same call id in another
    task (fake and real models repeat them) is another action."""
    try:
        ctx = _CURRENT.get()
    except LookupError:
        raise PermanentError("side_effect is called inside a graph that run_graph runs") from None
    task_id = current_task_id()
    key = f"{ctx.run_name}.{task_id}.{call_id}"
    if len(key) > 120:  # keys are identifiers of bounded length
        digest = hashlib.sha256("\0".join((task_id, call_id)).encode()).hexdigest()[:40]
        key = f"{ctx.run_name}.{digest}"
    return await ctx.side_effect(
        tool=tool,
        key=key,
        execute=execute,
        target=target,
        lookup=lookup,
        compensation=compensation,
        reversible=reversible,
        step=f"langgraph:{tool}",
        reference_of=reference_of,
        unknown_on=unknown_on,
        requires_approval=requires_approval,
    )
