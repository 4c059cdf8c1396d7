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

Run it with TICKET_SERVICE_URL pointing at agentrun.examples.ticketservice. Its compensation Attempts (a
cancel or failure under spec.compensation, or spec.compensateRequest) look open creates up by key and
close the ticket of every confirmed one, once: `close` compensates, `find_by_key` looks up.
"""

from __future__ import annotations

from typing import Any

from agentrun import worker
from agentrun.examples import tickets
from agentrun.worker.identity import Identity, NotInAttemptPod

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
        try:
            return tickets.create(scope + key, title, plan["body"])
        except tickets.RateLimitedError as err:  # nothing was created: the ledger sends again, same key
            raise worker.RateLimited(str(err), retry_after=err.retry_after) from err
        except tickets.TicketServiceError as err:
            if err.status is None or err.status >= 500:  # unreachable or unavailable: nothing was created
                raise worker.TransientError(str(err)) from err
            raise

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


def service_key(key: str) -> str:
    """The ticket service's key for a ledger key: the ledger is the Run's, the service's keys are global,
    so a key not already scoped by the Run (spec.input.ticketKey) reaches the service prefixed with it."""
    try:
        me = Identity.from_env()
    except NotInAttemptPod:  # run in a host's process (the local node's instant mode): keys as given
        return key
    scope = f"{me.namespace}.{me.run}."
    return key if key.startswith(scope) else scope + key


def find_ticket(key: str) -> Any:
    """The settling lookup of a create whose outcome is open: the ticket under its key, or None."""
    return tickets.find_by_key(service_key(key))


def close_ticket(effect: worker.Effect) -> Any:
    """The compensation of create_ticket; its ledger key reaches the service with the close."""
    if not effect.reference:
        raise worker.PermanentError(f"no ticket id recorded for {effect.name}: nothing to close")
    try:
        return tickets.close(effect.reference, idempotency_key=service_key(effect.key) + ":close")
    except tickets.TicketServiceError as err:
        if err.status is None or err.status >= 500:  # unreachable or unavailable: nothing was closed
            raise worker.TransientError(str(err)) from err
        raise


def find_close(effect: worker.Effect) -> Any:
    """Whether the close took effect: the closed ticket, or None while it is open."""
    assert effect.reference
    return tickets.find_closed(effect.reference)


COMPENSATIONS = {
    "close_ticket": worker.Compensation(close_ticket, lookup=find_close, unknown_on=(tickets.OutcomeUnknown,))
}
LOOKUPS = {"create_ticket": find_ticket}


if __name__ == "__main__":
    worker.main(agent, compensations=COMPENSATIONS, lookups=LOOKUPS)
