"""What the benchmarks share: a control plane with the CRDs and the operator, timed watches, the API server's
request counters, /proc figures of a process, and concurrent object creation.

Times are taken by this process (one monotonic clock) when a watch event arrives, so every latency
includes watch delivery to this process, as a user's `kubectl get -w` would see it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config
from prometheus_client.parser import text_string_to_metric_families

from agentrun.kubeapi import ApiError, KubeApi, load_configuration
from agentrun.rbac import AGENT_ACCOUNT_PATCH, attempt_role
from devcluster import security
from devcluster.cluster import REPO_ROOT, LocalCluster
from devcluster.operator import OperatorProcess
from devcluster.processes import free_port
from support.agentrun import install_crds
from support.kube import Kube, wait_for

JsonDict = dict[str, Any]
GROUP, VERSION = "agentrun.dev", "v1alpha1"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def percentile(values: Iterable[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def median(values: Iterable[float]) -> float:
    return percentile(values, 0.5)


# --- /proc ---------------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """user + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def load1() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


# --- the API server's request counters ----------------------------------------------------------------

RequestKey = tuple[str, str, str]  # (verb, resource[/subresource], code class)


def api_requests(kube: Kube) -> Counter[RequestKey]:
    """apiserver_request_total by (verb, resource/subresource, code class: 2xx, 4xx ...); WATCH excluded."""
    response = kube.api_client.call_api(
        "/metrics", "GET", auth_settings=["BearerToken"], _preload_content=False, _return_http_data_only=True
    )
    text = response.data.decode()
    counts: Counter[RequestKey] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            if sample.name != "apiserver_request_total":
                continue
            labels = sample.labels
            verb = labels.get("verb", "")
            if verb in ("WATCH", "CONNECT"):
                continue
            resource = labels.get("resource", "") or "-"
            if labels.get("subresource"):
                resource += "/" + labels["subresource"]
            code = labels.get("code", "")[:1] + "xx"
            counts[(verb, resource, code)] += int(sample.value)
    return counts


def request_delta(after: Counter[RequestKey], before: Counter[RequestKey]) -> Counter[RequestKey]:
    return Counter({k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0})


def by_verb_resource(delta: Counter[RequestKey]) -> Counter[tuple[str, str]]:
    out: Counter[tuple[str, str]] = Counter()
    for (verb, resource, _), n in delta.items():
        out[(verb, resource)] += n
    return out


# --- timed watches ------------------------------------------------------------------------------------


class Recorder:
    """Watches one collection from now on and records what `extract` keeps of each event, with the time
    it arrived. The stream is read raw (no model deserialisation), so it keeps up with thousands of Runs.
    """

    def __init__(
        self, configuration: client.Configuration, path: str, extract: Callable[[str, JsonDict], Any]
    ) -> None:
        self.api_client = client.ApiClient(configuration)
        self.path = path
        self.extract = extract
        self.events: list[tuple[float, Any]] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.lost = 0
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"watch {path}")

    def start(self) -> Recorder:
        self._rv = self._list_rv()
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()

    def _list_rv(self) -> str:
        listing = self.api_client.call_api(
            self.path,
            "GET",
            query_params=[("limit", "1")],
            auth_settings=["BearerToken"],
            response_type="object",
            _return_http_data_only=True,
        )
        return str(listing["metadata"]["resourceVersion"])

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                response = self.api_client.call_api(
                    self.path,
                    "GET",
                    query_params=[
                        ("watch", "true"),
                        ("resourceVersion", self._rv),
                        ("allowWatchBookmarks", "true"),
                        ("timeoutSeconds", "1800"),
                    ],
                    auth_settings=["BearerToken"],
                    _preload_content=False,
                    _return_http_data_only=True,
                    _request_timeout=1900,
                )
                buffer = b""
                for chunk in response.stream(65536, decode_content=True):
                    buffer += chunk
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        if line.strip():
                            self._event(json.loads(line))
                    if self.stopping.is_set():
                        return
            except Exception as exc:
                if self.stopping.is_set():
                    return
                log(f"watch {self.path} interrupted ({exc}); resuming")
                time.sleep(0.5)

    def _event(self, event: JsonDict) -> None:
        now = time.monotonic()
        kind, obj = event["type"], event["object"]
        if kind == "ERROR":
            if obj.get("code") == 410:
                self.lost += 1
                self._rv = self._list_rv()
            return
        self._rv = obj["metadata"]["resourceVersion"]
        if kind == "BOOKMARK":
            return
        kept = self.extract(kind, obj)
        if kept is not None:
            with self.lock:
                self.events.append((now, kept))

    def snapshot(self) -> list[tuple[float, Any]]:
        with self.lock:
            return list(self.events)


def first_times(events: list[tuple[float, Any]], predicate: Callable[[Any], str | None]) -> dict[str, float]:
    """name -> time of the first event for which predicate returns that name."""
    out: dict[str, float] = {}
    for t, kept in events:
        name = predicate(kept)
        if name is not None and name not in out:
            out[name] = t
    return out


# --- the cluster ---------------------------------------------------------------------------------------


