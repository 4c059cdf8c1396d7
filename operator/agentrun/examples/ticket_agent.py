"""The ticket agent: plan, ask a person for the priority, open a ticket in an external service, commit.

    input:
      title: "Printer on fire"
      body: "Third floor"
      askPriority: true              # interrupt for typed input (default true)
      requireApproval: false         # a person approves the ticket before it is opened (auth_required)
      failAfterTicket: [1, 2]        # for tests and the demo: these Attempts fail (transient) after
                                     # the ticket exists, so the next ones must not open another
      ticketKey: create-ticket       # the ledger's idempotency key (default <namespace>.<run>.create-ticket).
                                     # The ledger is the Run's, the ticket service's keys are global: a
                                     # key given here reaches the service prefixed with the Run

Run it with TICKET_SERVICE_URL pointing at agentrun.examples.ticketservice.
"""

from __future__ import annotations

from typing import Any

from agentrun import worker
from agentrun.examples import tickets

PRIORITY_SCHEMA = {
    "type": "object",
    "properties": {"priority": {"enum": ["low", "normal", "high"]}},
    "required": ["priority"],
    "additionalProperties": False,
}


def ticket_key(namespace: str, run: str) -> str:
    """The idempotency key of a Run's ticket (one ticket per Run)."""
    return f"{namespace}.{run}.create-ticket"


async def agent(ctx: worker.Context) -> dict[str, Any]:
    spec: dict[str, Any] = ctx.input or {}
    state: dict[str, Any] = dict(ctx.state or {})
    if "plan" not in state:
        state["plan"] = {"title": str(spec.get("title", "untitled")), "body": str(spec.get("body", ""))}
        await ctx.checkpoint(state, step="plan")
    if spec.get("askPriority", True) and "priority" not in state:
        answer = await ctx.interrupt(
            reason="input_required",
            prompt=f"Which priority for the ticket {state['plan']['title']!r}? (low, normal or high)",
            schema=PRIORITY_SCHEMA,
            expires_in=3600,
        )
        state["priority"] = answer["priority"]
        await ctx.checkpoint(state, step="priority")
    plan = state["plan"]
    key = ticket_key(ctx.namespace, ctx.run_name)
    if ctx.resumed:
        # After any resume (an answer, a crash, a retry) what was seen before may be stale: look at the
        # ticket service again instead of trusting the state (someone may have opened the ticket by hand).
        try:
            state["seen"] = tickets.find_by_key(key)
        except Exception:  # the service cannot tell now: the ledger's own lookup decides below
            state["seen"] = None
    title = f"[{state.get('priority', 'normal')}] {plan['title']}"
    key = str(spec.get("ticketKey") or ticket_key(ctx.namespace, ctx.run_name))
    scope = f"{ctx.namespace}.{ctx.run_name}." if spec.get("ticketKey") else ""
    ticket = await ctx.side_effect(
        tool="create_ticket",
        key=key,
        target=tickets.service_url(),
        execute=lambda key: tickets.create(scope + key, title, plan["body"]),
        lookup=lambda key: tickets.find_by_key(scope + key),
        compensation="close_ticket",
        reversible=True,
        step="create-ticket",
        unknown_on=(tickets.OutcomeUnknown,),
        requires_approval=bool(spec.get("requireApproval", False)),
    )
    if ctx.attempt_number in spec.get("failAfterTicket", []):
        raise worker.TransientError(
            f"flaky step after ticket {ticket.reference} (attempt {ctx.attempt_number})"
        )
    return {
        "ticket": ticket.reference,
        "priority": state.get("priority"),
        "executedNow": ticket.executed_now,
        "reobserved": ctx.resumed,
        "ticketSeenOnResume": state.get("seen") is not None,
    }


if __name__ == "__main__":
    worker.main(agent)
