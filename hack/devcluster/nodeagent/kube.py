"""The node agent's only door to the API server: blocking client calls moved off the event loop."""

from __future__ import annotations

import asyncio
import datetime
import functools
import json
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client, config

_background: set[asyncio.Task[Any]] = set()


def in_background(coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
    """Starts a task the loop keeps a reference to until it ends (the loop alone holds only weak ones)."""
    task = asyncio.create_task(coro, name=name)
    _background.add(task)
    task.add_done_callback(_background.discard)
    return task


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Kube:
    """Typed-client calls that return plain dicts, run on a dedicated thread pool.

    Responses are parsed as JSON, never into the client's models: building a model constructs a client
    Configuration per nested object, which was half the node agent's CPU (and a kubelet's cost is no
    part of what the benchmarks compare). The client sends a dict PATCH body as a strategic merge patch
    (lists such as Pod conditions merge by key, keeping what the scheduler wrote), and a list body as a
    JSON patch.
    """

    def __init__(self, kubeconfig: str, threads: int = 32) -> None:
        configuration = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        configuration.connection_pool_maxsize = threads
        self.api_client = client.ApiClient(configuration)
        self.core = client.CoreV1Api(self.api_client)
        self.coordination = client.CoordinationV1Api(self.api_client)
        self.server = configuration.host
        self.ca_file = configuration.ssl_ca_cert
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kube")

    @staticmethod
    def _body(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bytes:
        """A blocking call's response body, unparsed (a failure is raised as ApiException)."""
        response = fn(*args, _preload_content=False, **kwargs)
        try:
            body: bytes = response.data
        finally:
            response.release_conn()
        return body

    def get_json(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """A blocking call's response body as JSON (for the watch thread)."""
        body: dict[str, Any] = json.loads(self._body(fn, *args, **kwargs))
        return body

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """A call whose response is not needed (a Pod status patch, an Event): its body is not parsed."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._pool, functools.partial(self._body, fn, *args, **kwargs))

    async def call_dict(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(self.get_json, fn, *args, **kwargs))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.api_client.close()
