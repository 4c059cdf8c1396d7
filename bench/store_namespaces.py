"""How many agent namespaces the bundled object store (versitygw v1.8.0, started alone here) holds
principals for, and what each costs. Namespaces are made one after the other until the server refuses one
or `--namespaces` are made; then what a namespace's request costs with that many (versitygw reads and
evaluates its authorization data on every request of a principal), and whether a blob written again at a
key the collector deleted (a delete marker on the versioned bucket) can be read back.

    PYTHONPATH=hack .venv/bin/python bench/store_namespaces.py [--setup SETUP] [--namespaces 1000]

Set-ups (`--setup`):
- `bucket-per-namespace`: the server as the local control plane runs it (devcluster.objectstore: posix
  backend, metadata in extended attributes, internal IAM) and the principals as the operator makes them
  (agentrun.statestore.principals: two users per namespace, granted in the policy of a bucket of the
  namespace's own); it also times the operator's sweep of the server's principals (ListBuckets and
  every namespace bucket's policy) with that many namespaces;
- `bucket-policy`: the layout before it, for comparison: one bucket, whose one policy holds a statement
  per principal (made here as the operator made them then);
- `bucket-policy-sidecar`: the same with the posix backend's `--sidecar` (metadata in files of their own);
- `standalone-iam`: versitygw's standalone IAM service (`versitygw iam`, a second process the gateway asks
  over a unix socket) with two IAM users per namespace, each with an access key the service makes and an
  inline identity policy granting its namespace's prefix; no bucket policy.

Namespace names are 12 characters (`ns-000000001`), as in docs/state-store.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import obstore
from obstore.store import S3Store

from agentrun.core.store_buckets import namespace_bucket
from agentrun.statestore import StoreRefused, parse_store_url
from agentrun.statestore.principals import POLICY_VERSION, Access, BundledStore, access_key
from agentrun.statestore.sigv4 import signed_request
from devcluster.objectstore import (
    REGION,
    Credentials,
    ObjectStoreProcess,
    prepare_bucket,
    s3_request,
    wait_healthy,
)
from devcluster.processes import free_port, pid_alive, spawn, stop_group

REQUESTS = 40  # per latency sample: puts, then gets, of a namespace's own keys
SETUPS = ("bucket-per-namespace", "bucket-policy", "bucket-policy-sidecar", "standalone-iam")
BASE = "agentrun"


def namespace(number: int) -> str:
    return f"ns-{number:09d}"


class SidecarStore(ObjectStoreProcess):
    """The local control plane's server with its posix backend's metadata in a sidecar directory."""

    def argv(self) -> list[str]:
        argv = super().argv()
        return [*argv[:-1], f"--sidecar={self.data_dir / 'meta'}", argv[-1]]

    def make_dirs(self) -> None:
        super().make_dirs()
        (self.data_dir / "meta").mkdir(exist_ok=True)


class StandaloneIam:
    """versitygw's standalone IAM service, and a gateway that asks it (over a unix socket) who a request's
    access key is and what its identity policies allow. The service makes the access keys."""

    def __init__(self, workdir: Path) -> None:
        self.workdir, self.root = workdir, Credentials.new()
        self.iam_port, self.port = free_port(), free_port()
        self.pids: list[int] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def iam_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.iam_port}"

    def start(self) -> None:
        binary = str(ObjectStoreProcess(self.workdir, self.workdir / "unused.log").binary)
        env = {
            **os.environ,
            "ROOT_ACCESS_KEY_ID": self.root.access_key,
            "ROOT_SECRET_ACCESS_KEY": self.root.secret_key,
        }
        for sub in ("iam-service", "buckets", "versions"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        socket = self.workdir / "iam.sock"
        common = ["--health=/health", f"--region={REGION}", "--quiet"]
        iam = [binary, f"--port=127.0.0.1:{self.iam_port}", *common, "iam"]
        iam += [f"--dir={self.workdir / 'iam-service'}", f"--private-ports={socket}"]
        self._spawn(iam, "iam", env, self.iam_endpoint)
        gateway_env = {
            **env,
            "VGW_IAM_STANDALONE_ACCESS": self.root.access_key,
            "VGW_IAM_STANDALONE_SECRET": self.root.secret_key,
        }
        gateway = [binary, f"--port=127.0.0.1:{self.port}", *common, f"--iam-standalone-endpoint={socket}"]
        gateway += ["posix", f"--versioning-dir={self.workdir / 'versions'}", str(self.workdir / "buckets")]
        self._spawn(gateway, "gateway", gateway_env, self.endpoint)
        prepare_bucket(self.endpoint, self.root, "agentrun")

    def _spawn(self, argv: list[str], name: str, env: dict[str, str], endpoint: str) -> None:
        process = spawn(argv, self.workdir / f"{name}.log", env=env, tie_to_parent=True)
        self.pids.append(process.pid)
        wait_healthy(f"{endpoint}/health", lambda: pid_alive(process.pid), time.monotonic() + 60)

    def stop(self) -> None:
        for pid in reversed(self.pids):
            stop_group(pid, grace_seconds=5)

    def call(self, action: str, **params: str) -> bytes:
        """One call of its IAM API (the AWS IAM query protocol), as its root."""
        form = {"Action": action, "Version": "2010-05-08", **params}
        body = "&".join(f"{k}={quote(v, safe='')}" for k, v in form.items()).encode()
        content_type = {"content-type": "application/x-www-form-urlencoded; charset=utf-8"}
        status, answer = signed_request(
            "POST",
            self.iam_endpoint,
            "/",
            credentials=self.root,
            body=body,
            region=REGION,
            service="iam",
            extra_headers=content_type,
        )
        if status != 200:
            raise StoreRefused(action, params.get("UserName", ""), f"HTTP {status}: {answer[:300]!r}")
        return answer

    def make_user(self, ns: str, access: Access) -> Credentials:
        user = "agentrun." + ns + (".read" if access is Access.READ else "")
        self.call("CreateUser", UserName=user)
        answer = self.call("CreateAccessKey", UserName=user)
        key = re.search(rb"<AccessKeyId>(.*?)</AccessKeyId>", answer)
        secret = re.search(rb"<SecretAccessKey>(.*?)</SecretAccessKey>", answer)
        assert key and secret, answer[:300]
        statement = {
            "Effect": "Allow",
            "Action": access.actions,
            "Resource": [f"arn:aws:s3:::agentrun/{ns}/*"],
        }
        policy = json.dumps({"Version": "2012-10-17", "Statement": [statement]})
        self.call("PutUserPolicy", UserName=user, PolicyName="agentrun-namespace", PolicyDocument=policy)
        return Credentials(key.group(1).decode(), secret.group(1).decode())


def one_bucket_principal(bundled: BundledStore, ns: str, access: Access) -> Credentials:
    """A principal as the operator made them before a bucket per namespace: a statement of the one
    bucket's policy, granting the namespace's prefix there."""
    credentials = Credentials.new(access_key(ns, access))
    bundled.put_user(credentials)
    statement = {
        "Effect": "Allow",
        "Principal": {"AWS": [credentials.access_key]},
        "Action": access.actions,
        "Resource": [f"arn:aws:s3:::{BASE}/{ns}/*"],
    }
    statements = bundled.policy().get("Statement") or []
    bundled.put_policy({"Version": POLICY_VERSION, "Statement": [*statements, statement]})
    return credentials


def request_ms(endpoint: str, credentials: Credentials, ns: str, bucket: str) -> dict[str, float]:
    """Median milliseconds of a put and a get under the namespace's prefix, with its own credentials."""
    puts, gets = [], []
    for i in range(REQUESTS):
        path = f"/{bucket}/{ns}/run/sha256/{i:04d}"
        start = time.perf_counter()
        status, body = s3_request("PUT", endpoint, path, body=b"x" * 64, credentials=credentials)
        puts.append(time.perf_counter() - start)
        if status != 200:
            raise SystemExit(f"{ns}'s own put answered HTTP {status}: {body[:200]!r}")
        start = time.perf_counter()
        status, body = s3_request("GET", endpoint, path, credentials=credentials)
        gets.append(time.perf_counter() - start)
        if status != 200:
            raise SystemExit(f"{ns}'s own get answered HTTP {status}: {body[:200]!r}")
    return {
        "putMs": round(statistics.median(puts) * 1000, 2),
        "getMs": round(statistics.median(gets) * 1000, 2),
    }


