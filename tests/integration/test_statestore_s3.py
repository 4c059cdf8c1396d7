"""The state store against a real S3-compatible server: versitygw, built from its Go module by
hack/build-versitygw.sh (`make binaries`), as the local control plane runs it. Put/get, put-if-absent
between two writers, a replaced or deleted object caught on read, a stopped server seen as transient
(and the blobs there again once it is back), and the cluster's own store versioned."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import obstore
import pytest
from obstore.store import S3Store

from agentrun.core.blobrestore import Target, verifies, versions_to_try
from agentrun.core.collector import live_address
from agentrun.statestore import (
    BlobRef,
    BlobStore,
    StateUnverifiable,
    StoreRefused,
    StoreRequest,
    StoreTimeouts,
    StoreUnavailable,
)
from agentrun.statestore.operatorstore import OperatorStore
from devcluster.cluster import LocalCluster
from devcluster.objectstore import REGION, Credentials, ObjectStoreProcess, s3_request
from support.kube import wait_for

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "team-a"
RUN_UID = "0b7e3a52-51c4-4c1e-9d0c-6f3f2f8f1a77"
# Fail fast when the server is gone: one retry, a short budget (the error is awaited, not a duration).
QUICK = StoreTimeouts(connect_seconds=1, request_seconds=2, retries=1, retry_budget_seconds=3)
# Every other call: the client's own bounds, ample on a loaded machine, where a request that merely takes
# a while must not be taken for an outage.
PATIENT = StoreTimeouts()


def versitygw_built() -> None:
    # `make test` builds it first (make binaries); building here keeps a bare pytest run working too.
    subprocess.run(["bash", str(REPO / "hack/build-versitygw.sh")], check=True, timeout=1800)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObjectStoreProcess]:
    versitygw_built()
    workdir = tmp_path_factory.mktemp("versitygw")
    process = ObjectStoreProcess(workdir / "data", workdir / "versitygw.log")
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def credentials(server: ObjectStoreProcess, monkeypatch: pytest.MonkeyPatch) -> Credentials:
    """The server's credentials in the environment, where the store's client reads them."""
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    return server.credentials


class Recorder(list[StoreRequest]):
    def __call__(self, request: StoreRequest) -> None:
        self.append(request)


def blob_store(
    server: ObjectStoreProcess, recorder: Recorder | None = None, timeouts: StoreTimeouts = PATIENT
) -> BlobStore:
    return BlobStore.from_url(
        f"s3://{server.bucket}/runs?endpoint={server.endpoint}&region={REGION}",
        observer=recorder,
        timeouts=timeouts,
    )


def hostile_client(server: ObjectStoreProcess) -> S3Store:
    """A writer with the namespace's credentials that does not follow the rules (overwrites, deletes)."""
    return S3Store(
        server.bucket,
        config={"endpoint": server.endpoint, "region": REGION},
        client_options={"allow_http": True},
    )


def test_a_blob_is_written_put_if_absent_and_read_back_verified(
    server: ObjectStoreProcess, credentials: Credentials
) -> None:
    recorder = Recorder()
    store = blob_store(server, recorder)
    data = b"checkpoint " * 5000
    ref = asyncio.run(store.put(NAMESPACE, RUN_UID, data))
    digest = hashlib.sha256(data).hexdigest()
    assert ref == BlobRef(f"runs/{NAMESPACE}/{RUN_UID}/sha256/{digest}", digest, len(data))
    assert asyncio.run(store.get(ref)) == data
    assert [(r.operation, r.outcome) for r in recorder] == [("put", "created"), ("get", "ok")]


def test_two_writers_of_the_same_content_both_get_the_verified_reference(
    server: ObjectStoreProcess, credentials: Credentials
) -> None:
    recorder = Recorder()
    writers = [blob_store(server, recorder), blob_store(server, recorder)]
    data = b"the same superstep, written by two Attempts"

    async def race() -> list[BlobRef]:
        return await asyncio.gather(*(writer.put(NAMESPACE, RUN_UID, data) for writer in writers))

    first, second = asyncio.run(race())
    assert first == second
    assert sorted(r.outcome for r in recorder if r.operation == "put") == ["created", "exists"]
    assert [r.outcome for r in recorder if r.operation == "verify"] == ["ok"]


