"""The one door to the Kubernetes API for agentrun's operator, worker SDK and CLI.

A small async REST layer on aiohttp (which kopf already runs on; bench/findings.md has the measurement
that chose it): requests are plain JSON in and out, so the pydantic models in agentrun.api stay the only
typed view of our objects. Where the server is and who we are: agentrun.kubeauth. One HTTP session per
event loop (the LangGraph saver's sync API runs a loop of its own), created at its first request.

Answers and watch events are parsed with orjson: parsing was the largest single item of the operator's
CPU (bench/findings.md, "Cost per Run"). Request bodies are written with the standard json module,
which writes any int a caller's value holds (orjson refuses one past 64 bits) and never turns a NaN into
null (orjson does, silently), unless the client is made with `api_values_only`: the operator's, whose
bodies hold only what the API server sent and what it computes (no NaN), are written with orjson, and
with json where orjson refuses one (an int past 64 bits, which a large number the API server sent is).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import weakref
from collections.abc import AsyncIterator
from typing import Any, Final
from urllib.parse import quote

import orjson

from agentrun.api import GROUP, VERSION
from agentrun.deferredtls import aiohttp  # aiohttp, without reading the CA bundle at import
from agentrun.kubeauth import Configuration, Endpoint, load_configuration

__all__ = [
    "ApiError",
    "Configuration",
    "JsonDict",
    "KubeApi",
    "api_json",
    "load_configuration",
    "served_resources",
    "unanswered",
]

JsonDict = dict[str, Any]
MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
# How an oversize write comes back: 413 from the API server's body limit (3 MiB), or a 500 carrying
# etcd's "etcdserver: request is too large" or gRPC's "trying to send message larger than max".
TOO_LARGE_MARKERS: Final = (
    "request is too large",
    "entity too large",
    "larger than max",
    "object is too large",
)
# Answers worth sending again: a timeout, a conflict (after a fresh read), throttling.
RETRYABLE_CLIENT_ERRORS: Final = frozenset({408, 409, 429})
CONNECT_SECONDS: Final = 10.0
REQUEST_SECONDS: Final = 60.0


class ApiError(Exception):
    """A request the API server refused; `status` is the HTTP status, `reason` the Status reason."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def conflict(self) -> bool:
        """A precondition failed (stale resourceVersion) or the object already exists."""
        return self.status == 409

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def permanent(self) -> bool:
        """A refusal that the same request will meet again (a 4xx but for 408 Request Timeout, 409
        Conflict and 429 Too Many Requests): retrying soon cannot help, a change of the request or of
        the cluster (RBAC, a policy, the object) must come first."""
        return 400 <= self.status < 500 and self.status not in RETRYABLE_CLIENT_ERRORS

    @property
    def too_large(self) -> bool:
        """The object (or the request) is over a size limit: sending it again cannot help."""
        if self.status == 413:
            return True
        return self.status == 500 and any(marker in self.message.lower() for marker in TOO_LARGE_MARKERS)

    @classmethod
    def of_answer(cls, status: int, text: str) -> ApiError:
        """From a refusing answer's body (a Status object, or plain text)."""
        reason, message = "", text
        try:
            body = orjson.loads(text or "{}")
            if isinstance(body, dict):
                reason, message = str(body.get("reason", "")), str(body.get("message", text))
        except ValueError:
            pass
        return cls(status, reason, message)


def unanswered(exc: BaseException) -> bool:
    """The request got no answer at all (connection refused or reset, a timeout: the API server is
    restarting, or the network failed), as opposed to an answer that refused it (ApiError)."""
    return isinstance(
        exc,
        aiohttp.ClientConnectionError | aiohttp.ClientPayloadError | TimeoutError | ConnectionError,
    ) or _blocking_client_unanswered(exc)


def _blocking_client_unanswered(exc: BaseException) -> bool:
    """The same from a blocking client on urllib3 (the chaos harness's, or an agent's own). Looked up,
    not imported: agentrun never loads urllib3, and without it loaded no such error can exist."""
    exceptions = sys.modules.get("urllib3.exceptions")
    return exceptions is not None and isinstance(exc, exceptions.HTTPError)