def versions() -> dict[str, str]:
    out = subprocess.run(
        ["bash", str(REPO_ROOT / "hack" / "build-control-plane.sh"), "print-versions"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    found = dict(part.split("=", 1) for part in out)
    commit = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    found["agentrun"] = commit + (" (with uncommitted changes)" if dirty else "")
    found["python"] = sys.version.split()[0]
    return found


def machine() -> dict[str, str]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown",
    )
    mem_kib = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    return {
        "nproc": str(os.cpu_count()),
        "memory": f"{mem_kib / 1024 / 1024:.1f} GiB",
        "cpu": cpu,
        "kernel": os.uname().release,
    }


@dataclass
class Bench:
    """A local control plane with the agentrun CRDs and the operator (cluster-wide, no DEBUG logs)."""

    state_dir: Path
    instant: bool
    controller_manager_flags: list[str] = field(default_factory=list)
    apiserver_flags: list[str] = field(default_factory=list)
    # The admission policies of agentrun.admission, installed as a Helm install has them; off only to
    # measure what they cost.
    policies: bool = True
    # The operator told the cluster's object store (finished Runs' indexes and archives go there); each
    # namespace() then holds the store Secret of its own principal.
    store: bool = False
    cluster: LocalCluster = field(init=False)
    kube: Kube = field(init=False)
    operator: OperatorProcess = field(init=False)
    metrics_port: int = 0

    def start(self) -> Bench:
        self.cluster = LocalCluster(
            state_dir=self.state_dir / "cluster",
            instant=self.instant,
            controller_manager_flags=self.controller_manager_flags,
            apiserver_flags=self.apiserver_flags,
        )
        self.cluster.start()
        self.kube = Kube(self.cluster.kubeconfig, Path(self.cluster.binary("kubectl")))
        install_crds(self.kube)
        operator_kubeconfig = self.cluster.kubeconfig
        if self.policies:
            operator_kubeconfig = security.install(
                self.cluster.binary("kubectl"),
                self.cluster.kubeconfig,
                self.state_dir / "operator.kubeconfig",
            )
        self.metrics_port = free_port()
        self.operator = OperatorProcess(
            operator_kubeconfig,
            self.state_dir / "operator.log",
            env={
                "AGENTRUN_METRICS_PORT": str(self.metrics_port),
                **security.OPERATOR_ENV,
                # without the policies (a measure of their cost) the operator is told not to require them
                **({} if self.policies else {"AGENTRUN_REQUIRE_ADMISSION_POLICIES": "false"}),
                **(
                    security.state_store_operator_env(self.cluster.state_store_url)
                    | self.cluster.state_store_env()
                    if self.store
                    else {}
                ),
            },
            verbose=False,
        )
        self.operator.start()
        self.operator.wait_ready()
        return self

    def stop(self) -> None:
        if hasattr(self, "operator"):
            self.operator.stop()
        if hasattr(self, "cluster"):
            self.cluster.stop()

    def configuration(self, threads: int = 16) -> client.Configuration:
        """The official client's configuration (the blocking Recorder's), with `threads` connections."""
        configuration = client.Configuration()
        config.load_kube_config(config_file=str(self.cluster.kubeconfig), client_configuration=configuration)
        configuration.connection_pool_maxsize = threads
        return configuration

    def api(self, threads: int = 16) -> KubeApi:
        return KubeApi(load_configuration(str(self.cluster.kubeconfig)), threads=threads)

    def pid(self, component: str) -> int:
        return next(c.pid for c in self.cluster.components if c.name == component)

    def namespace(self, name: str) -> str:
        """A namespace whose default service account may do what an attempt Pod does."""
        self.kube.core.create_namespace({"metadata": {"name": name}})
        wait_for(
            lambda: (
                self.kube.core.list_namespaced_service_account(
                    name, field_selector="metadata.name=default"
                ).items
            ),
            timeout=30,
            what=f"default service account in {name}",
        )
        self.kube.core.patch_namespaced_service_account("default", name, AGENT_ACCOUNT_PATCH)
        self.kube.rbac.create_namespaced_role(name, attempt_role(name))
        self.kube.rbac.create_namespaced_role_binding(
            name,
            {
                "metadata": {"name": "agentrun-attempt"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "agentrun-attempt",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": name}],
            },
        )
        if self.store:
            secret = security.state_store_secret(name, self.cluster.namespace_store_env(name))
            self.kube.core.create_namespaced_secret(name, secret)
        return name

    def requests(self) -> Counter[RequestKey]:
        return api_requests(self.kube)

    def recorder(self, path: str, extract: Callable[[str, JsonDict], Any]) -> Recorder:
        return Recorder(self.configuration(2), path, extract).start()

    def restart_operator(self) -> None:
        self.operator.stop()
        self.operator.start()
        self.operator.wait_ready(timeout=120)


@contextmanager
def scratch_cluster(prefix: str, namespace: str) -> Iterator[tuple[LocalCluster, Kube]]:
    """A control plane of its own in a temporary directory, with the CRDs and `namespace`, no operator;
    stopped on the way out."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        cluster = LocalCluster(state_dir=Path(tmp) / "cluster")
        cluster.start()
        try:
            kube = Kube(cluster.kubeconfig, Path(cluster.binary("kubectl")))
            install_crds(kube)
            kube.core.create_namespace({"metadata": {"name": namespace}})
            yield cluster, kube
        finally:
            cluster.stop()


def runs_path(ns: str | None = None) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/runs" if ns else f"/apis/{GROUP}/{VERSION}/runs"


async def create_all(
    api: KubeApi, path: str, bodies: Iterable[JsonDict], concurrency: int = 16
) -> dict[str, float]:
    """Creates every body (at most `concurrency` in flight); name -> when its create request was sent."""
    sent: dict[str, float] = {}
    gate = asyncio.Semaphore(concurrency)

    async def one(body: JsonDict) -> None:
        async with gate:
            sent[body["metadata"]["name"]] = time.monotonic()
            for attempt in range(5):
                try:
                    await api.create(path, body)
                    return
                except ApiError as exc:
                    if exc.status not in (429, 500, 503, 504) or attempt == 4:
                        raise
                    await asyncio.sleep(0.2)

    await asyncio.gather(*(one(b) for b in bodies))
    return sent


def wait_until(probe: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