def test_put_if_absent_never_overwrites_a_blob_planted_at_the_address(
    server: ObjectStoreProcess, credentials: Credentials
) -> None:
    store = blob_store(server, None)
    data = b"what the agent meant to store"
    key = store.key_for(NAMESPACE, RUN_UID, hashlib.sha256(data).hexdigest())
    obstore.put(hostile_client(server), key, b"planted by a hostile Pod")
    with pytest.raises(StateUnverifiable, match=re.escape(key)):
        asyncio.run(store.put(NAMESPACE, RUN_UID, data))
    assert bytes(obstore.get(hostile_client(server), key).bytes()) == b"planted by a hostile Pod"


def test_a_replaced_object_is_detected_on_read_and_its_first_version_kept(
    server: ObjectStoreProcess, credentials: Credentials
) -> None:
    store = blob_store(server, None)
    data = b'{"messages": ["the original"]}'
    ref = asyncio.run(store.put(NAMESPACE, RUN_UID, data))
    forged = data.replace(b"original", b"forgery!")
    assert len(forged) == len(data)
    obstore.put(hostile_client(server), ref.key, forged)
    with pytest.raises(StateUnverifiable, match="with sha256") as unverifiable:
        asyncio.run(store.get(ref))
    assert unverifiable.value.key == ref.key
    # versioning on: the overwritten content is still there for the operator to restore
    status, listing = s3_request(
        "GET",
        server.endpoint,
        f"/{server.bucket}",
        query=f"prefix={ref.key.replace('/', '%2F')}&versions=",
        credentials=credentials,
    )
    assert status == 200, listing
    assert listing.count(b"<Version>") == 2


def test_a_missing_object_is_unverifiable(server: ObjectStoreProcess, credentials: Credentials) -> None:
    store = blob_store(server, None)
    ref = asyncio.run(store.put(NAMESPACE, RUN_UID, b"deleted behind the operator's back"))
    obstore.delete(hostile_client(server), ref.key)
    with pytest.raises(StateUnverifiable, match="no object at this key") as unverifiable:
        asyncio.run(store.get(ref))
    assert unverifiable.value.missing


