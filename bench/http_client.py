"""CPU time per API request and per watch event in the client's own process, by HTTP transport.

    PYTHONPATH=hack:tests .venv/bin/python bench/http_client.py [N]

Starts a local control plane (hack/devcluster) with the agentrun CRDs and measures, for each transport,
the CPU time (user + system, `time.process_time`) this process spends on N sequential requests of each
kind, and on N watch events written by another process (so only the receiving side is counted):

- threaded: the synchronous kubernetes client (urllib3) on a thread pool beside the event loop, as
  KubeApi was until it moved to aiohttp;
- aiohttp: one aiohttp ClientSession on the event loop (the transport KubeApi uses now: measured
  through KubeApi itself, so its bookkeeping counts);
- kubernetes_asyncio: its ApiClient.call_api (aiohttp underneath, plus its own request building and
  response decoding), when the package is installed.

Requests: GET of a Run, a merge PATCH of a Run's status, a create of a Lease. Lower is better; the
numbers are per request, in milliseconds, the median of three rounds.
"""

from __future__ import annotations

import asyncio
import functools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, cast

from agentrun.examples.manifests import agent_run
from agentrun.kubeapi import MERGE_PATCH, KubeApi, load_configuration
from devcluster.cluster import LocalCluster
from support.agentrun import install_crds
from support.blocking_api import call_json
from support.kube import Kube

JsonDict = dict[str, Any]
NAMESPACE = "http-bench"
ROUNDS = 3


class Transport(Protocol):
    name: str

    async def call(self, method: str, path: str, body: Any = None, content_type: str = ...) -> JsonDict: ...

    def watch(self, collection: str, name: str) -> AsyncIterator[JsonDict]: ...

    async def close(self) -> None: ...