def isolation(
    endpoint: str, own: str, mine: Credentials, other: str, bucket_of: Callable[[str], str]
) -> dict[str, int]:
    """What the namespace's write principal is answered: its own prefix, the other's, delete, list."""

    def status(method: str, key: str, body: bytes = b"", query: str = "") -> int:
        bucket = bucket_of(key.split("/", maxsplit=1)[0] or own)
        path = f"/{bucket}/{key}" if key else f"/{bucket}"
        return s3_request(method, endpoint, path, body=body, query=query, credentials=mine)[0]

    return {
        "putOwn": status("PUT", f"{own}/iso", b"mine"),
        "getOwn": status("GET", f"{own}/iso"),
        "getOther": status("GET", f"{other}/iso"),
        "putOther": status("PUT", f"{other}/iso-planted", b"forged"),
        "deleteOwn": status("DELETE", f"{own}/iso"),
        "listBucket": status("GET", ""),
        "listOwnPrefix": status("GET", "", query=f"list-type=2&prefix={own}%2F"),
    }


def rewritten_after_delete(endpoint: str, root: Credentials) -> str:
    """Put a blob, delete it (a delete marker: the bucket is versioned), put it again, read it back:
    what a writer does after the collector took a blob it needs again."""
    store = S3Store(
        "agentrun",
        endpoint=endpoint,
        region=REGION,
        access_key_id=root.access_key,
        secret_access_key=root.secret_key,
        client_options={"allow_http": True},
    )

    async def scenario() -> str:
        await obstore.put_async(store, "probe/rewritten", b"first")
        await obstore.delete_async(store, "probe/rewritten")
        await obstore.put_async(store, "probe/rewritten", b"again")
        try:
            found = await obstore.get_async(store, "probe/rewritten")
        except FileNotFoundError:
            return "not found (the put answered 200)"
        return "read back" if bytes(await found.bytes_async()) == b"again" else "other content"

    return asyncio.run(scenario())


