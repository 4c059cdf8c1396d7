"""Documents that name blobs: how a blob can hold references to other blobs, so that the one collector
finds everything that is still needed (docs/state-store.md, "Collection": its roots are every reference
in live objects, manifests, checkpoint indexes and archives).

A LangGraph manifest, a Run's checkpoint index and a Run's archive are JSON documents stored as blobs.
Each lists every blob it names in its top-level `refs`, and whoever references such a document marks the
reference `links` (BlobRef.links), so the collector knows to read it (verified, like every read) and to
follow what it names, without knowing any document's kind.

    data = encode_document("CheckpointIndex", refs, {"checkpoints": [...]})
    ref = await store.put(namespace, run_uid, data)          # then record BlobRef(..., links=True)
    named = document_refs(await store.get(ref))              # what the collector follows
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

from .blobs import BlobRef

# The fields of a document that this module owns; a document's own body may not use them.
KIND_FIELD: Final = "kind"
REFS_FIELD: Final = "refs"


def encode_document(kind: str, refs: Iterable[BlobRef], body: Mapping[str, Any]) -> bytes:
    """The bytes of a document of `kind` naming `refs` (each once, in a stable order) beside `body`.
    The same document always encodes to the same bytes, so it has one content address."""
    if KIND_FIELD in body or REFS_FIELD in body:
        raise ValueError(f"a document's body may not use the fields {KIND_FIELD!r} or {REFS_FIELD!r}")
    unique = sorted({ref.key: ref for ref in refs}.values(), key=lambda ref: ref.key)
    document = {KIND_FIELD: kind, REFS_FIELD: [ref.to_json() for ref in unique], **body}
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def decode_document(data: bytes) -> dict[str, Any]:
    """A document's JSON; ValueError when the bytes are not one (a document's reference was verified
    before it was read, so this means a writer's bug, never a store fault)."""
    try:
        document = json.loads(data)
    except ValueError as error:
        raise ValueError(f"not a state-store document: {error}") from None
    if not isinstance(document, dict) or not isinstance(document.get(REFS_FIELD), list):
        raise ValueError("not a state-store document: no top-level 'refs' list")
    return document


def document_refs(data: bytes) -> list[BlobRef]:
    """The blobs a document names (its `refs`)."""
    return [BlobRef.from_json(value) for value in decode_document(data)[REFS_FIELD]]


def refs_in(value: Any) -> Iterator[BlobRef]:
    """Every blob reference inside a JSON value (an object's spec or status, a document's body): each
    mapping with exactly a reference's fields. The collector's roots come from live objects this way,
    whatever field holds them (stateRef, resultRef, checkpointIndex, ...)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            if _looks_like_ref(item):
                yield BlobRef.from_json(item)
            else:
                stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _looks_like_ref(item: Mapping[str, Any]) -> bool:
    fields = set(item)
    return {"key", "sha256", "size"} <= fields <= {"key", "sha256", "size", "links"}
