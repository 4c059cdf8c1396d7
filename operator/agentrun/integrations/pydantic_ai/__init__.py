"""Pydantic AI on agentrun (extra `agentrun-k8s[pydantic-ai]`): a durable-execution capability whose model
requests are journaled steps and whose tool calls go through the side-effect ledger, and run_agent,
which runs the agent as an agentrun agent (its message history in the Checkpoint, tool approvals as
interrupts).

    from agentrun import worker
    from agentrun.integrations.pydantic_ai import AgentrunDurability, run_agent

    agent = Agent(model, name="tickets", capabilities=[AgentrunDurability()])

    async def main(ctx: worker.Context) -> dict:
        return await run_agent(ctx, agent)   # the prompt: ctx.input["prompt"]

    worker.main(main)
"""

from agentrun.integrations.pydantic_ai.durability import AgentrunDurability, ledger_key, tool_key
from agentrun.integrations.pydantic_ai.runner import APPROVAL, approval_schema, run_agent

__all__ = ["APPROVAL", "AgentrunDurability", "approval_schema", "ledger_key", "run_agent", "tool_key"]
