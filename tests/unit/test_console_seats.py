"""The console behind a proxy, without a cluster: where a person's token comes from, that it is the only
credential sent, and that a request without one is refused before anything reaches the API server.
(With the API server and two ServiceAccounts' tokens: tests/integration/test_console_proxy.py.)"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer

from agentrun.cli.app import parse
from agentrun.cli.console.seats import ProxySeats, as_bearer, token_from
from agentrun.cli.console.server import Console, application
from agentrun.cli.console.sessions import Sessions
from agentrun.kubeapi import Configuration

HOST = "console.example.com"


@pytest.mark.parametrize(
    ("header", "value", "token"),
    [
        ("Authorization", "Bearer abc.def", "abc.def"),
        ("Authorization", "bearer  abc ", "abc"),
        ("Authorization", "Basic dXNlcjpwYXNz", None),  # not a bearer token: never passed on
        ("Authorization", "Bearer ", None),
        ("X-Forwarded-Access-Token", "abc.def", "abc.def"),
        ("X-Forwarded-Access-Token", "Bearer abc.def", "abc.def"),
        ("X-Forwarded-Access-Token", "  ", None),
        ("X-Forwarded-Access-Token", None, None),
    ],
)
def test_the_persons_token_is_read_from_the_proxys_header(
    header: str, value: str | None, token: str | None
) -> None:
    assert token_from(value, header) == token


def test_the_persons_token_is_the_only_credential_sent() -> None:
    own = Configuration(
        host="https://api.example.com:6443",
        ca_data="CA",
        cert_data=b"CERT",
        key_data=b"KEY",
        cert_file="/own.crt",
        key_file="/own.key",
        authorization=lambda: "Bearer the-consoles-own",
    )
    theirs = as_bearer(own, "the-persons")
    assert theirs.authorization() == "Bearer the-persons"
    assert (theirs.cert_data, theirs.key_data, theirs.cert_file, theirs.key_file) == (None, None, None, None)
    assert (theirs.host, theirs.ca_data) == (own.host, own.ca_data), "where the API server is, and its CA"
    assert own.authorization() == "Bearer the-consoles-own", "the console's own is untouched"


def test_behind_a_proxy_a_request_without_a_token_is_refused() -> None:
    base = Configuration(host="http://127.0.0.1:1")  # no API server there: nothing may get that far
    proxy = ProxySeats(base, ["team-a"], "team-a")
    console = Console(
        None, None, Sessions(60), {HOST}, None, parse, proxy=proxy, token_header="X-Forwarded-Access-Token"
    )

    async def main() -> None:
        client = TestClient(TestServer(application(console)))
        await client.start_server()
        try:
            for path in ("/api/inbox", "/api/session", "/api/events"):
                answer = await client.get(path, headers={"Host": HOST})
                assert answer.status == 401, path
                body = await answer.json()
                assert "no user token in the X-Forwarded-Access-Token header" in body["error"]
                assert body["proxied"] is True
            answer = await client.post("/api/answer", json={"namespace": "team-a"}, headers={"Host": HOST})
            assert answer.status == 401
            page = await client.get("/", headers={"Host": HOST})
            assert page.status == 200, "the page itself is public: it asks for nothing"
            health = await client.get("/healthz", headers={"Host": "10.0.0.7:8080"})
            assert (health.status, await health.text()) == (200, "ok"), "probes know no host name"
            elsewhere = await client.get(
                "/api/inbox", headers={"Host": "evil.example", "X-Forwarded-Access-Token": "t"}
            )
            assert elsewhere.status == 421, "DNS rebinding: the Host is checked before anything else"
            assert len(proxy) == 0, "no seat opened"
        finally:
            await client.close()
            await proxy.close()

    asyncio.run(main())


def test_a_console_without_a_proxy_needs_its_kubeconfig() -> None:
    with pytest.raises(ValueError, match="api and cache needed"):
        Console(None, None, Sessions(60), {HOST}, None, parse)
