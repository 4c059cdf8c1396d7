"""Content-addressed blobs on memory:// and file://: put-if-absent, verify on every read, a tampered or
planted blob detected, and the metrics of each request. The same rules against a real S3 server:
tests/integration/test_statestore_s3.py."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from pathlib import Path

import obstore
import pytest
from obstore.exceptions import GenericError, PermissionDeniedError
from obstore.store import MemoryStore
from prometheus_client import CollectorRegistry

from agentrun.operator.storemetrics import StoreMetrics
from agentrun.statestore import (
    BlobRef,
    BlobStore,
    StateUnverifiable,
    StoreRefused,
    StoreRequest,
    StoreUnavailable,
    parse_store_url,
)
from agentrun.statestore.blobs import classify

NAMESPACE = "team-a"
RUN_UID = "3f1c2a9e-8d5b-4c47-9f0e-2b6d7a1c5e34"
DATA = b'{"messages": ["' + b"x" * 40_000 + b'"]}'


class Recorder:
    def __init__(self) -> None:
        self.requests: list[StoreRequest] = []

    def __call__(self, request: StoreRequest) -> None:
        self.requests.append(request)

    def seen(self) -> list[tuple[str, str, int]]:
        return [(r.operation, r.outcome, r.size) for r in self.requests]


def memory_store(
    observer: Recorder | None = None, url: str = "memory://state"
) -> tuple[BlobStore, MemoryStore]:
    raw = MemoryStore()
    return BlobStore(raw, parse_store_url(url), observer), raw


def file_store(root: Path, observer: Recorder | None = None) -> BlobStore:
    return BlobStore.from_url(f"file://{root}", observer=observer)


def test_a_blob_is_stored_at_its_content_address_and_read_back_verified() -> None:
    recorder = Recorder()
    store, _ = memory_store(recorder)
    ref = asyncio.run(store.put(NAMESPACE, RUN_UID, DATA))
    digest = hashlib.sha256(DATA).hexdigest()
    assert ref == BlobRef(f"state/{NAMESPACE}/{RUN_UID}/sha256/{digest}", digest, len(DATA))
    assert asyncio.run(store.get(ref)) == DATA
    assert recorder.seen() == [("put", "created", len(DATA)), ("get", "ok", len(DATA))]


def test_writing_the_same_content_again_verifies_the_blob_there_and_returns_the_same_reference(
    tmp_path: Path,
) -> None:
    recorder = Recorder()
    store = file_store(tmp_path, recorder)
    first = asyncio.run(store.put(NAMESPACE, RUN_UID, DATA))
    again = asyncio.run(store.put(NAMESPACE, RUN_UID, DATA))
    assert again == first
    assert (tmp_path / first.key).read_bytes() == DATA
    assert recorder.seen() == [
        ("put", "created", len(DATA)),
        ("put", "exists", 0),
        ("verify", "ok", len(DATA)),
    ]


def test_two_writers_of_the_same_content_at_once_both_get_the_reference(tmp_path: Path) -> None:
    recorder = Recorder()
    store = file_store(tmp_path, recorder)

    async def both() -> list[BlobRef]:
        return await asyncio.gather(*(store.put(NAMESPACE, RUN_UID, DATA) for _ in range(2)))

    first, second = asyncio.run(both())
    assert first == second
    puts = sorted(outcome for operation, outcome, _ in recorder.seen() if operation == "put")
    assert puts == ["created", "exists"]
    assert asyncio.run(store.get(first)) == DATA


def test_a_blob_planted_at_the_address_is_never_referenced_nor_overwritten() -> None:
    store, raw = memory_store()
    digest = hashlib.sha256(DATA).hexdigest()
    key = store.key_for(NAMESPACE, RUN_UID, digest)
    obstore.put(raw, key, b"forged state")
    with pytest.raises(StateUnverifiable, match=key) as refused:
        asyncio.run(store.put(NAMESPACE, RUN_UID, DATA))
    assert not refused.value.missing
    assert bytes(obstore.get(raw, key).bytes()) == b"forged state"


@pytest.mark.parametrize(
    ("tamper", "detail"),
    [
        (lambda data: data[:-1] + b"!", "with sha256"),  # same size, other bytes
        (lambda data: data[: len(data) // 2], "bytes, the reference"),  # truncated
        (lambda data: data + b" ", "bytes, the reference"),  # extended
    ],
    ids=["replaced", "truncated", "extended"],
)
def test_a_tampered_file_is_detected_on_read(
    tmp_path: Path, tamper: Callable[[bytes], bytes], detail: str
) -> None:
    recorder = Recorder()
    store = file_store(tmp_path, recorder)
    ref = asyncio.run(store.put(NAMESPACE, RUN_UID, DATA))
    blob = tmp_path / ref.key
    blob.write_bytes(tamper(blob.read_bytes()))
    with pytest.raises(StateUnverifiable, match=detail) as unverifiable:
        asyncio.run(store.get(ref))
    assert unverifiable.value.key == ref.key
    assert recorder.seen()[-1][:2] == ("get", "mismatch")


def test_a_missing_blob_is_unverifiable_and_named() -> None:
    recorder = Recorder()
    store, raw = memory_store(recorder)
    ref = asyncio.run(store.put(NAMESPACE, RUN_UID, DATA))
    obstore.delete(raw, ref.key)
    with pytest.raises(StateUnverifiable, match=f"{ref.key} cannot be verified: no object") as missing:
        asyncio.run(store.get(ref))
    assert missing.value.missing
    assert recorder.seen()[-1] == ("get", "missing", 0)


def test_a_reference_whose_key_is_not_its_content_address_is_not_read() -> None:
    store, _ = memory_store()
    ref = asyncio.run(store.put(NAMESPACE, RUN_UID, DATA))
    other = asyncio.run(store.put(NAMESPACE, RUN_UID, b"other"))
    # the key of one blob with the digest and size of another, or a key outside the store's prefix
    for forged in (
        BlobRef(other.key, ref.sha256, ref.size),
        BlobRef(ref.key.removeprefix("state/"), ref.sha256, ref.size),
    ):
        with pytest.raises(StateUnverifiable, match="not a content address"):
            asyncio.run(store.get(forged))


@pytest.mark.parametrize(
    ("namespace", "run_uid"),
    [("Team-A", RUN_UID), ("team/a", RUN_UID), ("", RUN_UID), (NAMESPACE, "../x"), (NAMESPACE, "")],
)
def test_a_blob_address_needs_a_namespace_and_a_run_uid(namespace: str, run_uid: str) -> None:
    store, _ = memory_store()
    with pytest.raises(ValueError, match="not a"):
        asyncio.run(store.put(namespace, run_uid, DATA))


def test_a_reference_round_trips_as_recorded_and_a_malformed_one_is_refused() -> None:
    ref = BlobRef("p/ns/uid/sha256/" + "a" * 64, "a" * 64, 12)
    assert BlobRef.from_json(ref.to_json()) == ref
    for bad in (
        {"key": "k", "sha256": "A" * 64, "size": 1},
        {"key": "k", "sha256": "a" * 63, "size": 1},
        {"key": "k", "sha256": "a" * 64, "size": -1},
        {"key": "k", "sha256": "a" * 64, "size": True},
        {"key": "", "sha256": "a" * 64, "size": 1},
        {"key": "k", "sha256": "a" * 64, "size": 1, "extra": 1},
    ):
        with pytest.raises(ValueError, match="blob reference"):
            BlobRef.from_json(bad)


def test_client_errors_are_classified_transient_or_refused() -> None:
    unavailable = [
        GenericError(
            "Error performing PUT http://127.0.0.1:1/b/k: error sending request: Connection refused"
        ),
        GenericError("Server returned non-2xx status code: 503 Service Unavailable: slow down"),
        GenericError("Server returned non-2xx status code: 429 Too Many Requests"),
        TimeoutError("operation timed out"),
        ConnectionResetError("reset by peer"),
    ]
    refused = [
        PermissionDeniedError("Access Denied"),
        GenericError("Server returned non-2xx status code: 400 Bad Request: InvalidRequest"),
    ]
    for error in unavailable:
        assert isinstance(classify("put", "k", error), StoreUnavailable), error
    for error in refused:
        assert isinstance(classify("get", "k", error), StoreRefused), error
    assert classify("get", "k", KeyError("a bug")) is None


def test_the_store_metrics_count_requests_latency_and_bytes_by_operation_and_outcome() -> None:
    registry = CollectorRegistry()
    metrics = StoreMetrics(registry)
    store = BlobStore(MemoryStore(), parse_store_url("memory://"), metrics.observe)
    ref = asyncio.run(store.put(NAMESPACE, RUN_UID, DATA))
    asyncio.run(store.put(NAMESPACE, RUN_UID, DATA))
    asyncio.run(store.get(ref))

    def sample(name: str, operation: str, outcome: str) -> float | None:
        return registry.get_sample_value(name, {"operation": operation, "outcome": outcome})

    assert sample("agentrun_state_store_requests_total", "put", "created") == 1
    assert sample("agentrun_state_store_requests_total", "put", "exists") == 1
    assert sample("agentrun_state_store_requests_total", "verify", "ok") == 1
    assert sample("agentrun_state_store_requests_total", "get", "ok") == 1
    assert sample("agentrun_state_store_requests_total", "get", "mismatch") == 0
    assert sample("agentrun_state_store_bytes_total", "put", "created") == len(DATA)
    assert sample("agentrun_state_store_bytes_total", "get", "ok") == len(DATA)
    assert sample("agentrun_state_store_request_duration_seconds_count", "get", "ok") == 1
