"""How a worker's way out is classified in its termination message (and so whether the Run retries)."""

from __future__ import annotations

import pytest
import urllib3

from agentrun.api import FailureClass
from agentrun.kubeapi import ApiError
from agentrun.worker.errors import PermanentError, TransientError
from agentrun.worker.main import EX_TEMPFAIL, _termination


def refused_connection() -> urllib3.exceptions.MaxRetryError:
    # Constructing a connection or a pool opens nothing: they only carry the address into the errors.
    connection = urllib3.connection.HTTPConnection("localhost")
    cause = urllib3.exceptions.NewConnectionError(connection, "[Errno 111] Connection refused")
    pool = urllib3.HTTPConnectionPool("localhost")
    return urllib3.exceptions.MaxRetryError(pool, "/apis/agentrun.dev/v1alpha1/namespaces/ns/runs/r", cause)


@pytest.mark.parametrize(
    "error",
    [
        refused_connection(),
        urllib3.exceptions.ProtocolError("Connection aborted."),
        ApiError(503, "", "etcd"),
    ],
    ids=["connection refused", "connection dropped", "503"],
)
def test_an_unavailable_api_server_is_infrastructure_not_the_agents_fault(error: Exception) -> None:
    # A restart of kube-apiserver under a running worker must not fail the Run for good (bench/chaos.py).
    report, code = _termination(error)
    assert report["class"] == FailureClass.INFRASTRUCTURE
    assert report["message"].startswith("the API server was unavailable")
    assert code == 1


@pytest.mark.parametrize("error", [ApiError(422, "Invalid", "bad"), RuntimeError("bug in the agent")])
def test_other_errors_stay_deterministic(error: Exception) -> None:
    report, code = _termination(error)
    assert (report["class"], code) == (FailureClass.DETERMINISTIC, 1)


def test_a_transient_error_exits_75() -> None:
    report, code = _termination(TransientError("upstream 503"))
    assert (report["class"], code) == (FailureClass.TRANSIENT, EX_TEMPFAIL)


def test_the_same_outage_has_one_fingerprint() -> None:
    first, _ = _termination(refused_connection())
    again, _ = _termination(refused_connection())
    assert first["fingerprint"] == again["fingerprint"]


@pytest.mark.parametrize(
    "error",
    [
        ApiError(500, "InternalError", "etcdserver: request is too large"),
        ApiError(413, "RequestEntityTooLarge", "Request entity too large: limit is 3145728"),
        ApiError(
            500, "", "rpc error: code = ResourceExhausted desc = trying to send message larger than max"
        ),
    ],
    ids=["etcd", "api-server-body-limit", "grpc"],
)
def test_an_oversize_write_is_deterministic_with_advice_not_an_outage(error: ApiError) -> None:
    report, code = _termination(error)
    assert (report["class"], code) == (FailureClass.DETERMINISTIC, 1)
    assert report["message"].startswith(f"the API server refused a write as too large ({error.status}: ")
    assert "checkpoint a reference to it (stateRef)" in report["message"]


def test_a_budget_refusal_keeps_its_own_message() -> None:
    report, _ = _termination(PermanentError("the result is 70000 bytes of JSON, over its budget of 65536"))
    assert (report["class"], report["message"]) == (
        FailureClass.DETERMINISTIC,
        "the result is 70000 bytes of JSON, over its budget of 65536",
    )
