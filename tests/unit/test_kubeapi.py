"""Telling a request nobody answered from one the API server refused."""

from __future__ import annotations

import pytest
import urllib3

from agentrun.kubeapi import ApiError, unanswered

POOL = urllib3.HTTPConnectionPool("localhost")  # constructing a pool opens no connection

CASES = {
    "connection-refused": (urllib3.exceptions.MaxRetryError(POOL, "/apis", ConnectionRefusedError()), True),
    "read-timeout": (urllib3.exceptions.ReadTimeoutError(POOL, "/apis", "timed out"), True),
    "connection-reset": (urllib3.exceptions.ProtocolError("Connection aborted."), True),
    "refused-by-the-server": (ApiError(409, "Conflict", "the object has been modified"), False),
    "a-bug": (KeyError("status"), False),
}


@pytest.mark.parametrize(("exc", "expected"), CASES.values(), ids=CASES.keys())
def test_unanswered(exc: BaseException, expected: bool) -> None:
    assert unanswered(exc) is expected


TOO_LARGE = {
    "etcd-request-limit": (ApiError(500, "InternalError", "etcdserver: request is too large"), True),
    "api-server-body-limit": (ApiError(413, "", "Request entity too large: limit is 3145728"), True),
    "grpc-send-limit": (
        ApiError(500, "", "trying to send message larger than max (2429367 vs. 2097152)"),
        True,
    ),
    "an-outage": (ApiError(500, "InternalError", "etcdserver: leader changed"), False),
    "invalid": (ApiError(422, "Invalid", "Too long: may not be more than 1024 bytes"), False),
    "unavailable": (ApiError(503, "ServiceUnavailable", "the server is too large a target"), False),
}


@pytest.mark.parametrize(("error", "expected"), TOO_LARGE.values(), ids=TOO_LARGE.keys())
def test_too_large(error: ApiError, expected: bool) -> None:
    assert error.too_large is expected
