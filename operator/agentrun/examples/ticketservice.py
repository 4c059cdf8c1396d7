"""A small HTTP ticket service: the external world of the ticket example, its tests and the demo.

    python -m agentrun.examples.ticketservice --port 8088 --state tickets.json
    (without --state the tickets live in memory: examples/tickets.yaml runs it so, in a Deployment)

POST /tickets (header Idempotency-Key, JSON {title, body}) creates a ticket (201); a repeat with the same key
and the same content returns the same ticket (200); the same key with other content is refused (422).
GET /tickets?idempotencyKey=K (200 or 404) · GET /tickets (all) · GET /tickets/{id}
POST /tickets/{id}/close (optional header Idempotency-Key: recorded with the close) closes a ticket; closing a
  closed ticket changes nothing and is recorded as "close-repeated", so a test counts every close that arrived
GET /audit: every creation, idempotent replay and close, in order (append-only) · GET /healthz

The tests, the chaos harness and the local demo run it with fault switches and the calls in flight on top
(hack/devcluster/ticket_faults.py, outside the installed package), through the Handler's hooks below.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

Json = dict[str, Any]


class KeyReused(Exception):
    """The idempotency key already names a ticket with other content."""


def _now() -> str:
    now = datetime.now(UTC)  # clock-exempt: a stand-in for an external system, with its own clock
    return now.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class TicketBook:
    """Tickets and the audit log, saved to one JSON file (atomically) after every change; with no file,
    kept in memory only (gone when the process ends)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        state: Json = json.loads(path.read_text()) if path is not None and path.exists() else {}
        self._next_id: int = state.get("nextId", 1)
        self._tickets: dict[str, Json] = {t["id"]: t for t in state.get("tickets", [])}
        self._by_key: dict[str, str] = {t["idempotencyKey"]: t["id"] for t in self._tickets.values()}
        self._audit: list[Json] = state.get("audit", [])

    def create(self, key: str, title: str, body: str) -> tuple[Json, bool]:
        """Returns (ticket, replayed)."""
        with self._lock:
            existing = self._tickets.get(self._by_key.get(key, ""))
            if existing is not None:
                if (existing["title"], existing["body"]) != (title, body):
                    raise KeyReused(
                        f"idempotency key {key!r} was used for {existing['id']} with other content"
                    )
                self._record("replayed", existing)
                return dict(existing), True
            ticket_id = f"T-{self._next_id}"
            self._next_id += 1
            ticket = {
                "id": ticket_id,
                "reference": ticket_id,
                "title": title,
                "body": body,
                "idempotencyKey": key,
                "status": "open",
                "createdAt": _now(),
            }
            self._tickets[ticket_id] = ticket
            self._by_key[key] = ticket_id
            self._record("created", ticket)
            return dict(ticket), False

    def close(self, ticket_id: str, key: str | None = None) -> Json | None:
        with self._lock:
            ticket = self._tickets.get(ticket_id)
            if ticket is None:
                return None
            if ticket["status"] != "closed":
                ticket.update(status="closed", closedAt=_now())
                self._record("closed", ticket, key)
            else:
                self._record("close-repeated", ticket, key)
            return dict(ticket)

    def get(self, ticket_id: str) -> Json | None:
        with self._lock:
            ticket = self._tickets.get(ticket_id)
            return dict(ticket) if ticket else None

    def find_by_key(self, key: str) -> Json | None:
        with self._lock:
            ticket = self._tickets.get(self._by_key.get(key, ""))
            return dict(ticket) if ticket else None

    def tickets(self) -> list[Json]:
        with self._lock:
            return [dict(t) for t in self._tickets.values()]

    def audit(self) -> list[Json]:
        with self._lock:
            return [dict(e) for e in self._audit]

    def _record(self, event: str, ticket: Json, close_key: str | None = None) -> None:
        self._audit.append(
            {
                "seq": len(self._audit) + 1,
                "event": event,
                "ticketId": ticket["id"],
                "idempotencyKey": ticket["idempotencyKey"],
                "title": ticket["title"],
                "at": _now(),
                **({"closeKey": close_key} if close_key else {}),
            }
        )
        self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        state = {"nextId": self._next_id, "tickets": list(self._tickets.values()), "audit": self._audit}
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(state, out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


class TicketServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], book: TicketBook, handler: type[Handler] | None = None
    ) -> None:
        super().__init__(address, handler or Handler)
        self.book = book


