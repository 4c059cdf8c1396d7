"""AgentrunDurability: a Pydantic AI durable-execution capability whose engine is the agentrun Attempt.

Built on `pydantic_ai.durable_exec` (the API its Temporal, DBOS and Prefect integrations use): the
base capability routes every model request and tool call of the agent through one backend, and ours
maps them onto the SDK:
- a model request is a journaled step (`ctx.step(..., journal=True)`): an Attempt that continues after
  a crash, a lease loss or a retry gets the recorded response back instead of paying for the call again
  (and the same tool call ids with it, which the ledger keys depend on); its usage is reported with
  ctx.add_usage when the model really answered;
- a tool call goes through the side-effect ledger (`ctx.side_effect`) with a key derived from the Run
  and the tool call id: a tool that ran to its end is never run again, whatever happens after;
- anything else (argument validation, discovery, events) runs in place: it has no external effect.
Payloads are JSON (`JSON_CODEC`): a journal entry and a ledger result are JSON, and they are read back
through pydantic's closed message types, never by naming a class.
"""

from __future__ import annotations

import contextvars
import hashlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Literal

from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    CallableOperationBackend,
    DurabilityEngineSpec,
    DurableOperationBackend,
    DurableOperationId,
    JournalOperationNamer,
    ModelRequestId,
    RoleBasedOperationConfig,
    ToolsetCallToolId,
)
from pydantic_ai.tools import AgentDepsT, RunContext

from agentrun.worker import Context, PermanentError

CURRENT: contextvars.ContextVar[Context] = contextvars.ContextVar("agentrun_pydantic_ai_context")
_TOOL_KEY: contextvars.ContextVar[str] = contextvars.ContextVar("agentrun_pydantic_ai_tool_key")
METADATA_KEY: Final = "agentrun"
MODEL_STEP: Final = "pydantic-ai:model"
# Pydantic AI's wire kinds of a tool call that returned (anything else is control flow: a retry asked of
# the model, an approval or deferral, a validation error; none of them is an action that happened).
_RETURNED: Final = frozenset({"tool_return", "tool_content_result"})

ToolConfig = dict[str, Any]


def tool_key() -> str:
    """The ledger's idempotency key of the tool call running now (pass it on to the external service)."""
    try:
        return _TOOL_KEY.get()
    except LookupError:
        raise PermanentError("tool_key() is called from a tool that AgentrunDurability runs") from None


def ledger_key(run: str, tool: str, tool_call_id: str) -> str:
    """The Run's key for one tool call. The model's tool call id is stable across Attempts because the
    response that carries it is journaled (Pydantic AI makes random ids when a model gives none)."""
    key = f"{run}.{tool}.{tool_call_id}"
    if len(key) > 120:  # keys are identifiers of bounded length
        digest = hashlib.sha256("\0".join((tool, tool_call_id)).encode()).hexdigest()[:40]
        key = f"{run}.{digest}"
    return key


def _reference(value: Any) -> str | None:
    if isinstance(value, dict):
        for field in ("reference", "id"):
            if isinstance(value.get(field), str | int):
                return str(value[field])
    return None


class _NotPerformed(Exception):
    """The tool ended in control flow (ModelRetry, ApprovalRequired, ...): carried out of the ledger,
    which records it Failed, so the same call id is never taken for a finished action."""

    def __init__(self, payload: Any) -> None:
        super().__init__(
            f"the tool call ended with {payload.get('kind') if isinstance(payload, dict) else '?'}"
        )
        self.payload = payload


def _usage(ctx: Context, payload: Any) -> None:
    usage = payload.get("usage") if isinstance(payload, dict) else None
    if isinstance(usage, dict):
        cost = usage.get("cost")
        ctx.add_usage(
            input_tokens=int(usage.get("input_tokens") or 0),
            output_tokens=int(usage.get("output_tokens") or 0),
            cost_usd=float(cost) if isinstance(cost, int | float) else 0.0,
            model_calls=1,
        )
    else:
        ctx.add_usage(model_calls=1)


class AgentrunBackend(CallableOperationBackend[ToolConfig]):
    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: ToolConfig,
    ) -> object:
        ctx = CURRENT.get()
        if isinstance(operation_id, ModelRequestId):

            async def request() -> object:
                payload = await body()
                _usage(ctx, payload)  # only when the model answered: a replayed response cost nothing now
                return payload

            return await ctx.step(MODEL_STEP, request, journal=True)
        if isinstance(operation_id, ToolsetCallToolId) and config.get("ledger", True):
            return await _tool_call(ctx, body, cache_key, config)
        return await body()