def measure(setup: str, limit: int, workdir: Path) -> dict[str, Any]:
    standalone: StandaloneIam | None = None
    server: ObjectStoreProcess | None = None
    bucket_of: Callable[[str], str] = lambda ns: BASE  # noqa: E731
    if setup == "standalone-iam":
        standalone = StandaloneIam(workdir)
        standalone.start()
        endpoint, root = standalone.endpoint, standalone.root
        make: Callable[[str, Access], Credentials] = standalone.make_user
        argv = "two processes: `versitygw iam` and a gateway with --iam-standalone-endpoint"
    else:
        kind = SidecarStore if setup == "bucket-policy-sidecar" else ObjectStoreProcess
        server = kind(workdir / "data", workdir / "versitygw.log")
        server.start()
        endpoint, root = server.endpoint, server.credentials
        bundled = BundledStore(parse_store_url(server.url), server.credentials)
        if setup == "bucket-per-namespace":
            make = lambda ns, access: bundled.ensure(ns, access, None)  # noqa: E731
            bucket_of = lambda ns: namespace_bucket(BASE, ns)  # noqa: E731
        else:
            make = lambda ns, access: one_bucket_principal(bundled, ns, access)  # noqa: E731
        argv = " ".join(server.argv()[1:]).replace(str(workdir), "WORKDIR")
    try:
        made, refused, writers = 0, "", {}
        at_one: dict[str, float] = {}
        make_ms: list[float] = []
        began = time.perf_counter()
        for number in range(1, limit + 1):
            ns = namespace(number)
            start = time.perf_counter()
            try:
                writers[ns] = make(ns, Access.WRITE)
                make(ns, Access.READ)
            except StoreRefused as error:
                refused = f"{ns}: {str(error)[:240]}"
                break
            make_ms.append((time.perf_counter() - start) * 1000)
            made = number
            if number == 1:
                at_one = request_ms(endpoint, writers[ns], ns, bucket_of(ns))
        total_s = time.perf_counter() - began
        first, last = namespace(1), namespace(made)
        result: dict[str, Any] = {
            "setup": setup,
            "server": argv,
            "namespacesMade": made,
            "refused": refused,
            "makeSeconds": round(total_s, 2),
            "makeLastTenMedianMs": round(statistics.median(make_ms[-10:]), 1),
            "requestsWithOneNamespace": at_one,
            f"requestsWith{made}Namespaces": request_ms(endpoint, writers[first], first, bucket_of(first)),
            f"requestsOfTheLastWith{made}Namespaces": request_ms(
                endpoint, writers[last], last, bucket_of(last)
            ),
            "isolation": isolation(endpoint, first, writers[first], last, bucket_of),
            "blobWrittenAgainAfterDelete": rewritten_after_delete(endpoint, root),
        }
        if server is not None:
            policy = bundled.policy(bucket_of(last))
            result["policyBytes"] = len(json.dumps(policy, separators=(",", ":")))
            result["policyStatements"] = len(policy.get("Statement") or [])
        if setup == "bucket-per-namespace":
            start = time.perf_counter()
            held = bundled.principals()  # what the operator's sweep reads, every 5 minutes
            result["principalSweepSeconds"] = round(time.perf_counter() - start, 2)
            assert all(held.complete(namespace(n)) for n in range(1, made + 1)), "a namespace is incomplete"
        return result
    finally:
        if server is not None:
            server.stop()
        if standalone is not None:
            standalone.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--setup", choices=SETUPS, default=SETUPS[0])
    parser.add_argument("--namespaces", type=int, default=1000, help="stop after this many (default 1000)")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="store-namespaces-") as tmp:
        result = measure(args.setup, args.namespaces, Path(tmp))
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
