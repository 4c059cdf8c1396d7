"""The example ticket service as a real process on loopback: the world outside, for the tests and the demo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from .processes import free_port, spawn, stop_group


class TicketServiceProcess:
    """Runs the example ticket service with its fault switches (devcluster.ticket_faults) on a fixed loopback
    port, so a restart (which keeps the state file) is invisible to workers holding the URL."""

    def __init__(self, state_path: Path, log_path: Path | None = None, port: int | None = None) -> None:
        self.state_path = state_path
        self.log_path = log_path or state_path.with_suffix(".log")
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        """What an agent needs to reach the service (agentrun.examples.tickets reads it)."""
        return {"TICKET_SERVICE_URL": self.url}

    def start(self, timeout: float = 60.0) -> None:
        argv = [sys.executable, "-m", "devcluster.ticket_faults"]
        argv += ["--port", str(self.port), "--state", str(self.state_path)]
        paths = [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH")]  # devcluster's
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}
        self.process = spawn(argv, self.log_path, env=env, tie_to_parent=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"ticket service exited during start-up:\n{self.log_tail()}")
            try:
                self._request("GET", "/healthz", timeout=1)
                return
            except (OSError, urllib.error.URLError):
                time.sleep(0.05)
        raise AssertionError(f"ticket service not healthy in {timeout}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.process:
            stop_group(self.process.pid, grace_seconds=5)
            self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def audit(self) -> list[dict[str, Any]]:
        """Every creation, idempotent replay ("replayed") and close, in order: {seq, event, ticketId,
        idempotencyKey, title, at}."""
        entries: list[dict[str, Any]] = self._request("GET", "/audit")
        return entries

    def creations(self) -> list[dict[str, Any]]:
        return [entry for entry in self.audit() if entry["event"] == "created"]

    def closes(self) -> list[dict[str, Any]]:
        """Every close that arrived: "closed" (it closed the ticket) or "close-repeated" (it was closed)."""
        return [entry for entry in self.audit() if entry["event"] in ("closed", "close-repeated")]

    def tickets(self) -> list[dict[str, Any]]:
        tickets: list[dict[str, Any]] = self._request("GET", "/tickets")
        return tickets

    def in_flight(self) -> list[dict[str, Any]]:
        """The creates and closes the service has received and applied but not answered yet: {seq, op
        (create or close), idempotencyKey (the ticket's), ticketId, receivedAt}. With holdCreates (holdCloses)
        set, a create (close) stays here until the hold is lifted."""
        entries: list[dict[str, Any]] = self._request("GET", "/inflight")
        return entries

    def set_faults(self, **faults: Any) -> dict[str, Any]:
        """Merges fault settings: failLookups, failCreates, delayCreateSeconds, holdCreates, holdCloses,
        dropCreateResponse, dropCreateRequests, rateLimitCreates, rateLimitRetryAfter."""
        current: dict[str, Any] = self._request("POST", "/faults", faults)
        return current

    def create(self, key: str, title: str, body: str = "") -> dict[str, Any]:
        """Creates a ticket under `key` as someone else would (not through the ledger)."""
        request = urllib.request.Request(
            self.url + "/tickets", data=json.dumps({"title": title, "body": body}).encode(), method="POST"
        )
        request.add_header("Content-Type", "application/json")
        request.add_header("Idempotency-Key", key)
        with urllib.request.urlopen(request, timeout=10) as response:
            ticket: dict[str, Any] = json.load(response)
            return ticket

    def clear_faults(self) -> None:
        self._request("DELETE", "/faults")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no ticket service log)"

    def _request(self, method: str, path: str, payload: object = None, timeout: float = 10) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.load(response)

    def __enter__(self) -> TicketServiceProcess:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
