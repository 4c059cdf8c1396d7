"""The operator's store client on memory:// and file://: list with last-modified, copy, delete, and the
collector's quarantine and restore built on them. The same against a real S3 server:
tests/integration/test_statestore_s3.py."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import obstore
import pytest
from obstore.store import MemoryStore

from agentrun.core.collector import BlobAddress, live_address
from agentrun.statestore import StateUnverifiable, StoreRequest, parse_store_url
from agentrun.statestore.operatorstore import OperatorStore

NAMESPACE = "team-a"
RUN_UID = "3f1c2a9e-8d5b-4c47-9f0e-2b6d7a1c5e34"
DATA = b"state that nobody references any more"


class Recorder(list[StoreRequest]):
    def __call__(self, request: StoreRequest) -> None:
        self.append(request)


def memory_store(recorder: Recorder | None = None) -> tuple[OperatorStore, MemoryStore]:
    raw = MemoryStore()
    return OperatorStore(raw, parse_store_url("memory://state"), recorder), raw


def address_of(store: OperatorStore, key: str) -> BlobAddress:
    relative = key.removeprefix(store.location.prefix + "/")
    address = live_address(relative)
    assert address is not None, key
    return address


def test_list_blobs_gives_relative_keys_with_last_modified_and_size_under_a_prefix() -> None:
    recorder = Recorder()
    store, raw = memory_store(recorder)
    ref = asyncio.run(store.put(NAMESPACE, RUN_UID, DATA))
    other = asyncio.run(store.put("team-b", RUN_UID, b"x"))
    obstore.put(raw, "elsewhere/not-ours", b"y")  # outside the store's prefix: never listed
    listed = {blob.key: blob for blob in asyncio.run(store.list_blobs())}
    relative = ref.key.removeprefix("state/")
    assert sorted(listed) == sorted([relative, other.key.removeprefix("state/")])
    assert listed[relative].size == len(DATA)
    assert listed[relative].last_modified.tzinfo is not None
    assert [b.key for b in asyncio.run(store.list_blobs(NAMESPACE))] == [relative]
    assert asyncio.run(store.list_blobs("team-c")) == []
    assert [(r.operation, r.outcome) for r in recorder][-3:] == [("list", "ok")] * 3


def test_quarantine_moves_a_blob_away_from_its_key_and_restore_puts_it_back_verified() -> None:
    recorder = Recorder()
    store, _ = memory_store(recorder)
    ref = asyncio.run(store.put(NAMESPACE, RUN_UID, DATA))
    address = address_of(store, ref.key)
    assert asyncio.run(store.quarantine(address))
    with pytest.raises(StateUnverifiable) as gone:
        asyncio.run(store.get(ref))
    assert gone.value.missing
    assert [b.key for b in asyncio.run(store.list_blobs())] == [address.quarantine_key]
    # a writer's put-if-absent now creates it afresh instead of verifying a blob about to go
    assert asyncio.run(store.put(NAMESPACE, RUN_UID, DATA)) == ref
    asyncio.run(store.delete(address.key))
    asyncio.run(store.restore(address, len(DATA)))
    assert asyncio.run(store.get(ref)) == DATA
    assert [b.key for b in asyncio.run(store.list_blobs())] == [address.key]
    operations = [(r.operation, r.outcome) for r in recorder]
    assert ("copy", "ok") in operations
    assert ("delete", "ok") in operations


def test_restore_over_a_blob_a_writer_created_again_verifies_it_and_drops_the_copy() -> None:
    store, _ = memory_store()
    ref = asyncio.run(store.put(NAMESPACE, RUN_UID, DATA))
    address = address_of(store, ref.key)
    asyncio.run(store.quarantine(address))
    asyncio.run(store.put(NAMESPACE, RUN_UID, DATA))
    asyncio.run(store.restore(address, len(DATA)))
    assert [b.key for b in asyncio.run(store.list_blobs())] == [address.key]


def test_a_quarantine_copy_that_is_not_its_content_is_never_restored() -> None:
    store, raw = memory_store()
    digest = hashlib.sha256(DATA).hexdigest()
    address = BlobAddress(NAMESPACE, RUN_UID, digest)
    obstore.put(raw, f"state/{address.quarantine_key}", b"planted, not the content" + b" " * 13)
    with pytest.raises(StateUnverifiable, match="the reference names"):
        asyncio.run(store.restore(address, len(DATA)))
    assert [b.key for b in asyncio.run(store.list_blobs())] == [address.quarantine_key]


def test_quarantining_a_blob_already_gone_says_so() -> None:
    store, _ = memory_store()
    address = BlobAddress(NAMESPACE, RUN_UID, "a" * 64)
    assert not asyncio.run(store.quarantine(address))
    asyncio.run(store.delete(address.key))  # deleting what is not there is fine


def test_get_at_reads_a_key_no_reference_names_verified_by_the_digest_its_key_ends_with(
    tmp_path: Path,
) -> None:
    store = OperatorStore.from_url(f"file://{tmp_path}")
    assert isinstance(store, OperatorStore)
    digest = hashlib.sha256(DATA).hexdigest()
    archive = f"_archives/{NAMESPACE}/sha256/{digest}"
    (tmp_path / archive).parent.mkdir(parents=True)
    (tmp_path / archive).write_bytes(DATA)
    assert asyncio.run(store.get_at(archive, len(DATA))) == DATA
    (tmp_path / "_archives/named-freely.json").write_bytes(DATA)
    with pytest.raises(StateUnverifiable, match="not a content address"):
        asyncio.run(store.get_at("_archives/named-freely.json", len(DATA)))
    with pytest.raises(StateUnverifiable):
        asyncio.run(store.get_at(archive, len(DATA) + 1))