def test_wrong_credentials_are_refused_not_retried(
    server: ObjectStoreProcess, credentials: Credentials, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-of-this-key")
    with pytest.raises(StoreRefused) as refused:
        asyncio.run(blob_store(server, None).put(NAMESPACE, RUN_UID, b"x"))
    assert "not-the-secret-of-this-key" not in str(refused.value)
    assert credentials.secret_key not in str(refused.value)


def test_a_stopped_server_is_transient_and_nothing_is_lost_when_it_is_back(
    server: ObjectStoreProcess, credentials: Credentials
) -> None:
    recorder = Recorder()
    store = blob_store(server)
    during = blob_store(server, recorder, QUICK)  # the calls made during the outage fail fast
    data = b"written before the outage"
    ref = asyncio.run(store.put(NAMESPACE, RUN_UID, data))
    server.stop()
    try:
        with pytest.raises(StoreUnavailable, match=re.escape(ref.key)):
            asyncio.run(during.get(ref))
        with pytest.raises(StoreUnavailable):
            asyncio.run(during.put(NAMESPACE, RUN_UID, b"written during the outage"))
        assert [(r.operation, r.outcome) for r in recorder][-2:] == [
            ("get", "unavailable"),
            ("put", "unavailable"),
        ]
    finally:
        server.start()
    assert asyncio.run(store.get(ref)) == data


def stopped(pid: int) -> bool:
    """Whether every thread of the process has stopped (a stop signal is delivered to each in turn: a
    thread still running could answer one more request)."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):
            states.append((task / "stat").read_text().rsplit(") ", 1)[1][0])
    return bool(states) and all(state == "T" for state in states)


def test_a_server_that_does_not_answer_in_time_is_transient(
    server: ObjectStoreProcess, credentials: Credentials
) -> None:
    store = blob_store(server)
    ref = asyncio.run(store.put(NAMESPACE, RUN_UID, b"written before the server hung"))
    pid = server.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # the process is there, the port open, no answer comes
    try:
        wait_for(lambda: stopped(pid), timeout=120, what="every thread of the server stopped")
        with pytest.raises(StoreUnavailable, match=r"unavailable during get.*(timed out|timeout)"):
            asyncio.run(blob_store(server, None, QUICK).get(ref))
    finally:
        os.kill(pid, signal.SIGCONT)
    assert asyncio.run(store.get(ref)) == b"written before the server hung"


def test_the_operators_client_lists_quarantines_restores_and_deletes(
    server: ObjectStoreProcess, credentials: Credentials
) -> None:
    recorder = Recorder()
    store = OperatorStore.from_url(
        f"s3://{server.bucket}/collect?endpoint={server.endpoint}&region={REGION}",
        observer=recorder,
        timeouts=PATIENT,
    )
    data = b"a superseded checkpoint's state " * 100
    ref = asyncio.run(store.put(NAMESPACE, RUN_UID, data))
    address = live_address(ref.key.removeprefix("collect/"))
    assert address is not None
    [listed] = asyncio.run(store.list_blobs(NAMESPACE))
    assert (listed.key, listed.size) == (address.key, len(data))
    assert listed.last_modified.tzinfo is not None

    assert asyncio.run(store.quarantine(address))
    with pytest.raises(StateUnverifiable) as gone:
        asyncio.run(store.get(ref))
    assert gone.value.missing
    assert [b.key for b in asyncio.run(store.list_blobs())] == [address.quarantine_key]

    asyncio.run(store.restore(address, len(data)))
    assert asyncio.run(store.get(ref)) == data
    assert [b.key for b in asyncio.run(store.list_blobs())] == [address.key]

    asyncio.run(store.quarantine(address))
    asyncio.run(store.delete(address.quarantine_key))
    assert asyncio.run(store.list_blobs()) == []
    asyncio.run(store.delete(address.quarantine_key))  # idempotent
    seen = {(r.operation, r.outcome) for r in recorder}
    assert {("list", "ok"), ("copy", "ok"), ("delete", "ok")} <= seen


def test_the_content_of_a_collected_blob_can_be_stored_again(
    server: ObjectStoreProcess, credentials: Credentials
) -> None:
    """On a versioned bucket a collected key holds a delete marker, which versitygw v1.8.0 answers with
    412 to put-if-absent: the writer, finding nothing there, writes its content at its own address."""
    collector = OperatorStore.from_url(
        f"s3://{server.bucket}/again?endpoint={server.endpoint}&region={REGION}", timeouts=PATIENT
    )
    recorder = Recorder()
    writer = BlobStore.from_url(
        f"s3://{server.bucket}/again?endpoint={server.endpoint}&region={REGION}",
        observer=recorder,
        timeouts=PATIENT,
    )
    data = b"a message an agent writes again after its first copy was collected"
    ref = asyncio.run(writer.put(NAMESPACE, RUN_UID, data))
    address = live_address(ref.key.removeprefix("again/"))
    assert address is not None
    assert asyncio.run(collector.quarantine(address))
    asyncio.run(collector.delete(address.quarantine_key))

    assert asyncio.run(writer.put(NAMESPACE, RUN_UID, data)) == ref
    assert asyncio.run(writer.get(ref)) == data
    puts = [(r.operation, r.outcome) for r in recorder]
    assert puts[-1] == ("get", "ok") and ("put", "created") in puts[1:]


@pytest.mark.cluster
def test_the_local_control_plane_runs_a_versioned_object_store(
    local_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "object-store" in [c.name for c in local_cluster.components]
    assert local_cluster.state_store_env_file.stat().st_mode & 0o077 == 0
    assert local_cluster.object_store is not None
    for name, value in local_cluster.state_store_env().items():
        monkeypatch.setenv(name, value)
    local_cluster.namespace_store_env(NAMESPACE)  # the namespace's bucket, made as for its Secret
    store = BlobStore.from_url(local_cluster.state_store_url)
    ref = asyncio.run(store.put(NAMESPACE, RUN_UID, b"state of a Run on the local control plane"))
    # a restart (as bench/chaos.py restarts components) keeps the port, the credentials and the blobs
    local_cluster.restart_component("object-store")
    assert asyncio.run(store.get(ref)) == b"state of a Run on the local control plane"
    assert store.bucket_for(ref.key) == f"{local_cluster.object_store.bucket}-{NAMESPACE}"
    for bucket in (local_cluster.object_store.bucket, store.bucket_for(ref.key)):  # base, namespace's
        status, body = s3_request(
            "GET",
            local_cluster.object_store.endpoint,
            f"/{bucket}",
            query="versioning=",
            credentials=local_cluster.object_store.credentials,
        )
        assert status == 200 and b"<Status>Enabled</Status>" in body, (bucket, body)
    local_cluster.forget_namespace_store(NAMESPACE)


def test_the_operators_client_lists_a_keys_versions_and_puts_the_kept_one_back(
    server: ObjectStoreProcess, credentials: Credentials
) -> None:
    """What restoring an overwritten blob stands on (operator.blobrestore): ListObjectVersions signed with
    the operator's credentials, paged; a version read by its id; the content written back and verified."""
    recorder = Recorder()
    store = OperatorStore.from_url(
        f"s3://{server.bucket}/restore?endpoint={server.endpoint}&region={REGION}",
        observer=recorder,
        timeouts=PATIENT,
    )
    data = b'{"messages": ["the original, restored"]}'
    ref = asyncio.run(store.put(NAMESPACE, RUN_UID, data))
    forged = data.replace(b"original", b"forgery!")
    hostile = hostile_client(server)
    obstore.put(hostile, ref.key, forged)
    obstore.put(hostile, ref.key, data[:10])
    obstore.delete(hostile, ref.key)  # a delete marker on top (the namespace's principal cannot; root can)

    versions = asyncio.run(store.versions(ref.key))
    assert [(v.delete_marker, v.size) for v in versions] == [
        (True, 0),
        (False, 10),
        (False, len(forged)),
        (False, len(data)),
    ], versions
    assert [v.latest for v in versions] == [True, False, False, False]
    # versitygw v1.8.0 answers the page of the markers it gave again: refused, never looped on
    with pytest.raises(StoreRefused, match="paging does not move on"):
        asyncio.run(store.versions(ref.key, page_size=1))

    target = Target(ref.key, ref.sha256, ref.size)
    tried = versions_to_try(target, versions)
    assert tried == (versions[2].version_id, versions[3].version_id)
    read = [asyncio.run(store.get_version(ref.key, version)) for version in tried]
    assert read == [forged, data]
    assert [verifies(target, each) for each in read] == [False, True]

    asyncio.run(store.put_back(ref, read[1]))
    assert asyncio.run(store.get(ref)) == data
    [current] = [v for v in asyncio.run(store.versions(ref.key)) if v.latest]
    assert (current.delete_marker, current.size) == (False, len(data))
    with pytest.raises(StateUnverifiable):  # never claims what it cannot read back verified
        asyncio.run(store.put_back(ref, forged))
    seen = {(r.operation, r.outcome) for r in recorder}
    assert {("list", "ok"), ("get", "ok"), ("put", "created")} <= seen


def test_listing_versions_with_credentials_the_store_refuses_is_a_refusal(
    server: ObjectStoreProcess, credentials: Credentials, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = OperatorStore.from_url(
        f"s3://{server.bucket}/restore?endpoint={server.endpoint}&region={REGION}", timeouts=PATIENT
    )
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(StoreRefused, match="HTTP 403"):
        asyncio.run(store.versions(store.location.key(NAMESPACE, RUN_UID, "sha256", "a" * 64)))
