"""The example ticket service as a real process on loopback, driven by the client the ticket agent uses."""

from __future__ import annotations

import http.client
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest

from agentrun.examples import tickets, ticketservice
from devcluster.processes import free_port
from devcluster.tickets import TicketServiceProcess

T = TypeVar("T")


@pytest.fixture
def service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TicketServiceProcess]:
    process = TicketServiceProcess(tmp_path / "tickets.json")
    process.start()
    monkeypatch.setenv("TICKET_SERVICE_URL", process.url)
    # The client's wait for an answer: an upper bound for a loaded machine (a held answer is waited for
    # while the test looks at the service); the timeout test sets its own, short one.
    monkeypatch.setenv("TICKET_SERVICE_TIMEOUT", "120")
    try:
        yield process
    finally:
        process.stop()


def key() -> str:
    return f"run-1/create_ticket/{uuid.uuid4().hex[:8]}"


def raw_post(service: TicketServiceProcess, path: str, payload: object, headers: dict[str, str]) -> Any:
    connection = http.client.HTTPConnection(urlsplit(service.url).netloc, timeout=10)
    try:
        connection.request("POST", path, json.dumps(payload), headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_create_returns_an_open_ticket_and_audits_it(service: TicketServiceProcess) -> None:
    k = key()
    ticket = tickets.create(k, "Printer on fire", "third floor")
    assert ticket["id"] == ticket["reference"] == "T-1"
    assert ticket | {"createdAt": None} == {
        "id": "T-1",
        "reference": "T-1",
        "title": "Printer on fire",
        "body": "third floor",
        "idempotencyKey": k,
        "status": "open",
        "createdAt": None,
    }
    audit = [(entry["event"], entry["ticketId"], entry["idempotencyKey"]) for entry in service.audit()]
    assert audit == [("created", "T-1", k)]


def test_replay_with_the_same_key_returns_the_same_ticket_without_creating_another(
    service: TicketServiceProcess,
) -> None:
    k = key()
    first = raw_post(service, "/tickets", {"title": "t", "body": "b"}, {"Idempotency-Key": k})
    second = raw_post(service, "/tickets", {"title": "t", "body": "b"}, {"Idempotency-Key": k})
    assert (first[0], second[0]) == (201, 200)
    assert first[1] == second[1] == tickets.create(k, "t", "b")
    assert [e["event"] for e in service.audit()] == ["created", "replayed", "replayed"]
    assert len(service.creations()) == len(service.tickets()) == 1


def test_concurrent_creates_with_one_key_make_one_ticket(service: TicketServiceProcess) -> None:
    k = key()
    results: list[dict[str, Any]] = []
    threads = [threading.Thread(target=lambda: results.append(tickets.create(k, "t", "b"))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {r["id"] for r in results} == {"T-1"}
    assert len(service.creations()) == 1


def test_key_reused_with_other_content_is_refused(service: TicketServiceProcess) -> None:
    k = key()
    tickets.create(k, "t", "b")
    with pytest.raises(tickets.TicketServiceError) as refused:
        tickets.create(k, "t", "another body")
    assert refused.value.status == 422
    assert len(service.tickets()) == 1


def test_create_without_idempotency_key_or_title_is_a_bad_request(service: TicketServiceProcess) -> None:
    assert raw_post(service, "/tickets", {"title": "t", "body": "b"}, {})[0] == 400
    assert raw_post(service, "/tickets", {"body": "b"}, {"Idempotency-Key": key()})[0] == 400
    assert service.tickets() == []


def test_lookup_by_key_finds_the_ticket_or_says_absent(service: TicketServiceProcess) -> None:
    k = key()
    created = tickets.create(k, "t", "b")
    assert tickets.find_by_key(k) == created
    assert tickets.find_by_key("never-used/key with spaces&symbols") is None
    assert tickets.get("T-1") == created
    with pytest.raises(tickets.TicketNotFound):
        tickets.get("T-99")


def test_close_is_audited_once(service: TicketServiceProcess) -> None:
    ticket = tickets.create(key(), "t", "b")
    assert tickets.close(ticket["id"])["status"] == "closed"
    assert tickets.close(ticket["id"])["status"] == "closed"
    assert [e["event"] for e in service.audit()] == ["created", "closed", "close-repeated"]


def test_failing_lookups_make_find_by_key_raise(service: TicketServiceProcess) -> None:
    k = key()
    tickets.create(k, "t", "b")
    service.set_faults(failLookups=True)
    with pytest.raises(tickets.TicketServiceError) as failed:
        tickets.find_by_key(k)
    assert failed.value.status == 503
    service.clear_faults()
    assert tickets.find_by_key(k) is not None


def test_a_dropped_create_response_is_an_unknown_outcome_though_the_ticket_exists(
    service: TicketServiceProcess,
) -> None:
    k = key()
    service.set_faults(dropCreateResponse=True)
    with pytest.raises(tickets.OutcomeUnknown):
        tickets.create(k, "t", "b")
    found = tickets.find_by_key(k)
    assert found is not None and found["id"] == "T-1"
    assert len(service.creations()) == 1


def test_a_create_timeout_is_an_unknown_outcome(
    service: TicketServiceProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    k = key()
    service.set_faults(holdCreates=True)  # no answer until the hold is lifted, however slow the machine
    monkeypatch.setenv("TICKET_SERVICE_TIMEOUT", "0.3")
    with pytest.raises(tickets.OutcomeUnknown):
        tickets.create(k, "t", "b")
    wait_until(service.in_flight)  # the service got to the create (stored, answer held) after it timed out
    assert tickets.find_by_key(k) is not None
    service.clear_faults()


def test_a_create_dropped_before_it_is_stored_is_an_unknown_outcome_and_nothing_exists(
    service: TicketServiceProcess,
) -> None:
    k = key()
    service.set_faults(dropCreateRequests=1)
    with pytest.raises(tickets.OutcomeUnknown):
        tickets.create(k, "t", "b")
    assert tickets.find_by_key(k) is None, "dropped before it was stored"
    assert service.creations() == []
    assert service.set_faults() == {"dropCreateRequests": 0}, "counted down"
    assert tickets.create(k, "t", "b")["id"] == "T-1", "the next create with the same key goes through"
    assert len(service.creations()) == 1


def test_rate_limited_creates_answer_429_with_retry_after_and_store_nothing(
    service: TicketServiceProcess,
) -> None:
    k = key()
    service.set_faults(rateLimitCreates=2, rateLimitRetryAfter=1.5)
    for _ in range(2):
        with pytest.raises(tickets.RateLimitedError) as err:
            tickets.create(k, "t", "b")
        assert (err.value.status, err.value.retry_after) == (429, 1.5)
    assert service.creations() == []
    assert tickets.create(k, "t", "b")["id"] == "T-1"


def test_a_ticket_under_the_key_with_other_content_is_found_by_lookup(service: TicketServiceProcess) -> None:
    """Someone else's ticket under our key: a lookup finds it, with content that is not ours."""
    k = key()
    tickets.create(k, "someone else's", "other")
    service.set_faults(dropCreateRequests=1)
    with pytest.raises(tickets.OutcomeUnknown):
        tickets.create(k, "ours", "b")
    found = tickets.find_by_key(k)
    assert found is not None and found["title"] == "someone else's"


def test_a_held_create_is_listed_in_flight_until_the_hold_is_lifted(service: TicketServiceProcess) -> None:
    k = key()
    service.set_faults(holdCreates=True)
    answers: list[dict[str, Any]] = []
    caller = threading.Thread(target=lambda: answers.append(tickets.create(k, "t", "b")))
    caller.start()
    [held] = wait_until(service.in_flight)
    assert (held["idempotencyKey"], held["ticketId"]) == (k, "T-1")
    assert len(service.creations()) == 1, "stored before the answer is held"
    assert answers == [], "no answer while held"
    service.set_faults(holdCreates=False)
    caller.join()
    assert [a["id"] for a in answers] == ["T-1"]
    assert service.in_flight() == []


def test_a_held_close_is_applied_listed_in_flight_and_a_second_close_is_recorded(
    service: TicketServiceProcess,
) -> None:
    ticket = tickets.create(key(), "t", "b")
    service.set_faults(holdCloses=True)
    answers: list[dict[str, Any]] = []
    caller = threading.Thread(target=lambda: answers.append(tickets.close(ticket["id"], "undo-1")))
    caller.start()
    [held] = wait_until(service.in_flight)
    assert (held["op"], held["ticketId"]) == ("close", ticket["id"])
    assert tickets.find_closed(ticket["id"]) is not None, "applied before the answer is held"
    assert answers == [], "no answer while held"
    service.set_faults(holdCloses=False)
    caller.join()
    assert [a["status"] for a in answers] == ["closed"]
    tickets.close(ticket["id"])
    assert [(c["event"], c.get("closeKey")) for c in service.closes()] == [
        ("closed", "undo-1"),
        ("close-repeated", None),
    ]


def test_an_open_ticket_is_not_found_closed(service: TicketServiceProcess) -> None:
    ticket = tickets.create(key(), "t", "b")
    assert tickets.find_closed(ticket["id"]) is None
    with pytest.raises(tickets.TicketNotFound):
        tickets.find_closed("T-404")


def test_a_held_answer_to_a_caller_that_is_gone_harms_nothing(service: TicketServiceProcess) -> None:
    service.set_faults(holdCreates=True)
    connection = http.client.HTTPConnection(urlsplit(service.url).netloc, timeout=10)
    connection.request(
        "POST", "/tickets", json.dumps({"title": "t", "body": "b"}), {"Idempotency-Key": key()}
    )
    wait_until(service.in_flight)
    connection.close()  # the caller dies before the answer
    service.clear_faults()
    wait_until(lambda: service.in_flight() == [])
    assert service.alive() and len(service.tickets()) == 1
    assert tickets.create(key(), "next", "b")["id"] == "T-2"


def wait_until(probe: Callable[[], T], timeout: float = 60.0) -> T:
    """Polls the service until probe is truthy (bounded generously, so a broken service fails instead of
    hanging and a loaded machine does not)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := probe():
            return value
        time.sleep(0.01)
    raise AssertionError(f"{probe!r} never became true in {timeout}s")


def test_an_error_answer_to_create_is_a_plain_error(service: TicketServiceProcess) -> None:
    service.set_faults(failCreates=503)
    with pytest.raises(tickets.TicketServiceError) as failed:
        tickets.create(key(), "t", "b")
    assert failed.value.status == 503
    assert not isinstance(failed.value, tickets.OutcomeUnknown)
    assert service.tickets() == []


def test_an_unreachable_service_is_a_plain_error_for_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TICKET_SERVICE_URL", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(tickets.TicketServiceError) as unreachable:
        tickets.find_by_key("k")
    assert unreachable.value.status is None
    with pytest.raises(tickets.TicketServiceError):
        tickets.create("k", "t", "b")  # nothing was sent, so the outcome is known


def test_a_404_from_a_wrong_url_is_not_taken_for_absent(
    service: TicketServiceProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TICKET_SERVICE_URL", f"{service.url}/not-the-ticket-service")
    with pytest.raises(tickets.TicketServiceError) as wrong:
        tickets.find_by_key(key())
    assert wrong.value.status == 404 and not isinstance(wrong.value, tickets.TicketNotFound)


def test_faults_are_validated_and_cleared(service: TicketServiceProcess) -> None:
    assert service.set_faults(failLookups=True) == {"failLookups": True}
    assert service.set_faults(delayCreateSeconds=0.1) == {"failLookups": True, "delayCreateSeconds": 0.1}
    bad_values: list[dict[str, object]] = [
        {"failCreates": True},
        {"failCreates": 200},
        {"explode": True},
        {"failLookups": "yes"},
        {"holdCreates": 1},
        {"dropCreateRequests": True},
        {"rateLimitCreates": -1},
        {"rateLimitRetryAfter": "soon"},
    ]
    for bad in bad_values:
        assert raw_post(service, "/faults", bad, {})[0] == 400
    service.clear_faults()
    assert service.set_faults() == {}


def test_state_survives_a_restart(service: TicketServiceProcess) -> None:
    k = key()
    closed = tickets.close(tickets.create(k, "t", "b")["id"])
    audit = service.audit()
    service.restart()
    assert tickets.find_by_key(k) == closed and closed["status"] == "closed"
    assert service.audit() == audit
    assert tickets.create(key(), "next", "b")["id"] == "T-2"
    assert tickets.create(k, "t", "b")["id"] == "T-1"


def test_the_installed_service_has_no_fault_switches() -> None:
    """agentrun.examples.ticketservice, what the agent images ship and examples/tickets.yaml runs, serves
    tickets; the fault switches and the calls in flight are the test service's (devcluster.ticket_faults)."""
    server = ticketservice.TicketServer(("127.0.0.1", 0), ticketservice.TicketBook(None))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def call(method: str, path: str, payload: object = None, headers: dict[str, str] | None = None) -> Any:
        connection = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=10)
        try:
            connection.request(method, path, None if payload is None else json.dumps(payload), headers or {})
            response = connection.getresponse()
            return response.status, json.loads(response.read())
        finally:
            connection.close()

    try:
        status, ticket = call("POST", "/tickets", {"title": "t", "body": "b"}, {"Idempotency-Key": "k-1"})
        assert (status, ticket["id"], ticket["status"]) == (201, "T-1", "open")
        assert call("GET", "/tickets?idempotencyKey=k-1") == (200, ticket)
        for method, path in (
            ("GET", "/faults"),
            ("POST", "/faults"),
            ("DELETE", "/faults"),
            ("GET", "/inflight"),
        ):
            assert call(method, path, {} if method == "POST" else None)[0] == 404, (method, path)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
