"""A finished Run's Checkpoint index: one document in the state store naming every Checkpoint the Run
saved, so the Checkpoint objects themselves can leave the API server (docs/state-store.md, "A finished Run's
Checkpoint index"; Run status.checkpointIndex).

Each entry keeps what describes a Checkpoint (name, id, parent, kind, step, attempt, leaseEpoch,
sequence, thread, deltaBase, creationTimestamp) and its state as references only: `stateRef` as the
Checkpoint recorded it, and `inlineStateRef`, the inline `state` value moved into a blob (canonical JSON).
The document lists every blob it names in `refs` (statestore.documents), so the collector keeps them.

The same Checkpoints always encode to the same bytes (entries sorted, canonical JSON): written twice, the
index is one blob, and an operator restarted half-way writes what it wrote before.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

from agentrun.api import API_VERSION

from .blobs import BlobRef
from .documents import decode_document, encode_document

KIND: Final = "CheckpointIndex"
# The fields of a Checkpoint's spec an entry keeps as they are (state and stateRef become references).
_DESCRIBING: Final = (
    "id",
    "parent",
    "kind",
    "step",
    "attempt",
    "leaseEpoch",
    "sequence",
    "thread",
    "deltaBase",
    "ledgerMark",
)

Entry = dict[str, Any]


def inline_state_bytes(value: Any) -> bytes:
    """An inline state's blob: canonical JSON (sorted keys, compact, UTF-8), so it has one address."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def entry(checkpoint: Mapping[str, Any], inline_state_ref: BlobRef | None) -> Entry:
    """The index entry of a Checkpoint object (as served: metadata and spec), its inline state (if any)
    already stored as `inline_state_ref`."""
    spec, metadata = checkpoint.get("spec") or {}, checkpoint.get("metadata") or {}
    found: Entry = {"name": metadata["name"]}
    found.update({k: spec[k] for k in _DESCRIBING if spec.get(k) is not None})
    if created := metadata.get("creationTimestamp"):
        found["creationTimestamp"] = created
    if spec.get("stateRef") is not None:
        found["stateRef"] = BlobRef.from_json(spec["stateRef"]).to_json()
    if inline_state_ref is not None:
        found["inlineStateRef"] = inline_state_ref.to_json()
    return found


def merged(previous: Iterable[Entry], current: Iterable[Entry]) -> list[Entry]:
    """The entries of an earlier index with those of the Checkpoints seen now (a Run retried after it was
    compacted saves more): by name, the current one winning (Checkpoints are immutable: they are equal),
    in the order of the chain (sequence, then name)."""
    by_name = {e["name"]: e for e in previous}
    by_name.update({e["name"]: e for e in current})
    return sorted(by_name.values(), key=lambda e: (int(e.get("sequence", 0)), str(e["name"])))


def entry_refs(entries: Iterable[Entry]) -> list[BlobRef]:
    refs = []
    for found in entries:
        for field in ("stateRef", "inlineStateRef"):
            if field in found:
                refs.append(BlobRef.from_json(found[field]))
    return refs


def encode_index(entries: Iterable[Entry]) -> bytes:
    listed = list(entries)
    return encode_document(KIND, entry_refs(listed), {"checkpoints": listed})


def decode_index(data: bytes) -> list[Entry]:
    """The entries of an index document; ValueError when the bytes are not one."""
    document = decode_document(data)
    if document.get("kind") != KIND or not isinstance(document.get("checkpoints"), list):
        raise ValueError(f"not a checkpoint index (kind {document.get('kind')!r})")
    return list(document["checkpoints"])


def as_checkpoint(found: Entry, run_name: str, namespace: str, state: Any = None) -> dict[str, Any]:
    """A Checkpoint object as it was (for readers: describe, state), from its entry; `state` is the
    inline state read back from inlineStateRef, if it had one."""
    spec: dict[str, Any] = {"runName": run_name}
    spec.update({k: found[k] for k in _DESCRIBING if k in found})
    if "stateRef" in found:
        spec["stateRef"] = found["stateRef"]
    if state is not None:
        spec["state"] = state
    metadata: dict[str, Any] = {"name": found["name"], "namespace": namespace}
    if "creationTimestamp" in found:
        metadata["creationTimestamp"] = found["creationTimestamp"]
    return {"apiVersion": API_VERSION, "kind": "Checkpoint", "metadata": metadata, "spec": spec}


def state_as_ref(found: Entry) -> dict[str, Any] | None:
    """The reference that holds an entry's state whichever form it was saved in: its stateRef, or the
    blob its inline state was moved into (canonical JSON of the value, as a stateRef's blob holds it)."""
    ref = found.get("stateRef") or found.get("inlineStateRef")
    return None if ref is None else BlobRef.from_json(ref).to_json()
