"""The ticket service as every ticket example (ticket_agent, langgraph_agent, pydantic_ai_agent) puts it
in the side-effect ledger: how the client's errors are classed, and the compensation `close_ticket` that
each of them names, to register with `worker.main(agent, compensations=COMPENSATIONS, lookups=...)` so
that a cancel under spec.compensation or `kubectl agentrun compensate` can run it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from agentrun import worker
from agentrun.examples import tickets
from agentrun.worker import Identity, NotInAttemptPod


@contextlib.contextmanager
def classified() -> Iterator[None]:
    """Classes the ticket service's errors for the SDK. A 429 is RateLimited; an unreachable service (a
    name that does not resolve, a refused connection: nothing was sent) or a 5xx is transient, since
    nothing was created and the same key may go again once the service is back; any other answer (4xx)
    stands. A call sent without an answer is OutcomeUnknown, which the caller lists in unknown_on."""
    try:
        yield
    except tickets.RateLimitedError as err:
        raise worker.RateLimited(str(err), retry_after=err.retry_after) from err
    except tickets.TicketServiceError as err:
        if err.status is None or err.status >= 500:
            raise worker.TransientError(str(err)) from err
        raise


def create(key: str, title: str, body: str) -> dict[str, Any]:
    """tickets.create with its errors classed: the execute of a create_ticket side effect."""
    with classified():
        return tickets.create(key, title, body)


def find_by_key(key: str) -> dict[str, Any] | None:
    """tickets.find_by_key with its errors classed: the lookup of a create sent under this very key."""
    with classified():
        return tickets.find_by_key(key)


def service_key(key: str) -> str:
    """The ticket service's key for a ledger key: the ledger is the Run's, the service's keys are global,
    so a key not already scoped by the Run reaches the service prefixed with its namespace and name."""
    try:
        me = Identity.from_env()
    except NotInAttemptPod:  # run in a host's process (the local node's instant mode): keys as given
        return key
    scope = f"{me.namespace}.{me.run}."
    return key if key.startswith(scope) else scope + key


def close_ticket(effect: worker.Effect) -> Any:
    """The compensation of create_ticket; its ledger key reaches the service with the close."""
    if not effect.reference:
        raise worker.PermanentError(f"no ticket id recorded for {effect.name}: nothing to close")
    with classified():
        return tickets.close(effect.reference, idempotency_key=service_key(effect.key) + ":close")


def find_close(effect: worker.Effect) -> Any:
    """Whether the close took effect: the closed ticket, or None while it is open."""
    assert effect.reference
    return tickets.find_closed(effect.reference)


COMPENSATIONS = {
    "close_ticket": worker.Compensation(close_ticket, lookup=find_close, unknown_on=(tickets.OutcomeUnknown,))
}
