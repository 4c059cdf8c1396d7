"""The ticket agent: plan, ask a person for the priority, open a ticket in an external service, commit.

    input:
      title: "Printer on fire"
      body: "Third floor"
      askPriority: true              # interrupt for typed input (default true)
      requireApproval: false         # a person approves the ticket before it is opened (auth_required)
      failAfterTicket: [1, 2]        # for tests and the demo: these Attempts fail (transient) after
                                     # the ticket exists, so the next ones must not open another
      askAfterTicket: false          # ask a person for a note once the ticket exists (the Run waits
                                     # InputRequired with the ticket open: a cancel then compensates it)
      planFromInput: false           # take title and body from the input on every Attempt (not the
                                     # checkpoint): a changed input is another request under the same key
      reversible: true               # false: an unknown outcome is never re-sent (IrreversibleUnknown)
      maxSends: 3                    # the ledger's bounds on sends of the create (same key)
      sendDeadlineSeconds: 300
      resend: Never                  # WithSameKey: re-send an unknown outcome without a lookup
      ticketKey: create-ticket       # the ledger's idempotency key (default <namespace>.<run>.create-ticket).
                                     # The ledger is the Run's, the ticket service's keys are global: a
                                     # key given here reaches the service prefixed with the Run

It reaches the example ticket service (examples/tickets.yaml) where tickets.service_url() says. Its
compensation Attempts (a cancel or failure under spec.compensation, or spec.compensateRequest) look open
creates up by key and close the ticket of every confirmed one, once (ticket_ledger.COMPENSATIONS).
"""

from __future__ import annotations

from typing import Any

from agentrun import worker
from agentrun.examples import ticket_ledger, tickets

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
    if spec.get("planFromInput"):
        state["plan"] = {"title": str(spec.get("title", "untitled")), "body": str(spec.get("body", ""))}
    elif "plan" not in state:
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

    def create(key: str) -> Any:
        return ticket_ledger.create(scope + key, title, plan["body"])

    def find(key: str) -> Any:
        found = tickets.find_by_key(scope + key)
        if found is not None and (found.get("title"), found.get("body")) != (title, plan["body"]):
            # A ticket under our key that we did not ask for: never take it for ours.
            raise worker.ConflictingResult(f"ticket {found.get('id')} under key {key} has other content")
        return found

    ticket = await ctx.side_effect(
        tool="create_ticket",
        key=key,
        target=tickets.service_url(),
        request={"title": title, "body": plan["body"]},
        execute=create,
        lookup=find,
        compensation="close_ticket",
        reversible=bool(spec.get("reversible", True)),
        step="create-ticket",
        unknown_on=(tickets.OutcomeUnknown,),
        requires_approval=bool(spec.get("requireApproval", False)),
        resend=str(spec.get("resend", "Never")),
        max_sends=int(spec.get("maxSends", 3)),
        send_deadline_seconds=int(spec.get("sendDeadlineSeconds", 300)),
    )
    if spec.get("askAfterTicket") and "note" not in state:
        answer = await ctx.interrupt(
            reason="input_required",
            prompt=f"Anything to add to ticket {ticket.reference}?",
            schema={"type": "object"},
            expires_in=3600,
        )
        state["note"] = answer
        await ctx.checkpoint(state, step="note")
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


def find_ticket(key: str) -> Any:
    """The settling lookup of a create whose outcome is open: the ticket under its key, or None."""
    return tickets.find_by_key(ticket_ledger.service_key(key))


LOOKUPS = {"create_ticket": find_ticket}


if __name__ == "__main__":
    worker.main(agent, compensations=ticket_ledger.COMPENSATIONS, lookups=LOOKUPS)
