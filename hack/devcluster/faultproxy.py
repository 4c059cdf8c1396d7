"""A TCP proxy in front of a real server, for fault injection (bench/chaos.py puts it in front of the local
control plane's versitygw): it passes bytes through as they come, or

- `slow`: holds every chunk a client sends for `delay` seconds before passing it on (requests answered
  late, on new and pooled connections alike);
- `5xx`: answers every request that starts meanwhile `503 Service Unavailable` (an S3 error document, as
  a store under load does) and closes that connection, without passing the request on;

and it can call back once, right after the server has answered a request whose request line matches a
pattern and before that answer reaches the client (e.g. to kill a client between two of its writes).

The server behind it stays the real one: the proxy never makes up an answer other than the 503.
It runs its own event loop in a daemon thread; every method may be called from any thread.
"""

from __future__ import annotations

import asyncio
import collections
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

_REQUEST_LINE = re.compile(rb"^(GET|PUT|POST|HEAD|DELETE|PATCH|OPTIONS) \S+ HTTP/1\.[01]\r\n")
_UNAVAILABLE_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>ServiceUnavailable</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
UNAVAILABLE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\n"
    + f"Content-Length: {len(_UNAVAILABLE_BODY)}\r\n".encode()
    + b"Connection: close\r\n\r\n"
    + _UNAVAILABLE_BODY
)
MODES = ("pass", "slow", "5xx")


@dataclass
class _Trap:
    pattern: re.Pattern[bytes]
    callback: Callable[[bytes], None]


class FaultProxy:
    """127.0.0.1:`port` -> `upstream_host`:`upstream_port`."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.mode = "pass"
        self.delay = 0.0
        self.counts: collections.Counter[str] = collections.Counter()
        self._trap: _Trap | None = None
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)

    def start(self) -> None:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop
        )
        self._server = future.result(timeout=10)
        self.port = int(self._server.sockets[0].getsockname()[1])

    def stop(self) -> None:
        """Stops listening, closes every connection, and ends its thread."""
        if not self._thread.is_alive():
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_mode(self, mode: str, delay: float = 0.0) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}: one of {MODES}")
        with self._lock:
            self.mode, self.delay = mode, delay

    def trap_once(self, pattern: bytes, callback: Callable[[bytes], None]) -> None:
        """Calls callback(request line) once, when the server has answered the next request whose request
        line matches `pattern` (a regular expression), before the answer is passed on."""
        with self._lock:
            self._trap = _Trap(re.compile(pattern), callback)

    def trap_armed(self) -> bool:
        with self._lock:
            return self._trap is not None

    def disarm(self) -> None:
        with self._lock:
            self._trap = None

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            self.counts["upstream refused"] += 1
            client_writer.close()
            return
        trapped: list[tuple[bytes, Callable[[bytes], None]]] = []  # what the trap caught on this connection

        async def upstream() -> None:
            while data := await client_reader.read(65536):
                request = _REQUEST_LINE.match(data)
                with self._lock:
                    mode, delay, trap = self.mode, self.delay, self._trap
                    if (
                        request
                        and mode != "5xx"
                        and trap is not None
                        and trap.pattern.match(data.split(b"\r\n", 1)[0])
                    ):
                        trapped.append((data.split(b"\r\n", 1)[0], trap.callback))
                        self._trap = None
                if request:
                    self.counts["requests"] += 1
                if mode == "5xx" and request:
                    self.counts["answered 503"] += 1
                    client_writer.write(UNAVAILABLE)
                    await client_writer.drain()
                    return
                if mode == "slow":
                    self.counts["chunks delayed"] += 1
                    await asyncio.sleep(delay)
                server_writer.write(data)
                await server_writer.drain()

        async def downstream() -> None:
            while data := await server_reader.read(65536):
                if trapped:
                    line, callback = trapped.pop()
                    self.counts["trapped"] += 1
                    callback(line)
                client_writer.write(data)
                await client_writer.drain()

        tasks = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for writer in (client_writer, server_writer):
                writer.close()
