"""The example ticket service (agentrun.examples.ticketservice) with fault switches and the calls in flight:
what the tests, the chaos harness and the local demo drive. Test-only, so outside the installed package.

    PYTHONPATH=hack python -m devcluster.ticket_faults --port 8088 --state tickets.json

On top of the service's routes:
GET /inflight: the creates and closes received and applied but not answered yet, oldest first ({seq, op
  (create or close), idempotencyKey, ticketId, receivedAt}): a test that must act while a call is in flight
  waits for its entry here
POST /faults JSON merges fault settings, DELETE /faults clears them (kept in memory only):
  failLookups: true          lookups by key or id answer 503
  failCreates: 503           creates answer this status and create nothing
  delayCreateSeconds: 2      a create is stored, then the answer waits this long
  holdCreates: true          a create is stored, then the answer waits until this is false or cleared
  holdCloses: true           a close is applied, then the answer waits until this is false or cleared
  dropCreateResponse: true   a create is stored, then the connection closes with no answer
  dropCreateRequests: 1      the next N creates close the connection with no answer BEFORE the ticket is
                             stored: the caller cannot tell that nothing happened
  rateLimitCreates: 1        the next N creates answer 429 (Retry-After: rateLimitRetryAfter, default 0)
                             and store nothing
  (a create answered after the client's timeout: holdCreates or delayCreateSeconds with a short client
  timeout; a ticket under a key with other content: POST /tickets with that key first, as someone else)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from agentrun.examples import ticketservice
from agentrun.examples.ticketservice import (
    Handler,
    Json,
    Query,
    Refused,
    Reply,
    TicketBook,
    TicketServer,
    _now,
)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)  # bool is an int in Python


# Fault name -> whether a value is acceptable.
FAULTS: dict[str, Callable[[Any], bool]] = {
    "failLookups": lambda value: isinstance(value, bool),
    "dropCreateResponse": lambda value: isinstance(value, bool),
    "holdCreates": lambda value: isinstance(value, bool),
    "holdCloses": lambda value: isinstance(value, bool),
    "failCreates": lambda value: type(value) is int and 400 <= value <= 599,
    "delayCreateSeconds": lambda value: _is_number(value) and value >= 0,
    "dropCreateRequests": lambda value: type(value) is int and value >= 0,
    "rateLimitCreates": lambda value: type(value) is int and value >= 0,
    "rateLimitRetryAfter": lambda value: _is_number(value) and value >= 0,
}
COUNTED = ("dropCreateRequests", "rateLimitCreates")  # faults that act on that many creates, then stop


class FaultyTicketServer(TicketServer):
    def __init__(self, address: tuple[str, int], book: TicketBook) -> None:
        super().__init__(address, book, FaultyHandler)
        self.faults: Json = {}
        # Guards faults and inflight; notified when the faults change (a held create may go on).
        self.changed = threading.Condition()
        self.inflight: dict[int, Json] = {}
        self._received = 0

    def set_faults(self, faults: Json) -> Json:
        with self.changed:
            self.faults = faults
            self.changed.notify_all()
            return dict(faults)

    def take(self, fault: str) -> bool:
        """Whether a counted fault acts on this create (and counts it down)."""
        with self.changed:
            left = self.faults.get(fault, 0)
            if not left:
                return False
            self.faults = {**self.faults, fault: left - 1}
            self.changed.notify_all()
            return True

    def hold_answer(self, fault: str = "holdCreates") -> None:
        """Waits while the hold fault (holdCreates, holdCloses) is set."""
        with self.changed:
            self.changed.wait_for(lambda: not self.faults.get(fault))

    def received(self, ticket: Json, op: str = "create") -> int:
        with self.changed:
            self._received += 1
            self.inflight[self._received] = {
                "seq": self._received,
                "op": op,
                "idempotencyKey": ticket["idempotencyKey"],
                "ticketId": ticket["id"],
                "receivedAt": _now(),
            }
            return self._received

    def answered(self, seq: int) -> None:
        with self.changed:
            self.inflight.pop(seq, None)

    def in_flight(self) -> list[Json]:
        with self.changed:
            return [dict(entry) for _, entry in sorted(self.inflight.items())]


def _check_faults(request: Json) -> None:
    for name, value in request.items():
        if name not in FAULTS or not FAULTS[name](value):
            raise Refused(HTTPStatus.BAD_REQUEST, f"unknown fault or bad value: {name}={value!r}")


class FaultyHandler(Handler):
    server: FaultyTicketServer
    _inflight: int | None = None  # this request's entry in server.inflight (a create being answered)
    _faults: Json | None = None  # the faults as the create being handled found them

    def _get(self, path: str, query: Query) -> Reply:
        if path == "/faults":
            return HTTPStatus.OK, self.server.faults
        if path == "/inflight":
            return HTTPStatus.OK, self.server.in_flight()
        return super()._get(path, query)

    def _post(self, path: str, query: Query) -> Reply:
        if path == "/faults":
            request = self._json_body()
            _check_faults(request)
            return HTTPStatus.OK, self.server.set_faults({**self.server.faults, **request})
        return super()._post(path, query)

    def _delete(self, path: str, query: Query) -> Reply:
        if path == "/faults":
            return HTTPStatus.OK, self.server.set_faults({})
        return super()._delete(path, query)

    def _create(self) -> Reply:
        self._faults = self.server.faults
        return super()._create()

    def _before_create(self) -> bool:
        faults = self._faults or {}
        if faults.get("failCreates"):
            raise Refused(faults["failCreates"], "creates fail (injected fault)", reason="InjectedFault")
        if self.server.take("rateLimitCreates"):
            retry_after = {"Retry-After": str(faults.get("rateLimitRetryAfter", 0))}
            raise Refused(
                HTTPStatus.TOO_MANY_REQUESTS, "slow down (injected fault)", "RateLimited", retry_after
            )
        return not self.server.take("dropCreateRequests")

    def _after_create(self, ticket: Json) -> bool:
        # These faults act after the ticket is stored: the caller cannot tell whether it exists.
        self._inflight = self.server.received(ticket)
        time.sleep((self._faults or {}).get("delayCreateSeconds", 0))
        self.server.hold_answer()
        return not self.server.faults.get("dropCreateResponse")

    def _after_close(self, ticket: Json) -> None:
        # Applied: the caller cannot tell whether it took effect until the answer comes.
        self._inflight = self.server.received(ticket, op="close")
        self.server.hold_answer("holdCloses")

    def _check_lookups(self) -> None:
        if self.server.faults.get("failLookups"):
            raise Refused(HTTPStatus.SERVICE_UNAVAILABLE, "lookups fail (injected fault)", "InjectedFault")

    def _answer(self, route: Callable[[str, Query], Reply]) -> None:
        self._inflight = None
        try:
            super()._answer(route)
        finally:
            if self._inflight is not None:
                self.server.answered(self._inflight)


def main(argv: list[str] | None = None) -> None:
    ticketservice.main(argv, FaultyTicketServer)


if __name__ == "__main__":
    main()
