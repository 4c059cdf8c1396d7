"""The one door to the Kubernetes API for agentrun's operator and worker SDK.

A small async REST layer over the official client's connection handling (kubeconfig, in-cluster
service account, TLS): requests are plain JSON in and out, so the pydantic models in agentrun.api stay
the only typed view of our objects. Blocking calls run on a private thread pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final
from urllib.parse import quote

import urllib3
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from agentrun.api import GROUP, VERSION

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
        return 400 <= self.status < 500 and self.status not in (408, 409, 429)

    @property
    def too_large(self) -> bool:
        """The object (or the request) is over a size limit: sending it again cannot help."""
        if self.status == 413:
            return True
        return self.status == 500 and any(marker in self.message.lower() for marker in TOO_LARGE_MARKERS)


def unanswered(exc: BaseException) -> bool:
    """The request got no answer at all (connection refused or reset, a timeout: the API server is
    restarting, or the network failed), as opposed to an answer that refused it (ApiError)."""
    return isinstance(exc, urllib3.exceptions.HTTPError)


def to_api_error(exc: ApiException) -> ApiError:
    reason, message = str(exc.reason or ""), str(exc.body or "")
    try:
        status = json.loads(exc.body or "{}")
        reason, message = status.get("reason", reason), status.get("message", message)
    except (ValueError, AttributeError):
        pass
    return ApiError(int(exc.status or 0), reason, message)


def load_configuration(kubeconfig: str | None = None) -> client.Configuration:
    """KUBECONFIG (or the given file) when present, else the in-cluster service account."""
    configuration = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path or os.path.exists(os.path.expanduser("~/.kube/config")):
        config.load_kube_config(config_file=path, client_configuration=configuration)
    else:
        config.load_incluster_config(client_configuration=configuration)
    return configuration


def call_json(
    api_client: client.ApiClient,
    method: str,
    path: str,
    body: Any = None,
    *,
    query: dict[str, str] | None = None,
    content_type: str = "application/json",
    timeout: tuple[float, float] | None = None,
) -> JsonDict:
    """One request, JSON in and out (blocking); an answer that refuses it raises ApiError."""
    try:
        result = api_client.call_api(
            path,
            method,
            query_params=list((query or {}).items()),
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            response_type="object",
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _request_timeout=timeout,
        )
    except ApiException as exc:
        raise to_api_error(exc) from None
    return result if isinstance(result, dict) else {}


class KubeApi:
    def __init__(self, configuration: client.Configuration | None = None, threads: int = 16) -> None:
        configuration = configuration or load_configuration()
        configuration.connection_pool_maxsize = threads
        self._client = client.ApiClient(configuration)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kubeapi")
        self.requests = 0  # how many requests this process made, for benchmarks and tests

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> JsonDict:
        def call() -> JsonDict:
            return call_json(self._client, method, path, body, query=query, content_type=content_type)

        self.requests += 1
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(call))

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

    async def delete(self, path: str, grace_seconds: int | None = None) -> bool:
        """Deletes (in the background); False when there was nothing to delete."""
        body: JsonDict = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
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
        `resource_version` on (every change after it, none skipped), else from the current state.
        `bookmarks` asks for BOOKMARK events (an object carrying only a newer resourceVersion). An
        expired resource_version comes as an ERROR event with a 410 Status (agentrun.kubewatch
        relists then)."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[JsonDict | BaseException | None] = asyncio.Queue()
        query = [("watch", "true"), ("timeoutSeconds", str(timeout_seconds))]
        if name is not None:
            query.append(("fieldSelector", f"metadata.name={name}"))
        if label_selector:
            query.append(("labelSelector", label_selector))
        if resource_version:
            query.append(("resourceVersion", resource_version))
        if bookmarks:
            query.append(("allowWatchBookmarks", "true"))

        responses: list[Any] = []

        def hand(item: JsonDict | BaseException | None) -> None:
            # The consumer may be gone with its loop (it stopped reading): nobody to tell then.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(events.put_nowait, item)

        def stream() -> None:
            try:
                response = self._client.call_api(
                    collection,
                    "GET",
                    query_params=query,
                    header_params={"Accept": "application/json"},
                    auth_settings=["BearerToken"],
                    _preload_content=False,
                    _return_http_data_only=True,
                    _request_timeout=timeout_seconds + 30,
                )
                responses.append(response)
                buffer = b""
                for chunk in response.stream(4096, decode_content=True):
                    buffer += chunk
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        if line.strip():
                            hand(json.loads(line))
                hand(None)
            except ApiException as exc:
                hand(to_api_error(exc))
            except BaseException as exc:  # handed to the consumer, which decides
                hand(exc)

        self.requests += 1
        # A daemon thread, not the pool: a read blocked on a quiet stream must never hold the process
        # open at exit, and closing the response from another thread would block on its lock.
        threading.Thread(target=stream, name="kubeapi-watch", daemon=True).start()
        try:
            while (item := await events.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            # The consumer stopped early (cancelled, or done with the watch): end the blocked read now, so
            # the thread and its connection (a watch on the API server) do not live on until the server's
            # timeout. shutdown() only shuts the socket for reading: safe from another thread.
            for response in responses:
                with contextlib.suppress(Exception):
                    response.shutdown()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()