class Threaded:
    """The synchronous kubernetes client on a thread pool (KubeApi before aiohttp)."""

    name = "threaded (kubernetes, urllib3)"

    def __init__(self, kubeconfig: str) -> None:
        from kubernetes import config  # noqa: PLC0415

        self.client = config.new_client_from_config(config_file=kubeconfig)
        self.pool = ThreadPoolExecutor(16)

    async def call(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> JsonDict:
        call = functools.partial(call_json, self.client, method, path, body, content_type=content_type)
        return await asyncio.get_running_loop().run_in_executor(self.pool, call)

    async def watch(self, collection: str, name: str) -> AsyncIterator[JsonDict]:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[JsonDict | None] = asyncio.Queue()

        def stream() -> None:
            response = self.client.call_api(
                collection,
                "GET",
                query_params=[("watch", "true"), ("fieldSelector", f"metadata.name={name}")],
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
            )
            buffer = b""
            for chunk in response.stream(4096, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        loop.call_soon_threadsafe(events.put_nowait, json.loads(line))
            loop.call_soon_threadsafe(events.put_nowait, None)

        loop.run_in_executor(self.pool, stream)
        while (event := await events.get()) is not None:
            yield event

    async def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class Aiohttp:
    """KubeApi as it is now: aiohttp on the event loop."""

    name = "aiohttp (KubeApi)"

    def __init__(self, kubeconfig: str) -> None:
        self.api = KubeApi(load_configuration(kubeconfig))

    async def call(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> JsonDict:
        return await self.api.request(method, path, body, content_type=content_type)

    def watch(self, collection: str, name: str) -> AsyncIterator[JsonDict]:
        return self.api.watch(collection, name, timeout_seconds=600)  # no generator layer of its own

    async def close(self) -> None:
        await self.api.aclose()


class KubernetesAsyncio:
    """kubernetes_asyncio's ApiClient (aiohttp underneath)."""

    name = "kubernetes_asyncio"

    def __init__(self, kubeconfig: str) -> None:
        self.kubeconfig = kubeconfig
        self.client: Any = None

    async def _client(self) -> Any:
        if self.client is None:
            from kubernetes_asyncio import client, config  # noqa: PLC0415

            configuration = client.Configuration()
            await config.load_kube_config(config_file=self.kubeconfig, client_configuration=configuration)
            self.client = client.ApiClient(configuration)
        return self.client

    async def call(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> JsonDict:
        api = await self._client()
        result: JsonDict = await api.call_api(
            path,
            method,
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            response_types_map={200: "object", 201: "object"},
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
        )
        return result

    async def watch(self, collection: str, name: str) -> AsyncIterator[JsonDict]:
        api = await self._client()
        response = await api.call_api(
            collection,
            "GET",
            query_params=[("watch", "true"), ("fieldSelector", f"metadata.name={name}")],
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
        )
        async for line in response.content:
            if line.strip():
                yield json.loads(line)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()


async def cpu_per_call(count: int, call: Callable[[int], Awaitable[Any]]) -> float:
    """Milliseconds of this process's CPU per call, `count` calls one after the other."""
    await call(-1)  # a warm connection, as in steady operation
    start = time.process_time()
    for i in range(count):
        await call(i)
    return (time.process_time() - start) * 1000 / count


WRITER = """
import sys
from kubernetes import client, config
api = client.CustomObjectsApi(config.new_client_from_config(config_file=sys.argv[1]))
for i in range(int(sys.argv[3])):
    api.patch_namespaced_custom_object_status(
        "agentrun.dev", "v1alpha1", sys.argv[2], "runs", "watched", {"status": {"observedGeneration": i + 1}}
    )
"""


async def cpu_per_watch_event(transport: Transport, kubeconfig: str, count: int) -> float:
    """Milliseconds of this process's CPU per watch event; another process writes the changes."""
    collection = KubeApi.custom_path("runs", NAMESPACE)
    events = transport.watch(collection, "watched")
    await anext(events)  # the current state: the stream is open
    writer = await asyncio.create_subprocess_exec(
        sys.executable, "-c", WRITER, kubeconfig, NAMESPACE, str(count)
    )
    start = time.process_time()
    for _ in range(count):
        await anext(events)
    spent = time.process_time() - start
    await cast("AsyncGenerator[JsonDict, None]", events).aclose()  # each transport's is a generator
    await writer.wait()
    return spent * 1000 / count


async def measure(transport: Transport, kubeconfig: str, count: int, round_: int) -> dict[str, float]:
    run = KubeApi.custom_path("runs", NAMESPACE, "fetched")
    leases = KubeApi.lease_path(NAMESPACE)

    async def get(_: int) -> Any:
        return await transport.call("GET", run)

    async def patch(i: int) -> Any:
        body = {"status": {"observedGeneration": i + 2}}
        return await transport.call("PATCH", f"{run}/status", body, MERGE_PATCH)

    async def create(i: int) -> Any:
        name = f"l-{transport.name.split()[0]}-{round_}-{i}".replace("_", "-")
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name}}
        return await transport.call("POST", leases, body)

    return {
        "GET": await cpu_per_call(count, get),
        "PATCH status": await cpu_per_call(count, patch),
        "create": await cpu_per_call(count, create),
        "watch event": await cpu_per_watch_event(transport, kubeconfig, count),
    }


def transports(kubeconfig: str) -> list[Callable[[], Transport]]:
    found: list[Callable[[], Transport]] = [
        lambda: Threaded(kubeconfig),
        lambda: Aiohttp(kubeconfig),
    ]
    try:
        import kubernetes_asyncio  # noqa: F401, PLC0415

        found.append(lambda: KubernetesAsyncio(kubeconfig))
    except ImportError:
        print("kubernetes_asyncio is not installed: not measured", file=sys.stderr)
    return found


async def bench(kubeconfig: str, count: int) -> dict[str, dict[str, float]]:
    rounds: dict[str, list[dict[str, float]]] = {}
    for round_ in range(ROUNDS):
        for make in transports(kubeconfig):
            transport = make()
            try:
                rounds.setdefault(transport.name, []).append(
                    await measure(transport, kubeconfig, count, round_)
                )
            finally:
                await transport.close()
    return {
        name: {kind: round(statistics.median(r[kind] for r in results), 3) for kind in results[0]}
        for name, results in rounds.items()
    }


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    with tempfile.TemporaryDirectory(prefix="agentrun-http-bench-") as tmp:
        cluster = LocalCluster(state_dir=Path(tmp))
        try:
            cluster.start()
            kube = Kube(cluster.kubeconfig, Path(cluster.binary("kubectl")))
            install_crds(kube)
            kube.core.create_namespace({"metadata": {"name": NAMESPACE}})
            for name in ("fetched", "watched"):
                kube.custom.create_namespaced_custom_object(
                    "agentrun.dev", "v1alpha1", NAMESPACE, "runs", agent_run(name, "echo")
                )
            result = asyncio.run(bench(str(cluster.kubeconfig), count))
        finally:
            cluster.stop()
    print(json.dumps({"requests_per_kind": count, "cpu_ms": result}, indent=1))


if __name__ == "__main__":
    main()
