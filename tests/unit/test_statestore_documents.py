"""Documents that name blobs (statestore.documents): what the collector follows, stored on memory://."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from agentrun.api.blobref import BlobRef as BlobRefModel
from agentrun.statestore import BlobRef, BlobStore
from agentrun.statestore.documents import decode_document, document_refs, encode_document, refs_in

NAMESPACE = "team-a"
RUN_UID = "3f1c2a9e-8d5b-4c47-9f0e-2b6d7a1c5e34"


def ref_of(data: bytes, *, links: bool = False) -> BlobRef:
    digest = hashlib.sha256(data).hexdigest()
    return BlobRef(f"agentrun/{NAMESPACE}/{RUN_UID}/sha256/{digest}", digest, len(data), links)


STATE, WRITES = ref_of(b"state"), ref_of(b"writes")


def test_a_document_names_each_blob_once_in_a_stable_order() -> None:
    data = encode_document("CheckpointIndex", [WRITES, STATE, WRITES], {"checkpoints": ["c1"]})
    assert document_refs(data) == sorted([STATE, WRITES], key=lambda ref: ref.key)
    assert decode_document(data)["checkpoints"] == ["c1"]
    assert data == encode_document("CheckpointIndex", [STATE, WRITES], {"checkpoints": ["c1"]})


def test_a_body_may_not_take_the_fields_a_document_owns() -> None:
    with pytest.raises(ValueError, match="may not use the fields"):
        encode_document("Archive", [], {"refs": []})


@pytest.mark.parametrize("data", [b"not json", b"[]", b'{"kind": "Archive"}'])
def test_bytes_that_are_no_document_are_refused(data: bytes) -> None:
    with pytest.raises(ValueError, match="not a state-store document"):
        document_refs(data)


def test_a_linking_reference_round_trips_through_the_api_model() -> None:
    index = ref_of(b"index", links=True)
    assert index.to_json()["links"] is True
    assert "links" not in STATE.to_json()
    model = BlobRefModel.model_validate(index.to_json())
    assert BlobRef.from_json(model.model_dump(by_alias=True, exclude_none=True)) == index


def test_refs_are_found_wherever_an_object_holds_them() -> None:
    index = ref_of(b"index", links=True)
    status = {
        "resultRef": STATE.to_json(),
        "checkpointIndex": index.to_json(),
        "history": [{"note": "not a ref", "key": "k"}, {"stateRef": WRITES.to_json()}],
    }
    assert sorted(refs_in(status), key=lambda ref: ref.key) == sorted(
        [STATE, index, WRITES], key=lambda ref: ref.key
    )


def test_a_stored_document_leads_to_what_it_names() -> None:
    store = BlobStore.from_url("memory://")

    async def scenario() -> list[BlobRef]:
        state = await store.put(NAMESPACE, RUN_UID, b"state")
        index = await store.put(NAMESPACE, RUN_UID, encode_document("CheckpointIndex", [state], {}))
        return document_refs(await store.get(index))

    [named] = asyncio.run(scenario())
    assert named.sha256 == hashlib.sha256(b"state").hexdigest()
