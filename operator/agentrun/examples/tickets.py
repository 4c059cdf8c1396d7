"""Client of the example ticket service (agentrun.examples.ticketservice), in the shape the side-effect
ledger wants: `create` executes, `find_by_key` looks up, `close` compensates.

Where the service is: $TICKET_SERVICE_URL when set; else, in a Pod of a namespace with the Service
`tickets` (examples/tickets.yaml), the address Kubernetes gives in TICKETS_SERVICE_HOST and
TICKETS_SERVICE_PORT; else http://tickets:8088, the Service's name (for a Pod created before the Service).
Each call waits at most $TICKET_SERVICE_TIMEOUT seconds (default 10).
"""

from __future__ import annotations

import http.client
import json
import os
from typing import Any
from urllib.parse import quote, urlsplit

Json = dict[str, Any]


class TicketServiceError(Exception):
    """The service answered with an error (status set), or could not be reached or gave no answer (status
    None). For a create this always means no ticket was made: an unanswered create is OutcomeUnknown."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class RateLimitedError(TicketServiceError):
    """The service answered 429: nothing was created; try again after retry_after seconds."""

    def __init__(self, message: str, retry_after: float | None) -> None:
        super().__init__(message, 429)
        self.retry_after = retry_after


class TicketNotFound(TicketServiceError):
    """The service answered that no such ticket exists."""


class OutcomeUnknown(Exception):
    """A create was sent but no answer came back (timeout, dropped connection): the ticket may exist.
    Never retry it blindly; look it up by its idempotency key."""


def create(idempotency_key: str, title: str, body: str) -> Json:
    """Creates a ticket, or returns the one this key already created. Raises OutcomeUnknown when the
    request may have taken effect without an answer, TicketServiceError when it surely did not."""
    return _call(
        "POST",
        "/tickets",
        {"title": title, "body": body},
        idempotency_key=idempotency_key,
        no_answer=OutcomeUnknown,
    )


def find_by_key(idempotency_key: str) -> Json | None:
    """The ticket created with this key, or None when there is none. Raises when the service cannot tell."""
    try:
        return _call("GET", f"/tickets?idempotencyKey={quote(idempotency_key, safe='')}")
    except TicketNotFound:
        return None


def get(ticket_id: str) -> Json:
    return _call("GET", f"/tickets/{quote(ticket_id, safe='')}")


def close(ticket_id: str, idempotency_key: str | None = None) -> Json:
    """Closes a ticket (the compensation of create); closing a closed ticket changes nothing. Raises
    OutcomeUnknown when the close was sent but no answer came (it may have taken effect)."""
    return _call(
        "POST",
        f"/tickets/{quote(ticket_id, safe='')}/close",
        idempotency_key=idempotency_key,
        no_answer=OutcomeUnknown,
    )


def find_closed(ticket_id: str) -> Json | None:
    """The ticket if it is closed, None if it is open; raises when the service cannot tell (or the
    ticket does not exist: then nothing can be closed)."""
    ticket = get(ticket_id)
    return ticket if ticket.get("status") == "closed" else None


SERVICE_NAME = "tickets"  # the Service of examples/tickets.yaml
SERVICE_PORT = 8088


def service_url() -> str:
    if url := os.environ.get("TICKET_SERVICE_URL"):
        return url.rstrip("/")
    # the variables the kubelet sets for each Service of the Pod's namespace that existed before the Pod
    host = os.environ.get(f"{SERVICE_NAME.upper()}_SERVICE_HOST")
    port = os.environ.get(f"{SERVICE_NAME.upper()}_SERVICE_PORT", str(SERVICE_PORT))
    if host:
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    return f"http://{SERVICE_NAME}:{SERVICE_PORT}"


def _call(
    method: str,
    path: str,
    payload: Json | None = None,
    *,
    idempotency_key: str | None = None,
    no_answer: type[Exception] = TicketServiceError,
) -> Json:
    """One request on a fresh connection. `no_answer` is raised when the request was sent but no answer
    came: for a create that means the outcome is unknown, for the other calls it is a plain failure."""
    url = urlsplit(service_url())
    where = f"{method} {path}"
    timeout = float(os.environ.get("TICKET_SERVICE_TIMEOUT", "10"))
    connection_class = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    connection = connection_class(url.netloc, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if idempotency_key is not None:
        headers["Idempotency-Key"] = idempotency_key
    try:
        try:
            connection.connect()
        except OSError as err:  # nothing was sent
            raise TicketServiceError(f"{where}: ticket service unreachable: {err}") from err
        try:
            connection.request(method, url.path + path, json.dumps(payload or {}), headers)
            response = connection.getresponse()
            status, data = response.status, response.read()
            retry_after = response.getheader("Retry-After")
        except (OSError, http.client.HTTPException) as err:
            raise no_answer(f"{where}: sent, but no answer ({type(err).__name__}: {err})") from err
    finally:
        connection.close()
    if status >= 400:
        message = f"{where}: HTTP {status}: {data.decode(errors='replace')}"
        if status == 429:
            raise RateLimitedError(message, _seconds(retry_after))
        # Only the service's own "no such ticket" means absent; any other 404 (a wrong URL) cannot tell.
        absent = status == 404 and _reason(data) == "TicketNotFound"
        raise (TicketNotFound if absent else TicketServiceError)(message, status)
    result: Json = json.loads(data)
    return result


def _seconds(value: str | None) -> float | None:
    try:
        return max(float(value), 0.0) if value is not None else None
    except ValueError:
        return None  # an HTTP date: the caller's backoff decides


def _reason(data: bytes) -> object:
    try:
        return json.loads(data).get("reason")
    except (ValueError, AttributeError):
        return None
