"""Telling a request nobody answered from one the API server refused."""

from __future__ import annotations

import pytest
import urllib3

from agentrun.kubeapi import ApiError, unanswered

CASES = {
    "connection-refused": (urllib3.exceptions.MaxRetryError(None, "/apis", ConnectionRefusedError()), True),
    "read-timeout": (urllib3.exceptions.ReadTimeoutError(None, "/apis", "timed out"), True),
    "connection-reset": (urllib3.exceptions.ProtocolError("Connection aborted."), True),
    "refused-by-the-server": (ApiError(409, "Conflict", "the object has been modified"), False),
    "a-bug": (KeyError("status"), False),
}


@pytest.mark.parametrize(("exc", "expected"), CASES.values(), ids=CASES.keys())
def test_unanswered(exc: BaseException, expected: bool) -> None:
    assert unanswered(exc) is expected
