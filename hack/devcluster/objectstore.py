"""The local control plane's object store: versitygw (an S3-compatible gateway, one process) on a posix
directory, with bucket versioning on, bound to loopback. The agent-state store of docs/state-store.md.

hack/build-versitygw.sh builds it from its Go module at a pinned version into the binary cache. The root
credentials are made per start and handed to the process through its environment (never its command
line); clients get them from `env()`. The bucket is created, and versioned, once the gateway is healthy,
with signed S3 requests (agentrun.statestore.principals.BundledStore.prepare_bucket, which the chart's
operator runs too). Its internal IAM holds a user per agent namespace (namespace_credentials), granted by
the policy of the namespace's own bucket. Its version, flags and directories are
agentrun.statestore.versitygw's: the chart starts the same server the same way.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Final
from urllib.parse import parse_qsl

from agentrun.core.store_buckets import namespace_url
from agentrun.statestore import StateStoreError, StoreUnavailable, parse_store_url
from agentrun.statestore import versitygw as server
from agentrun.statestore.principals import Access, BundledStore
from agentrun.statestore.sigv4 import S3Credentials, signed_request

from .processes import free_port, pid_alive, spawn, stop_group

Credentials = S3Credentials  # the gateway's root, a namespace's user: an access key and its secret
REPO_ROOT = Path(__file__).resolve().parents[2]
BUCKET: Final = server.BUCKET
REGION: Final = server.REGION
HEALTH_PATH: Final = server.HEALTH_PATH


class ObjectStoreError(RuntimeError):
    pass


def versitygw_binary() -> Path:
    """Where hack/build-versitygw.sh puts (or would put) versitygw at the pinned version."""
    if override := os.environ.get("AGENTRUN_VERSITYGW_BIN"):
        return Path(override)
    out = subprocess.run(
        ["bash", str(REPO_ROOT / "hack" / "build-versitygw.sh"), "print-bin"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


@dataclass
class ObjectStoreProcess:
    """versitygw serving `data_dir` on 127.0.0.1:port. The data outlives a stop: start() again (the same
    port, credentials and directory) and the blobs are there, as after a server restart."""

    data_dir: Path
    log_path: Path
    port: int = field(default_factory=free_port)
    credentials: Credentials = field(default_factory=Credentials.new)
    bucket: str = BUCKET
    binary: Path = field(default_factory=versitygw_binary)
    tie_to_parent: bool = True
    # False: started without its bucket, as the chart's server starts (its operator creates the bucket).
    prepare_at_start: bool = True
    pid: int | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The state store URL (agentrun.statestore): the bucket, the endpoint and the region, and a bucket
        per namespace, as the chart's operator keeps on its bundled server (agentrun.core.store_buckets)."""
        return f"s3://{self.bucket}?endpoint={self.endpoint}&region={REGION}&buckets=namespace"

    def namespace_url(self, namespace: str) -> str:
        """The URL of the namespace's own bucket: what its attempt Pods and its people are given."""
        return namespace_url(self.url, namespace)

    @property
    def health_url(self) -> str:
        return self.endpoint + HEALTH_PATH

    def env(self) -> dict[str, str]:
        """What a client needs besides the URL: the credentials (AWS_* variables)."""
        return self.credentials.env()

    def argv(self) -> list[str]:
        if not os.access(self.binary, os.X_OK):
            raise ObjectStoreError(
                f"{self.binary} is missing: build it with `bash hack/build-versitygw.sh` (or `make binaries`)"
            )
        listen = f"127.0.0.1:{self.port}"
        return [str(self.binary), *server.server_args(listen=listen, data_dir=str(self.data_dir))]

    def process_env(self) -> dict[str, str]:
        """The gateway's environment: its root credentials, not on its command line (`ps` shows that)."""
        return {
            **os.environ,
            server.ROOT_ACCESS_KEY_ENV: self.credentials.access_key,
            server.ROOT_SECRET_KEY_ENV: self.credentials.secret_key,
        }

    def make_dirs(self) -> None:
        for sub in server.DATA_DIRS:
            (self.data_dir / sub).mkdir(parents=True, exist_ok=True)

    def prepare(self) -> None:
        """Once healthy: the bucket exists and is versioned."""
        prepare_bucket(self.endpoint, self.credentials, self.bucket)

    def namespace_credentials(
        self, namespace: str, access: Access = Access.WRITE, held: Credentials | None = None
    ) -> Credentials:
        """The namespace's own principal (get and put under its prefix, or read only), made on first use
        with the namespace's bucket: what the namespace's Secret holds, never the gateway's root."""
        return BundledStore(parse_store_url(self.url), self.credentials).ensure(namespace, access, held)

    def prepare_namespace_bucket(self, namespace: str) -> None:
        """The namespace's bucket exists and is versioned (as the operator makes it when the namespace
        opts in), without its principals: for a namespace whose objects only the root writes."""
        bundled = BundledStore(parse_store_url(self.url), self.credentials)
        bundled.prepare_bucket(bundled.bucket(namespace))

    def forget_namespace(self, namespace: str) -> None:
        """The namespace's principals are granted nothing any more and deleted (its test is over), as an
        operator administering the server does once a namespace is gone (operator.store_principals)."""
        BundledStore(parse_store_url(self.url), self.credentials).take_back(namespace)

    def write_env_file(self, path: Path) -> Path:
        """A file to `source` for a shell that uses the store: its URL and credentials (mode 0600)."""
        values = {"AGENTRUN_STATE_STORE_URL": self.url, **self.env()}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600, exist_ok=True)
        path.chmod(0o600)
        path.write_text("".join(f"export {name}='{value}'\n" for name, value in values.items()))
        return path

    def start(self, timeout_seconds: float = 60.0) -> None:
        self.make_dirs()
        proc = spawn(self.argv(), self.log_path, env=self.process_env(), tie_to_parent=self.tie_to_parent)
        self.pid = proc.pid
        try:
            wait_healthy(self.health_url, lambda: pid_alive(proc.pid), time.monotonic() + timeout_seconds)
            if self.prepare_at_start:
                self.prepare()
        except ObjectStoreError as exc:
            self.stop()
            raise ObjectStoreError(f"{exc}\n{self.log_tail()}") from None

    def stop(self) -> None:
        if self.pid is not None:
            stop_group(self.pid, grace_seconds=5)
            self.pid = None

    def alive(self) -> bool:
        return self.pid is not None and pid_alive(self.pid)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no object store log)"

    def __enter__(self) -> ObjectStoreProcess:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()


