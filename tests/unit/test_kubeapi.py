"""Telling a request nobody answered from one the API server refused; credentials from a kubeconfig."""

from __future__ import annotations

import json
import os
from pathlib import Path

import aiohttp
import pytest
import urllib3
import yaml

from agentrun import kubeauth
from agentrun.kubeapi import ApiError, KubeApi, load_configuration, unanswered

POOL = urllib3.HTTPConnectionPool("localhost")  # constructing a pool opens no connection

CASES = {
    "connection-refused": (aiohttp.ClientConnectionError("Cannot connect to host"), True),
    "server-disconnected": (aiohttp.ServerDisconnectedError(), True),
    "read-timeout": (TimeoutError(), True),
    "connection-reset": (ConnectionResetError(), True),
    "truncated-body": (aiohttp.ClientPayloadError("Response payload is not completed"), True),
    "blocking-client-refused": (
        urllib3.exceptions.MaxRetryError(POOL, "/apis", ConnectionRefusedError()),
        True,
    ),
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


PERMANENT = {
    "bad-request": (400, True),
    "forbidden": (403, True),
    "not-found": (404, True),
    "invalid": (422, True),
    "timeout": (408, False),
    "conflict": (409, False),
    "throttled": (429, False),
    "internal": (500, False),
    "unavailable": (503, False),
}


@pytest.mark.parametrize(("status", "expected"), PERMANENT.values(), ids=PERMANENT.keys())
def test_permanent(status: int, expected: bool) -> None:
    assert ApiError(status, "", "").permanent is expected


def test_status_body_becomes_reason_and_message() -> None:
    body = '{"kind":"Status","reason":"Conflict","message":"the object has been modified"}'
    error = ApiError.of_answer(409, body)
    assert (error.status, error.reason, error.message) == (409, "Conflict", "the object has been modified")
    assert ApiError.of_answer(502, "Bad Gateway").message == "Bad Gateway"


@pytest.mark.parametrize(
    ("text", "message"),
    [("", ""), ("[1, 2]", "[1, 2]"), ('"quoted"', '"quoted"'), ("{not json", "{not json")],
)
def test_an_answer_that_is_no_status_object_is_the_message_itself(text: str, message: str) -> None:
    error = ApiError.of_answer(500, text)
    assert (error.status, error.reason, error.message) == (500, "", message)


def _kubeconfig(tmp_path: Path, user: dict[str, str]) -> Path:
    path = tmp_path / "kubeconfig"
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    path.write_text(yaml.safe_dump(document))
    return path


def _following_a_token_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[KubeApi, Path, list[float]]:
    """A client whose kubeconfig names the tokenFile `token` (holding "first"), the file, and the clock
    kubeauth looks at the file by (moved by the test)."""
    now = [1000.0]
    monkeypatch.setattr(kubeauth, "_clock", lambda: now[0])
    token = tmp_path / "token"
    token.write_text("first\n")
    api = KubeApi(load_configuration(str(_kubeconfig(tmp_path, {"tokenFile": "token"}))))
    assert api._endpoint.headers() == {"Authorization": "Bearer first"}
    return api, token, now


def test_a_rotated_token_file_is_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bound service-account tokens rotate: the file's new token is sent from the first request after
    the next look at the file (at most a second later)."""
    api, token, now = _following_a_token_file(tmp_path, monkeypatch)
    token.write_text("second\n")
    os.utime(token, (1, 1))  # a new modification time, whatever the file system's resolution
    assert api._endpoint.headers() == {"Authorization": "Bearer first"}  # looked at a moment ago

    now[0] += kubeauth.TOKEN_FILE_CHECK_SECONDS
    assert api._endpoint.headers() == {"Authorization": "Bearer second"}


def test_a_token_file_that_cannot_be_read_is_read_at_the_next_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Caught while it is replaced, the file is tried again at the very next request, not a second later."""
    api, token, now = _following_a_token_file(tmp_path, monkeypatch)
    token.unlink()
    token.mkdir()  # there, but no file to read
    now[0] += kubeauth.TOKEN_FILE_CHECK_SECONDS
    assert api._endpoint.headers() == {"Authorization": "Bearer first"}  # kept while unreadable
    token.rmdir()
    token.write_text("second\n")

    assert api._endpoint.headers() == {"Authorization": "Bearer second"}  # same moment: tried again


def test_an_inline_token_is_sent_as_is(tmp_path: Path) -> None:
    api = KubeApi(load_configuration(str(_kubeconfig(tmp_path, {"token": "abc"}))))
    assert api._endpoint.headers() == {"Authorization": "Bearer abc"}


def test_in_a_kubeconfig_list_the_first_file_decides_and_token_files_are_relative_to_their_own(
    tmp_path: Path,
) -> None:
    """KUBECONFIG=a:b, as kubectl merges it: a's current context and user win over b's, and the user's
    tokenFile is found next to the file that defines that user."""
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    (second / "token").write_text("from-b\n")
    (first / "kubeconfig").write_text(
        yaml.safe_dump(
            {"current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}
        )
    )
    config_b = _kubeconfig(second, {"tokenFile": "token"})
    paths = os.pathsep.join([str(first / "kubeconfig"), str(config_b)])
    api = KubeApi(load_configuration(paths))
    assert api._endpoint.headers() == {"Authorization": "Bearer from-b"}


def _body_sent(api: KubeApi, body: object) -> object:
    return json.loads(api._request_options(None, body)["data"])


def test_a_body_of_api_values_is_sent_the_same_by_either_encoder(tmp_path: Path) -> None:
    kubeconfig = str(_kubeconfig(tmp_path, {"token": "abc"}))
    body = {
        "metadata": {"resourceVersion": "42", "labels": {"agentrun.dev/run": "näive"}},
        "status": {"phase": "Running", "attempts": 2, "usage": {"costMicroUSD": 2**53 - 1}, "x": None},
        "spec": {"input": {"ratio": 0.1, "list": [1, "two", True, {"deep": []}]}},
    }
    exact = KubeApi(load_configuration(kubeconfig))
    fast = KubeApi(load_configuration(kubeconfig), api_values_only=True)

    assert _body_sent(exact, body) == _body_sent(fast, body) == body
    assert "näive".encode() in fast._request_options(None, body)["data"]  # orjson: UTF-8 as is
    assert b"n\\u00e4ive" in exact._request_options(None, body)["data"]  # json: escaped


def test_the_operators_encoder_falls_back_to_json_for_what_orjson_refuses(tmp_path: Path) -> None:
    """A number past 64 bits may come from the API server (it keeps large numbers as float64 and writes
    them without an exponent): copied into a body, it is written as it came, not a failed write."""
    fast = KubeApi(load_configuration(str(_kubeconfig(tmp_path, {"token": "abc"}))), api_values_only=True)
    sent = fast._request_options(None, {"spec": {"input": {"n": 20000000000000000000}}})["data"]

    assert sent == b'{"spec":{"input":{"n":20000000000000000000}}}'


def test_a_callers_value_past_64_bits_or_nan_is_never_changed_on_the_way(tmp_path: Path) -> None:
    """The SDK's and the CLI's bodies carry user values: an int orjson refuses is written exactly, and a
    NaN is sent as is (for the API server to refuse), never turned into null."""
    api = KubeApi(load_configuration(str(_kubeconfig(tmp_path, {"token": "abc"}))))
    sent = api._request_options(None, {"result": {"big": 2**70, "nan": float("nan")}})["data"]

    assert sent == b'{"result":{"big":1180591620717411303424,"nan":NaN}}'
