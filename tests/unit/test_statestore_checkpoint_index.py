"""statestore.checkpoint_index: a finished Run's Checkpoint index as one document of references, the same
bytes for the same Checkpoints (written twice, one blob), an earlier index merged in, and the Checkpoints
read back as they were; operator.logtail: a log's tail, bounded."""

from __future__ import annotations

from agentrun.api import Checkpoint
from agentrun.operator.logtail import tail
from agentrun.statestore import BlobRef
from agentrun.statestore.checkpoint_index import (
    as_checkpoint,
    decode_index,
    encode_index,
    entry,
    inline_state_bytes,
    merged,
)
from agentrun.statestore.documents import document_refs

STATE_REF = BlobRef(f"p/ns/uid/sha256/{'b' * 64}", "b" * 64, 2048)
INLINE_REF = BlobRef(f"p/ns/uid/sha256/{'c' * 64}", "c" * 64, 12)


def checkpoint(name: str, sequence: int, **spec: object) -> dict[str, object]:
    return {
        "metadata": {"name": name, "namespace": "ns", "creationTimestamp": "2026-03-01T12:00:00Z"},
        "spec": {
            "runName": "triage",
            "id": name,
            "sequence": sequence,
            "attempt": "triage-a1",
            "leaseEpoch": 1,
        }
        | spec,
    }


def test_an_entry_keeps_references_only() -> None:
    found = entry(
        checkpoint("c-2", 2, parent="c-1", state={"x": 1}, stateRef=STATE_REF.to_json()), INLINE_REF
    )

    assert "state" not in found
    assert found["stateRef"] == STATE_REF.to_json()
    assert found["inlineStateRef"] == INLINE_REF.to_json()
    assert (found["name"], found["parent"], found["sequence"], found["leaseEpoch"]) == ("c-2", "c-1", 2, 1)


def test_the_index_names_every_blob_and_encodes_the_same_twice() -> None:
    entries = [entry(checkpoint("c-1", 1, stateRef=STATE_REF.to_json()), INLINE_REF)]

    data = encode_index(entries)

    assert data == encode_index([dict(reversed(entries[0].items()))])
    assert {r.key for r in document_refs(data)} == {STATE_REF.key, INLINE_REF.key}
    assert decode_index(data) == entries


def test_an_earlier_index_is_merged_in_chain_order() -> None:
    earlier = [entry(checkpoint("c-1", 1), None), entry(checkpoint("c-2", 2), None)]
    now = [entry(checkpoint("c-2", 2), None), entry(checkpoint("c-3", 3), None)]

    assert [e["name"] for e in merged(earlier, now)] == ["c-1", "c-2", "c-3"]


def test_a_checkpoint_reads_back_as_it_was() -> None:
    original = checkpoint(
        "c-2", 2, parent="c-1", step="triage", state={"x": [1, 2]}, stateRef=STATE_REF.to_json()
    )
    rebuilt = as_checkpoint(entry(original, INLINE_REF), "triage", "ns", state={"x": [1, 2]})

    assert Checkpoint.model_validate(rebuilt).spec == Checkpoint.model_validate(original).spec
    assert inline_state_bytes({"b": 1, "a": 2}) == b'{"a":2,"b":1}'


def test_a_log_tail_is_bounded_and_starts_at_a_line() -> None:
    log = b"".join(f"line {n}\n".encode() for n in range(1000))

    kept, cut = tail(log, 64)

    assert cut and len(kept) <= 64
    assert kept.startswith(b"line ") and kept.endswith(b"line 999\n")
    assert tail(b"short\n", 64) == (b"short\n", False)
