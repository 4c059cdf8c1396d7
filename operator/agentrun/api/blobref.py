"""A reference to a blob in the agent-state store (docs/state-store.md), as fenced objects record it."""

from __future__ import annotations

from typing import Final

from pydantic import Field

from agentrun.api.common import ApiModel

# S3's limit on an object key (1024 bytes of UTF-8); the keys agentrun writes are ASCII.
MAX_BLOB_KEY_LENGTH: Final = 1024
# The largest blob a reference may name: well above any value the SDK stores, below int64's range.
MAX_BLOB_SIZE: Final = 1 << 40


class BlobRef(ApiModel):
    """A value stored outside the object, in the agent-state store: an immutable, content-addressed blob
    (its key ends in sha256/<its sha256>). Every read checks the blob's size and sha256 against this
    reference; a blob missing or changed is StateUnverifiable, never a shorter value."""

    key: str = Field(
        min_length=1,
        max_length=MAX_BLOB_KEY_LENGTH,
        pattern=r"^[^\s]+/sha256/[0-9a-f]{64}$",
        description="The blob's key in the state store: <prefix>/<namespace>/<run uid>/sha256/<hex>.",
    )
    sha256: str = Field(
        pattern=r"^[0-9a-f]{64}$",
        max_length=64,
        description="The sha256 of the blob's bytes, as 64 lowercase hex digits (no 'sha256:' prefix); "
        "a blob that does not match is refused.",
    )
    size: int = Field(
        ge=0,
        le=MAX_BLOB_SIZE,
        description="The blob's size in bytes (its stored JSON); a blob of another size is refused.",
    )
    links: bool | None = Field(
        default=None,
        description="True when the blob is a document that names further blobs in its top-level 'refs' "
        "list (a LangGraph manifest, a checkpoint index, an archive): the state store's collector "
        "follows it, so everything it names stays stored while this reference lives.",
    )
