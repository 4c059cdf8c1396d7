"""The operator's store client on memory:// and file://: list with last-modified, copy, delete, and the
collector's quarantine and restore built on them. The same against a real S3 server:
tests/integration/test_statestore_s3.py."""

from __future__ import annotations

import asyncio
import hashlib
from datetime import UTC, datetime
from pathlib import Path

import obstore
import pytest
from obstore.store import MemoryStore

from agentrun.core.collector import BlobAddress, live_address
from agentrun.statestore import (
    StateUnverifiable,
    StoreRefused,
    StoreRequest,
    StoreUnavailable,
    parse_store_url,
)
from agentrun.statestore.operatorstore import OperatorStore, _versions_page

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


# ListObjectVersions as versitygw v1.8.0 answers it (its delete markers ahead of its versions, newest first).
VERSIONS_XML = b"""<?xml version="1.0" encoding="UTF-8"?>
<ListVersionsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><DeleteMarker><IsLatest>true</IsLatest>
<Key>k/sha256/a</Key><LastModified>2026-12-02T15:24:20.976352495Z</LastModified><VersionId>d1</VersionId>
</DeleteMarker><IsTruncated>%(truncated)s</IsTruncated><NextKeyMarker>%(next)s</NextKeyMarker>
<NextVersionIdMarker>v1</NextVersionIdMarker><Version><LastModified>2026-12-02T15:24:20Z</LastModified>
<IsLatest>false</IsLatest><Key>k/sha256/a</Key><Size>5</Size><VersionId>v2</VersionId></Version>
<Version><LastModified>2026-12-02T15:24:19Z</LastModified><IsLatest>false</IsLatest><Key>k/sha256/ab</Key>
<Size>9</Size><VersionId>other-key</VersionId></Version><Version><LastModified>2026-12-02T15:24:19Z
</LastModified><IsLatest>false</IsLatest><Key>k/sha256/a</Key><Size>3</Size><VersionId>v1</VersionId>
</Version></ListVersionsResult>"""


def test_a_versions_page_is_read_in_its_order_for_exactly_its_key() -> None:
    page, markers = _versions_page(VERSIONS_XML % {b"truncated": b"false", b"next": b""}, "k/sha256/a")
    assert [(v.version_id, v.delete_marker, v.size, v.latest) for v in page] == [
        ("d1", True, 0, True),
        ("v2", False, 5, False),
        ("v1", False, 3, False),
    ]
    assert page[1].last_modified == datetime(2026, 12, 2, 15, 24, 20, tzinfo=UTC)
    assert markers == {}
    truncated = VERSIONS_XML % {b"truncated": b"true", b"next": b"k/sha256/a"}
    _, following = _versions_page(truncated, "k/sha256/a")
    assert following == {"key-marker": "k/sha256/a", "version-id-marker": "v1"}
    with pytest.raises(StoreUnavailable):
        _versions_page(b"<html>a proxy's error page", "k/sha256/a")


def test_a_store_that_keeps_no_versions_refuses_to_list_them() -> None:
    store, _ = memory_store()
    assert not store.keeps_versions()
    with pytest.raises(StoreRefused, match="keeps no versions"):
        asyncio.run(store.versions(store.location.key(NAMESPACE, RUN_UID, "sha256", "a" * 64)))
