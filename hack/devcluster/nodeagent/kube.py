"""The node agent's only door to the API server: blocking client calls moved off the event loop."""

from __future__ import annotations

import asyncio
import datetime
import functools
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from kubernetes import client, config

T = TypeVar("T")

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

    The client sends a dict PATCH body as a strategic merge patch (lists such as Pod conditions merge by
    key, keeping what the scheduler wrote), and a list body as a JSON patch.
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

    def to_dict(self, obj: Any) -> Any:
        return self.api_client.sanitize_for_serialization(obj)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    async def call_dict(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        result: dict[str, Any] = self.to_dict(await self.call(fn, *args, **kwargs))
        return result

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.api_client.close()
