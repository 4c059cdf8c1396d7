"""The chaos run's fault proxy (hack/devcluster/faultproxy.py) in front of a real HTTP server on a local
socket: it passes requests through, answers 503 without passing them on, holds them when slow, and calls
its trap back once the server has answered a matching request, before the answer reaches the client."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from devcluster.faultproxy import FaultProxy


class Server(ThreadingHTTPServer):
    seen: list[str]


class Handler(BaseHTTPRequestHandler):
    server: Server

    def do_PUT(self) -> None:  # the standard library names it
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.seen.append(f"PUT {self.path} {body.decode()}")
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def proxy() -> Iterator[tuple[FaultProxy, Server]]:
    server = Server(("127.0.0.1", 0), Handler)
    server.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    front = FaultProxy("127.0.0.1", server.server_address[1])
    front.start()
    try:
        yield front, server
    finally:
        front.stop()
        server.shutdown()
        server.server_close()


def put(proxy: FaultProxy, path: str, body: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        connection.request("PUT", path, body=body.encode())
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_requests_pass_through_to_the_real_server(proxy: tuple[FaultProxy, Server]) -> None:
    front, server = proxy
    assert put(front, "/bucket/a", "one") == (200, b"ok")
    assert server.seen == ["PUT /bucket/a one"]


def test_in_5xx_mode_every_request_is_answered_503_and_never_reaches_the_server(
    proxy: tuple[FaultProxy, Server],
) -> None:
    front, server = proxy
    front.set_mode("5xx")
    status, body = put(front, "/bucket/a", "one")
    assert status == 503
    assert b"<Code>ServiceUnavailable</Code>" in body
    assert server.seen == []
    front.set_mode("pass")
    assert put(front, "/bucket/a", "two") == (200, b"ok")
    assert front.counts["answered 503"] == 1


def test_a_slow_proxy_holds_requests_and_passes_them_on(proxy: tuple[FaultProxy, Server]) -> None:
    front, server = proxy
    front.set_mode("slow", delay=0.01)
    assert put(front, "/bucket/a", "one") == (200, b"ok")
    assert server.seen == ["PUT /bucket/a one"]
    assert front.counts["chunks delayed"] >= 1
    with pytest.raises(ValueError, match="unknown mode"):
        front.set_mode("down")


def test_the_trap_fires_once_after_the_server_answered_a_matching_request(
    proxy: tuple[FaultProxy, Server],
) -> None:
    front, server = proxy
    fired: list[tuple[bytes, list[str]]] = []
    front.trap_once(rb"^PUT /bucket/_archives/", lambda line: fired.append((line, list(server.seen))))
    assert put(front, "/bucket/blob", "x") == (200, b"ok")
    assert fired == []
    assert front.trap_armed()
    assert put(front, "/bucket/_archives/ns/_index/1.json", "entry") == (200, b"ok")
    # when it fired, the server had stored the write
    assert fired == [
        (
            b"PUT /bucket/_archives/ns/_index/1.json HTTP/1.1",
            ["PUT /bucket/blob x", "PUT /bucket/_archives/ns/_index/1.json entry"],
        )
    ]
    assert not front.trap_armed()
    assert put(front, "/bucket/_archives/ns/_index/2.json", "entry") == (200, b"ok")
    assert len(fired) == 1