class _Sessions:
    """The HTTP sessions of one event loop: requests share a bounded pool of kept-alive connections;
    each watch holds a connection of its own for as long as it streams, outside that bound."""

    def __init__(self, endpoint: Endpoint, connections: int) -> None:
        # weakly: the sessions are the value of a weak mapping keyed by this loop
        self._loop = weakref.ref(asyncio.get_running_loop())

        def session(limit: int, read_seconds: float | None) -> aiohttp.ClientSession:
            return aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=limit, ssl=endpoint.ssl),
                timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=CONNECT_SECONDS, sock_read=read_seconds
                ),
                auto_decompress=True,
                skip_auto_headers=("User-Agent",),
                headers={"User-Agent": "agentrun"},
            )

        self.requests = session(connections, REQUEST_SECONDS)
        self.watches = session(0, None)  # a watch sets its own read timeout

    def close(self) -> None:
        """Closes the connections at once, from any thread, even after the loop ended (aiohttp's own
        close is a coroutine of the session's loop, which may be gone or busy in another thread)."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        loop = self._loop()
        for session in (self.requests, self.watches):
            connector = session.connector
            if connector is None:
                continue
            if loop is not None and loop.is_running() and running is not loop:
                with contextlib.suppress(RuntimeError):  # closed meanwhile
                    loop.call_soon_threadsafe(_abort, connector)
            else:
                _abort(connector)

    async def aclose(self) -> None:
        await self.requests.close()
        await self.watches.close()


def _exact_json(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def api_json(body: Any) -> bytes:
    """Compact JSON of values the API server sent or the operator made (no NaN): orjson, and json for
    what orjson refuses (a key that is no plain str, an int past 64 bits, which a large number the API
    server keeps as float64 comes back as), so that such a value never fails a write."""
    try:
        return orjson.dumps(body)
    except TypeError:  # orjson.JSONEncodeError
        return _exact_json(body)


def _abort(connector: aiohttp.BaseConnector) -> None:
    """Closes every connection of `connector` without waiting (and marks it, and its session, closed)."""
    with contextlib.suppress(Exception):
        connector._close(abort_ssl=True)  # the synchronous part of its close (a private method)


class KubeApi:
    def __init__(
        self,
        configuration: Configuration | None = None,
        threads: int = 16,
        *,
        api_values_only: bool = False,
    ) -> None:
        """threads: how many requests may be in flight at once (the name of the thread-pool days).
        api_values_only: every body holds only values read from the API server or made by the caller
        (no NaN), so orjson writes them, ten times faster than json (which writes what orjson refuses)."""
        self._endpoint = Endpoint.of(configuration or load_configuration())
        self._connections = threads
        self._encode = api_json if api_values_only else _exact_json
        self._sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Sessions] = (
            weakref.WeakKeyDictionary()
        )
        self.requests = 0  # how many requests this process made, for benchmarks and tests

    def _for_this_loop(self) -> _Sessions:
        loop = asyncio.get_running_loop()
        sessions = self._sessions.get(loop)
        if sessions is None:
            sessions = self._sessions[loop] = _Sessions(self._endpoint, self._connections)
        return sessions

    def _request_options(self, content_type: str | None, body: Any) -> dict[str, Any]:
        headers = {"Accept": "application/json", **self._endpoint.headers()}
        options: dict[str, Any] = {"headers": headers}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
            options["data"] = self._encode(body)
        if self._endpoint.server_hostname:
            options["server_hostname"] = self._endpoint.server_hostname
        if self._endpoint.proxy:
            options["proxy"] = self._endpoint.proxy
        return options

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> JsonDict:
        """One request, JSON in and out; an answer that refuses it raises ApiError."""
        self.requests += 1
        session = self._for_this_loop().requests
        options = self._request_options(content_type, body)
        url = self._endpoint.base_url + path  # a server URL may have a path of its own (a proxy's)
        async with session.request(method, url, params=query, **options) as response:
            data = await response.read()
            if response.status >= 400:
                raise ApiError.of_answer(response.status, data.decode(errors="replace"))
        if not data:
            return {}
        result = orjson.loads(data)
        return result if isinstance(result, dict) else {}

    async def read_text(self, path: str, query: dict[str, str] | None = None) -> bytes:
        """A GET of a resource that answers in plain text (a Pod's log): its bytes as sent."""
        self.requests += 1
        session = self._for_this_loop().requests
        options = self._request_options(None, None)
        options["headers"]["Accept"] = "text/plain, */*"
        url = self._endpoint.base_url + path
        async with session.request("GET", url, params=query, **options) as response:
            data = await response.read()
            if response.status >= 400:
                raise ApiError.of_answer(response.status, data.decode(errors="replace"))
        return data

    # ---- paths -----------------------------------------------------------------------------------------

    @staticmethod
    def _path(api: str, plural: str, namespace: str, name: str | None, subresource: str | None) -> str:
        parts = [api, "namespaces", quote(namespace), plural]
        parts += [quote(name)] if name else []
        parts += [subresource] if subresource else []
        return "/".join(parts)

    @classmethod
    def custom_path(
        cls, plural: str, namespace: str, name: str | None = None, subresource: str | None = None
    ) -> str:
        """The path of an agentrun.dev object (or collection, without name)."""
        return cls._path(f"/apis/{GROUP}/{VERSION}", plural, namespace, name, subresource)

    @classmethod
    def core_path(
        cls, plural: str, namespace: str, name: str | None = None, subresource: str | None = None
    ) -> str:
        """The path of a core/v1 object (or collection, without name)."""
        return cls._path("/api/v1", plural, namespace, name, subresource)

    @classmethod
    def lease_path(cls, namespace: str, name: str | None = None) -> str:
        return cls._path("/apis/coordination.k8s.io/v1", "leases", namespace, name, None)

    # ---- verbs -------------------------------------------------------------------------------------

    async def get(self, path: str) -> JsonDict | None:
        try:
            return await self.request("GET", path)
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    async def list_pages(
        self, collection: str, label_selector: str | None = None, page: int = 500
    ) -> AsyncIterator[list[JsonDict]]:
        """The items of a collection, a page at a time (items carry no kind: the collection names it)."""
        query = {"limit": str(page), **({"labelSelector": label_selector} if label_selector else {})}
        while True:
            found = await self.request("GET", collection, query=query)
            yield found.get("items") or []
            token = (found.get("metadata") or {}).get("continue")
            if not token:
                return
            query["continue"] = token

    async def create(self, path: str, body: JsonDict) -> JsonDict:
        return await self.request("POST", path, body)

    async def replace(self, path: str, body: JsonDict) -> JsonDict:
        return await self.request("PUT", path, body)

    async def merge_patch(self, path: str, patch: JsonDict) -> JsonDict:
        """A JSON merge patch; put metadata.resourceVersion in it to make it conditional."""
        return await self.request("PATCH", path, patch, content_type=MERGE_PATCH)

    async def json_patch(self, path: str, operations: list[JsonDict]) -> JsonDict:
        return await self.request("PATCH", path, operations, content_type=JSON_PATCH)

    async def delete(
        self, path: str, grace_seconds: int | None = None, *, preconditions: JsonDict | None = None
    ) -> bool:
        """Deletes (in the background); False when there was nothing to delete. `preconditions` (uid,
        resourceVersion) that do not hold: ApiError 409."""
        body: JsonDict = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        if preconditions:
            body["preconditions"] = preconditions
        try:
            await self.request("DELETE", path, body)
        except ApiError as exc:
            if not exc.not_found:
                raise
            return False
        return True

    async def watch(
        self,
        collection: str,
        name: str | None = None,
        *,
        label_selector: str | None = None,
        timeout_seconds: int = 60,
        resource_version: str | None = None,
        bookmarks: bool = False,
    ) -> AsyncIterator[JsonDict]:
        """Watch events ({type, object}) of a collection (or of the one object `name`, or of the objects
        `label_selector` selects, chosen by the API server) until the server ends the stream; from
        `resource_version` on (every change after it, none skipped), else from the current state (an
        ADDED event per object first). `bookmarks` asks for BOOKMARK events (an object carrying only a
        newer resourceVersion). An expired resource_version comes as an ERROR event with a 410 Status
        (agentrun.kubewatch relists then)."""
        query = {"watch": "true", "timeoutSeconds": str(timeout_seconds)}
        if name:
            query["fieldSelector"] = f"metadata.name={name}"
        if label_selector:
            query["labelSelector"] = label_selector
        if resource_version:
            query["resourceVersion"] = resource_version
        if bookmarks:
            query["allowWatchBookmarks"] = "true"
        self.requests += 1
        session = self._for_this_loop().watches
        options = self._request_options(None, None)
        # A quiet stream is normal; one silent well past the server's own timeout is a dead connection.
        options["timeout"] = aiohttp.ClientTimeout(
            total=None, sock_connect=CONNECT_SECONDS, sock_read=timeout_seconds + 30
        )
        # Leaving the block (the server ended the stream, or the consumer stopped early: cancelled, or
        # done with the watch) closes the connection, and with it the watch on the API server.
        async with session.get(self._endpoint.base_url + collection, params=query, **options) as response:
            if response.status >= 400:
                raise ApiError.of_answer(response.status, (await response.read()).decode(errors="replace"))
            # Chunks, not lines: one event is a whole object, often past aiohttp's line-length limit.
            # An event split over chunks is joined once, when its end arrives.
            parts: list[bytes] = []
            async for chunk in response.content.iter_any():
                start = 0
                while (end := chunk.find(b"\n", start)) >= 0:
                    line = b"".join((*parts, chunk[start:end])) if parts else chunk[start:end]
                    parts, start = [], end + 1
                    if line.strip():
                        yield orjson.loads(line)
                if start < len(chunk):
                    parts.append(chunk[start:])

    def close(self) -> None:
        """Closes the connections (callable from outside the loop, even after it ended)."""
        for sessions in list(self._sessions.values()):
            sessions.close()
        self._sessions.clear()

    async def aclose(self) -> None:
        """Closes this loop's connections and waits until they are closed."""
        sessions = self._sessions.pop(asyncio.get_running_loop(), None)
        if sessions is not None:
            await sessions.aclose()
        self.close()


async def served_resources(api: KubeApi, group_version: str) -> set[str]:
    """The resource names the API server serves in group/version (empty when it serves none)."""
    try:
        found = await api.get(f"/apis/{group_version}")
    except ApiError as exc:
        if exc.status in (403, 503):  # discovery of a group being registered may fail for a moment
            return set()
        raise
    return {str(resource["name"]) for resource in (found or {}).get("resources", [])}