class Refused(Exception):
    def __init__(
        self, status: int, message: str, reason: str = "", headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason or HTTPStatus(status).phrase.replace(" ", "")
        self.headers = headers or {}


# (status, JSON payload), or None to close the connection without answering.
Reply = tuple[int, object] | None
Query = dict[str, list[str]]


def _found(ticket: Json | None) -> Reply:
    if ticket is None:
        raise Refused(HTTPStatus.NOT_FOUND, "no such ticket", reason="TicketNotFound")
    return HTTPStatus.OK, ticket


class Handler(BaseHTTPRequestHandler):
    """The routes. Its hooks do nothing here; a test's service overrides them to inject faults (the hooks
    that return False close the connection with no answer)."""

    server: TicketServer

    def do_GET(self) -> None:
        self._answer(self._get)

    def do_POST(self) -> None:
        self._answer(self._post)

    def do_DELETE(self) -> None:
        self._answer(self._delete)

    def _get(self, path: str, query: Query) -> Reply:
        book = self.server.book
        if path == "/healthz":
            return HTTPStatus.OK, {"ok": True}
        if path == "/audit":
            return HTTPStatus.OK, book.audit()
        if path == "/tickets" and "idempotencyKey" not in query:
            return HTTPStatus.OK, book.tickets()
        if path == "/tickets":
            self._check_lookups()
            return _found(book.find_by_key(query["idempotencyKey"][0]))
        if match := re.fullmatch(r"/tickets/([^/]+)", path):
            self._check_lookups()
            return _found(book.get(match[1]))
        raise Refused(HTTPStatus.NOT_FOUND, f"no route for GET {path}")

    def _post(self, path: str, query: Query) -> Reply:
        if path == "/tickets":
            return self._create()
        if match := re.fullmatch(r"/tickets/([^/]+)/close", path):
            return self._close(match[1])
        raise Refused(HTTPStatus.NOT_FOUND, f"no route for POST {path}")

    def _delete(self, path: str, query: Query) -> Reply:
        raise Refused(HTTPStatus.NOT_FOUND, f"no route for DELETE {path}")

    def _create(self) -> Reply:
        request = self._json_body()
        key = self.headers.get("Idempotency-Key")
        if not key:
            raise Refused(HTTPStatus.BAD_REQUEST, "the Idempotency-Key header is required")
        title, body = request.get("title"), request.get("body", "")
        if not isinstance(title, str) or not title or not isinstance(body, str):
            raise Refused(HTTPStatus.BAD_REQUEST, "expected {title: non-empty string, body: string}")
        if not self._before_create():
            return None  # lost before it was stored: nothing happened, and the caller cannot tell
        try:
            ticket, replayed = self.server.book.create(key, title, body)
        except KeyReused as err:
            raise Refused(HTTPStatus.UNPROCESSABLE_ENTITY, str(err), reason="IdempotencyKeyReused") from err
        if not self._after_create(ticket):
            return None  # stored, and the caller cannot tell whether it exists
        return (HTTPStatus.OK if replayed else HTTPStatus.CREATED), ticket

    def _close(self, ticket_id: str) -> Reply:
        reply = _found(self.server.book.close(ticket_id, self.headers.get("Idempotency-Key")))
        assert reply is not None
        self._after_close(reply[1])  # type: ignore[arg-type]
        return reply

    # ---- hooks: nothing here; the faults of a test's service (hack/devcluster/ticket_faults.py) ----------

    def _check_lookups(self) -> None:
        """Before a lookup by key or id: may refuse it."""

    def _before_create(self) -> bool:
        """A valid create, before its ticket is stored: may refuse it, or return False (no answer)."""
        return True

    def _after_create(self, ticket: Json) -> bool:
        """A ticket stored (or replayed), before the answer: may hold it, or return False (no answer)."""
        return True

    def _after_close(self, ticket: Json) -> None:
        """A close applied, before the answer (the caller cannot tell whether it took effect until then)."""

    def _json_body(self) -> Json:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            value = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise Refused(HTTPStatus.BAD_REQUEST, "expected a JSON object")
        return value

    def _answer(self, route: Callable[[str, Query], Reply]) -> None:
        url = urlsplit(self.path)
        headers: dict[str, str] = {}
        try:
            try:
                reply = route(url.path, parse_qs(url.query))
            except Refused as err:
                reply, headers = (err.status, {"error": str(err), "reason": err.reason}), err.headers
            if reply is None:
                self.close_connection = True
                return
            status, payload = reply
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the caller is gone (a killed worker): nobody to answer


def main(argv: list[str] | None = None, server: type[TicketServer] | None = None) -> None:
    """Serves tickets until killed; `server`: a TicketServer subclass (the tests' faults), else this one."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8088)
    parser.add_argument("--state", type=Path, help="JSON file of the tickets and audit log (default: memory)")
    args = parser.parse_args(argv)
    serving = (server or TicketServer)((args.host, args.port), TicketBook(args.state))
    print(f"ticket service listening on http://{args.host}:{serving.server_port}", flush=True)
    serving.serve_forever()


if __name__ == "__main__":
    main()