async def _tool_call(
    ctx: Context, body: Callable[[], Awaitable[object]], cache_key: tuple[object, ...], config: ToolConfig
) -> object:
    tool = str(cache_key[0])
    run_context = next((c for c in cache_key if isinstance(c, RunContext)), None)
    if run_context is None or not run_context.tool_call_id:
        raise PermanentError(f"tool {tool!r} was called without a tool call id: no ledger key")
    # A tool that raised ApprovalRequired itself is called again with the same id once approved: its
    # first call is recorded Failed (not performed), so the approved one is another ledger line.
    call = run_context.tool_call_id + (".approved" if run_context.tool_call_approved else "")
    key = ledger_key(ctx.run_name, tool, call)

    async def send(key: str) -> object:
        token = _TOOL_KEY.set(key)
        try:
            payload = await body()
        finally:
            _TOOL_KEY.reset(token)
        if not (isinstance(payload, dict) and payload.get("kind") in _RETURNED):
            raise _NotPerformed(payload)
        return payload

    lookup: Callable[[str], Any] | None = config.get("lookup")

    async def look_up(key: str) -> object:
        found = lookup(key) if lookup else None
        if isinstance(found, Awaitable):
            found = await found
        # what the ledger records is the tool's payload: a found action reads back as the tool's return
        return None if found is None else {"result": found, "kind": "tool_return"}

    reference_of: Callable[[Any], str | None] = config.get("reference_of") or _reference
    try:
        effect = await ctx.side_effect(
            tool=tool,
            key=key,
            execute=send,
            target=config.get("target"),
            lookup=look_up if lookup else None,
            compensation=config.get("compensation"),
            reversible=bool(config.get("reversible", False)),
            step=f"pydantic-ai:{tool}",
            reference_of=lambda payload: reference_of(payload.get("result")),
            unknown_on=tuple(config.get("unknown_on", ())),
        )
    except _NotPerformed as control:
        return control.payload
    return effect.result


class AgentrunDurability(BaseDurabilityCapability[AgentDepsT]):
    """Makes a Pydantic AI agent durable on agentrun; give it to the Agent and run it with run_agent:

        agent = Agent(model, name="tickets", output_type=[str, DeferredToolRequests],
                      capabilities=[AgentrunDurability()])

    Per tool, metadata under "agentrun" configures the ledger: {"lookup": fn(key) -> result or None,
    "target": "...", "compensation": "...", "reversible": True, "unknown_on": (Exc,),
    "reference_of": fn(result)}, or {"ledger": False} for a tool without external effects (run again
    after a crash).
    """

    engine_spec = DurabilityEngineSpec(
        engine_name="agentrun",
        durable_unit_noun="step",
        durable_container_noun="Attempt",
        codec=JSON_CODEC,  # journal entries and ledger results are JSON
        wrapped_toolset_kinds=frozenset({"function"}),
        toolset_lifecycles={"function": "enter-always"},
        unsupported_runtime_toolset_kinds=frozenset({"function"}),
        # journal keys count calls per step name: tools one at a time keep the order of model calls fixed
        sequential_tools_in_durable_context=True,
        tool_config_key=METADATA_KEY,
    )

    def __init__(self, *, models: Mapping[str, Any] | None = None, name: str | None = None) -> None:
        super().__init__(models=models, name=name)

    @property
    def in_durable_context(self) -> bool:
        return CURRENT.get(None) is not None

    def get_durable_operation_backend(self) -> DurableOperationBackend[ToolConfig]:
        def tool_config(
            operation_id: DurableOperationId, tool: object | None, tool_name: str
        ) -> ToolConfig | Literal[False]:
            resolved = self._build_resolve_tool_config({})(tool, tool_name)  # type: ignore[arg-type]
            return False if resolved is False else dict(resolved or {})

        return AgentrunBackend(
            namer=JournalOperationNamer(self.name, default_model_id=self.default_model_id or "default"),
            config=RoleBasedOperationConfig(
                model={}, event={}, capability={}, tool={}, resolve_tool=tool_config
            ),
        )
