"""The local control plane: the object store (versitygw, for agent state), etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and the node agent.

``LocalCluster.start()`` generates the PKI, starts every component on free loopback ports, waits until
each is healthy and the node is Ready, and writes ``<state dir>/kubeconfig`` for an admin
(system:masters). ``stop()`` stops them in reverse order. A detached cluster (``make cluster``) records
its processes in ``<state dir>/state.json`` so ``make cluster-down`` can stop it from another process.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from . import pki
from .kubeconfig import write_kubeconfig
from .objectstore import Credentials, ObjectStoreError, ObjectStoreProcess
from .processes import free_port, pid_alive, spawn, stop_group

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVICE_CIDR = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
DEFAULT_NODE = "devcluster-node"


def binary_dir() -> Path:
    """Where hack/build-control-plane.sh puts (or would put) the binaries for the pinned versions."""
    if override := os.environ.get("AGENTRUN_BIN_DIR"):
        return Path(override)
    out = subprocess.run(
        ["bash", str(REPO_ROOT / "hack" / "build-control-plane.sh"), "print-bin-dir"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


class ClusterError(RuntimeError):
    pass


@dataclass
class Component:
    name: str
    pid: int
    health_url: str
    log: str


# A port taken between choosing and binding it is retried this many times (see LocalCluster.start).
START_ATTEMPTS = 3


@dataclass
class LocalCluster:
    state_dir: Path
    node_name: str = DEFAULT_NODE
    with_node_agent: bool = True
    # The S3-compatible object store for agent state (devcluster.objectstore), started first.
    with_object_store: bool = True
    # The node agent's instant mode (nodeagent/instant.py): no process per Pod, for benchmarks.
    instant: bool = False
    # Added to kube-controller-manager's command line (e.g. ["--kube-api-qps=200"] in a benchmark).
    controller_manager_flags: list[str] = field(default_factory=list)
    # Added to kube-apiserver's command line, after its own flags (e.g. ["--profiling=true"]: the last wins).
    apiserver_flags: list[str] = field(default_factory=list)
    bin_dir: Path = field(default_factory=binary_dir)
    components: list[Component] = field(default_factory=list)
    api_port: int = 0
    object_store: ObjectStoreProcess | None = None
    # How each component was started (argv, env, tied to this process), for restart_component().
    _launches: dict[str, tuple[list[str], dict[str, str] | None, bool]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def pki_dir(self) -> Path:
        return self.state_dir / "pki"

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def state_store_env_file(self) -> Path:
        """`source` it: AGENTRUN_STATE_STORE_URL and the store's credentials (AWS_* variables)."""
        return self.state_dir / "state-store.env"

    @property
    def state_store_url(self) -> str:
        """The agent-state store URL (agentrun.statestore) of the object store this cluster runs."""
        if self.object_store is None:
            raise ClusterError("this cluster runs no object store (with_object_store=False)")
        return self.object_store.url

    def state_store_env(self) -> dict[str, str]:
        """The store's credentials as a client reads them from its environment (AWS_* variables)."""
        if self.object_store is None:
            raise ClusterError("this cluster runs no object store (with_object_store=False)")
        return self.object_store.env()

    def namespace_store_env(self, namespace: str) -> dict[str, str]:
        """The credentials of `namespace`'s own principal on the store (AWS_* variables): get and put under
        the namespace's prefix, in its own bucket, only; made on first use (with the bucket); what its
        state-store Secret holds."""
        if self.object_store is None:
            raise ClusterError("this cluster runs no object store (with_object_store=False)")
        return self.object_store.namespace_credentials(namespace).env()

    def namespace_store_url(self, namespace: str) -> str:
        """The URL of `namespace`'s own bucket on the store (what its Pods and its Secrets are given)."""
        if self.object_store is None:
            raise ClusterError("this cluster runs no object store (with_object_store=False)")
        return self.object_store.namespace_url(namespace)

    def prepare_namespace_bucket(self, namespace: str) -> None:
        """`namespace`'s bucket on the store, versioned, without principals (nothing without a store)."""
        if self.object_store is not None:
            self.object_store.prepare_namespace_bucket(namespace)

    def forget_namespace_store(self, namespace: str) -> None:
        """`namespace`'s principals on the store are granted nothing any more and deleted (see
        principals.BundledStore.take_back)."""
        if self.object_store is not None:
            self.object_store.forget_namespace(namespace)

    def binary(self, name: str) -> str:
        path = self.bin_dir / name
        if not os.access(path, os.X_OK):
            raise ClusterError(
                f"{path} is missing: build the control plane first with `bash hack/build-control-plane.sh` "
                "(or `make binaries`)"
            )
        return str(path)

    # ---- lifecycle -------------------------------------------------------------------------------------

    def start(self, *, detached: bool = False, timeout_seconds: float = 180.0) -> None:
        """Starts every component and waits for health. Raises ClusterError with the log tail on failure.

        Ports are chosen free, then bound by the component a moment later: another process on the machine
        (another cluster starting) can take one in between. Such a start is made again on new ports."""
        if self.running():
            raise ClusterError(f"a cluster from {self.state_dir} is already running; stop it first")
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self._start(detached=detached, timeout_seconds=timeout_seconds)
                return
            except ClusterError as exc:
                self.stop()
                if "address already in use" not in str(exc) or attempt == START_ATTEMPTS:
                    raise

    def _start(self, *, detached: bool, timeout_seconds: float) -> None:
        tie = not detached
        self._reset_runtime_state()
        ca = pki.CertificateAuthority(self.pki_dir)
        sa_key, sa_pub = pki.service_account_keys(self.pki_dir)
        serving_cert, serving_key = ca.serving_cert(
            "apiserver",
            ["kubernetes", "kubernetes.default", "kubernetes.default.svc", "localhost"],
            ["127.0.0.1", "10.0.0.1"],
        )
        self.api_port = free_port()
        configs = {
            identity.file_stem: write_kubeconfig(
                self.state_dir / "kubeconfigs" / f"{identity.file_stem}.yaml",
                self.server,
                ca.cert_path,
                identity.common_name,
                client_cert=cert,
                client_key=key,
            )
            for identity in (pki.CONTROLLER_MANAGER, pki.SCHEDULER, pki.node_identity(self.node_name))
            for cert, key in [ca.client_cert(identity)]
        }
        admin_cert, admin_key = ca.client_cert(pki.ADMIN)
        kubelet_client_cert, kubelet_client_key = ca.client_cert(pki.KUBELET_CLIENT)
        deadline = time.monotonic() + timeout_seconds
        if self.with_object_store:
            self._start_object_store(tie, deadline)

        etcd_port, etcd_peer_port = free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        self._launch(
            "etcd",
            [
                self.binary("etcd"),
                "--name=devcluster",
                f"--data-dir={self.state_dir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{etcd_peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer_port}",
                f"--initial-cluster=devcluster=http://127.0.0.1:{etcd_peer_port}",
                # A throw-away development store: durability across power loss is not worth the fsyncs.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
            f"{etcd_url}/health",
            tie,
        )
        self._wait_healthy(self.components[-1], deadline)

        self._launch(
            "kube-apiserver",
            [
                self.binary("kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.api_port}",
                f"--tls-cert-file={serving_cert}",
                f"--tls-private-key-file={serving_key}",
                f"--client-ca-file={ca.cert_path}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={sa_pub}",
                f"--service-account-signing-key-file={sa_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                "--profiling=false",
                f"--cert-dir={self.state_dir / 'apiserver-certs'}",
                # pods/log is proxied to the node agent's containerLogs endpoint, at the Node's InternalIP
                f"--kubelet-client-certificate={kubelet_client_cert}",
                f"--kubelet-client-key={kubelet_client_key}",
                f"--kubelet-certificate-authority={ca.cert_path}",
                "--kubelet-preferred-address-types=InternalIP",
                *self.apiserver_flags,
            ],
            f"{self.server}/readyz",
            tie,
        )
        write_kubeconfig(
            self.kubeconfig, self.server, ca.cert_path, "admin", client_cert=admin_cert, client_key=admin_key
        )
        self._wait_healthy(self.components[-1], deadline)

        cm_port, sched_port = free_port(), free_port()
        cm_kubeconfig = configs[pki.CONTROLLER_MANAGER.file_stem]
        self._launch(
            "kube-controller-manager",
            [
                self.binary("kube-controller-manager"),
                *_delegated_auth(cm_kubeconfig),
                "--bind-address=127.0.0.1",
                f"--secure-port={cm_port}",
                f"--cert-dir={self.state_dir / 'controller-manager-certs'}",
                f"--service-account-private-key-file={sa_key}",
                f"--root-ca-file={ca.cert_path}",
                "--use-service-account-credentials=true",
                "--leader-elect=false",
                "--controllers=*",
                *self.controller_manager_flags,
            ],
            f"https://127.0.0.1:{cm_port}/healthz",
            tie,
        )
        sched_kubeconfig = configs[pki.SCHEDULER.file_stem]
        self._launch(
            "kube-scheduler",
            [
                self.binary("kube-scheduler"),
                *_delegated_auth(sched_kubeconfig),
                "--bind-address=127.0.0.1",
                f"--secure-port={sched_port}",
                f"--cert-dir={self.state_dir / 'scheduler-certs'}",
                "--leader-elect=false",
            ],
            f"https://127.0.0.1:{sched_port}/healthz",
            tie,
        )
        if self.with_node_agent:
            node_kubeconfig = configs[pki.node_identity(self.node_name).file_stem]
            kubelet_cert, kubelet_key = ca.serving_cert(
                f"kubelet-{self.node_name}", [self.node_name, "localhost"], ["127.0.0.1"]
            )
            self._launch(
                "node-agent",
                [
                    sys.executable,
                    "-m",
                    "devcluster.nodeagent",
                    f"--kubeconfig={node_kubeconfig}",
                    f"--node-name={self.node_name}",
                    f"--state-dir={self.state_dir / 'node'}",
                    f"--serving-cert={kubelet_cert}",
                    f"--serving-key={kubelet_key}",
                    f"--client-ca={ca.cert_path}",
                    *(["--instant"] if self.instant else []),
                ],
                "",
                tie,
                env={**os.environ, "PYTHONPATH": _pythonpath_with(REPO_ROOT / "hack")},
            )
        for component in self.components:
            self._wait_healthy(component, deadline)
        self._save_state()
        if self.with_node_agent:
            self._wait_node_ready(deadline)

    def _start_object_store(self, tie: bool, deadline: float) -> None:
        store = ObjectStoreProcess(
            self.state_dir / "object-store", self.state_dir / "logs" / "object-store.log", tie_to_parent=tie
        )
        try:
            argv = store.argv()
        except ObjectStoreError as exc:
            raise ClusterError(str(exc)) from None
        store.make_dirs()
        self._launch("object-store", argv, store.health_url, tie, env=store.process_env())
        self._wait_healthy(self.components[-1], deadline)
        try:
            store.prepare()
        except ObjectStoreError as exc:
            raise ClusterError(f"object store: {exc}\n{_tail(str(store.log_path))}") from None
        self.object_store = store
        store.write_env_file(self.state_store_env_file)

    def stop(self) -> None:
        """Stops every component, newest first, and forgets them."""
        for component in reversed(self.components):
            stop_group(component.pid)
        self.components.clear()
        self.state_file.unlink(missing_ok=True)

    def restart_component(self, name: str, timeout_seconds: float = 120.0) -> Component:
        """Stops one component (its whole process group) and starts it again with the same command line,
        hence the same port, flags and data directory, then waits until it is healthy again. For fault
        injection (bench/chaos.py), e.g. ``restart_component("kube-apiserver")``. Call it from the main
        thread: a component tied to its parent dies with the thread that started it."""
        found = [(i, c) for i, c in enumerate(self.components) if c.name == name]
        if not found:
            raise ClusterError(f"no component named {name!r} (have {[c.name for c in self.components]})")
        if name not in self._launches:
            raise ClusterError(f"{name} was not started by this LocalCluster object: cannot restart it")
        index, old = found[0]
        argv, env, tie = self._launches[name]
        stop_group(old.pid)
        proc = spawn(argv, Path(old.log), env=env, tie_to_parent=tie)
        component = Component(name, proc.pid, old.health_url, old.log)
        self.components[index] = component
        if self.state_file.exists():
            self._save_state()
        self._wait_healthy(component, time.monotonic() + timeout_seconds)
        return component

    def running(self) -> bool:
        return any(pid_alive(c.pid) for c in self.components)

    @classmethod
    def attach(cls, state_dir: Path) -> LocalCluster:
        """The cluster recorded in state_dir by a detached start (possibly no longer running)."""
        state = json.loads((state_dir / "state.json").read_text())
        cluster = cls(state_dir=state_dir, node_name=state["nodeName"], bin_dir=Path(state["binDir"]))
        cluster.api_port = state["apiPort"]
        cluster.components = [Component(**c) for c in state["components"]]
        if store := state.get("objectStore"):
            cluster.object_store = ObjectStoreProcess(
                Path(store["dataDir"]),
                Path(store["log"]),
                port=store["port"],
                credentials=_env_file_credentials(cluster.state_store_env_file),
                binary=Path(store["binary"]),
                tie_to_parent=False,
            )
        return cluster

    # ---- internals -------------------------------------------------------------------------------------

    def _reset_runtime_state(self) -> None:
        # Each start is a fresh cluster: old etcd data would resurrect objects from an earlier session.
        for sub in ("etcd", "node", "logs", "kubeconfigs", "object-store"):
            shutil.rmtree(self.state_dir / sub, ignore_errors=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)

    def _launch(
        self,
        name: str,
        argv: list[str],
        health_url: str,
        tie: bool,
        env: dict[str, str] | None = None,
    ) -> None:
        log = self.state_dir / "logs" / f"{name}.log"
        proc = spawn(argv, log, env=env, tie_to_parent=tie)
        self.components.append(Component(name, proc.pid, health_url, str(log)))
        self._launches[name] = (list(argv), env, tie)

    def _save_state(self) -> None:
        state: dict[str, object] = {
            "apiPort": self.api_port,
            "nodeName": self.node_name,
            "binDir": str(self.bin_dir),
            "components": [vars(c) for c in self.components],
        }
        if self.object_store is not None:
            store = self.object_store
            # the credentials stay in the 0600 env file, not here
            state["objectStore"] = {
                "url": store.url,
                "port": store.port,
                "dataDir": str(store.data_dir),
                "log": str(store.log_path),
                "binary": str(store.binary),
            }
        self.state_file.write_text(json.dumps(state, indent=2))

    def _wait_healthy(self, component: Component, deadline: float) -> None:
        while True:
            if not pid_alive(component.pid):
                raise ClusterError(f"{component.name} exited during start-up\n{_tail(component.log)}")
            if not component.health_url or self._probe(component.health_url):
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"{component.name} not healthy in time\n{_tail(component.log)}")
            time.sleep(0.1)

    def admin_tls(self) -> ssl.SSLContext:
        """A TLS context that verifies our API server with our CA and presents the admin certificate."""
        context = ssl.create_default_context(cafile=str(self.pki_dir / "ca.crt"))
        context.load_cert_chain(self.pki_dir / "admin.crt", self.pki_dir / "admin.key")
        return context

    def _probe(self, url: str) -> bool:
        context = None
        if url.startswith("https://"):
            # Our API server is verified with our CA and the admin certificate; the controller-manager and
            # scheduler serve self-signed health endpoints that allow anonymous access.
            context = self.admin_tls() if url.startswith(self.server) else ssl._create_unverified_context()
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def _wait_node_ready(self, deadline: float) -> None:
        kubectl = [self.binary("kubectl"), f"--kubeconfig={self.kubeconfig}"]
        while True:
            out = subprocess.run(
                [
                    *kubectl,
                    "get",
                    "node",
                    self.node_name,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if out.stdout.strip() == "True":
                return
            agent = next(c for c in self.components if c.name == "node-agent")
            if not pid_alive(agent.pid):
                raise ClusterError(f"node agent exited during start-up\n{_tail(agent.log)}")
            if time.monotonic() > deadline:
                raise ClusterError(f"node {self.node_name} not Ready in time\n{_tail(agent.log)}")
            time.sleep(0.2)


def _env_file_credentials(path: Path) -> Credentials:
    values = dict(
        line.removeprefix("export ").split("=", 1) for line in path.read_text().splitlines() if "=" in line
    )
    return Credentials(values["AWS_ACCESS_KEY_ID"].strip("'"), values["AWS_SECRET_ACCESS_KEY"].strip("'"))


def _delegated_auth(kubeconfig: Path) -> list[str]:
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
    ]


def _pythonpath_with(extra: Path) -> str:
    parts = [str(extra), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return os.pathsep.join(dict.fromkeys(parts))


def _tail(log_path: str, lines: int = 30) -> str:
    try:
        return "\n".join(Path(log_path).read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"