def wait_healthy(health_url: str, alive: Callable[[], bool], deadline: float) -> None:
    """Polls the gateway's health endpoint until it answers 200, it exits, or the deadline passes."""
    while True:
        if not alive():
            raise ObjectStoreError("versitygw exited during start-up")
        try:
            with urllib.request.urlopen(health_url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if time.monotonic() > deadline:
            raise ObjectStoreError(f"versitygw not healthy at {health_url} in time")
        time.sleep(0.05)


def prepare_bucket(endpoint: str, credentials: Credentials, bucket: str) -> None:
    """Creates the bucket (already there: fine, e.g. after a restart) and turns its versioning on, as the
    chart's operator does at its start (BundledStore.prepare_bucket)."""
    location = parse_store_url(f"s3://{bucket}?endpoint={endpoint}&region={REGION}")
    try:
        BundledStore(location, credentials).prepare_bucket()
    except StateStoreError as error:
        raise ObjectStoreError(str(error)) from None


def s3_request(
    method: str, endpoint: str, path: str, *, query: str = "", body: bytes = b"", credentials: Credentials
) -> tuple[int, bytes]:
    """One path-style S3 request signed with AWS Signature Version 4; (status, body), errors included.
    `query` is canonical (sorted, encoded, `name=` for a bare name)."""
    params = dict(parse_qsl(query, keep_blank_values=True))
    try:
        return signed_request(
            method, endpoint, path, credentials=credentials, query=params, body=body, region=REGION
        )
    except StoreUnavailable as error:
        raise ObjectStoreError(str(error)) from None
