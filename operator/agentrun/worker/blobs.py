"""The SDK's side of the state store: values too large to keep inline go to the store as blobs, and come
back verified.

A value whose stored JSON is over INLINE_THRESHOLD bytes is put in the store (content-addressed,
put-if-absent) and the fenced object records its reference `{key, sha256, size}` instead of the value.
Reading a reference checks the blob's size and sha256 every time: a blob missing or changed is
StateUnverifiable (never a shorter or empty value), a store that cannot answer now is StoreUnavailable
(transient). Without a store configured (no AGENTRUN_STATE_STORE_URL) nothing moves: values stay inline
within their byte budgets, as before.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from agentrun.api.budgets import KIB, stored_size
from agentrun.statestore import BlobRef, BlobStore, StateStoreError, StoreUnavailable
from agentrun.statestore import StateUnverifiable as BlobUnverifiable
from agentrun.worker import errors

STORE_URL_ENV: Final = "AGENTRUN_STATE_STORE_URL"
# Values whose stored JSON is larger go to the store (docs/state-store.md, "The inline threshold").
INLINE_THRESHOLD: Final = 16 * KIB


def open_state_store(env: Mapping[str, str]) -> BlobStore | None:
    """The store the Pod's environment names (AGENTRUN_STATE_STORE_URL and the credential variables
    the store reads), or None when it names none. A malformed URL is the agent's permanent error."""
    url = env.get(STORE_URL_ENV, "").strip()
    if not url:
        return None
    try:
        return BlobStore.from_url(url, env=env)
    except StateStoreError as exc:
        raise errors.PermanentError(f"{STORE_URL_ENV}: {exc}") from None


def as_sdk_error(exc: StateStoreError) -> errors.AgentError:
    """The SDK's error for the store's: StateUnverifiable (one class), StoreUnavailable (transient), and
    anything else the store refused as permanent."""
    if isinstance(exc, errors.StateUnverifiable):
        return exc
    if isinstance(exc, BlobUnverifiable):
        return errors.StateUnverifiable.of_blob(exc)
    if isinstance(exc, StoreUnavailable):
        return errors.StoreUnavailable(str(exc), key=exc.key)
    return errors.PermanentError(str(exc))


def encode(value: Any) -> bytes:
    """The value's bytes in the store: compact JSON, UTF-8, as the API server would store it inline."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def fits_inline(value: Any) -> bool:
    return stored_size(value) <= INLINE_THRESHOLD


class RunBlobs:
    """One Run's blobs: `<prefix>/<namespace>/<run uid>/sha256/<hex>`."""

    def __init__(self, store: BlobStore, namespace: str, run_uid: str) -> None:
        self.store = store
        self.namespace = namespace
        self.run_uid = run_uid

    async def put(self, value: Any) -> dict[str, Any]:
        """Stores the value's JSON and returns its reference as the API records it."""
        try:
            ref = await self.store.put(self.namespace, self.run_uid, encode(value))
        except StateStoreError as exc:
            raise as_sdk_error(exc) from None
        return ref.to_json()

    async def put_bytes(self, data: bytes) -> BlobRef:
        """Stores bytes as they are (an integration's own encoding, e.g. a LangGraph channel value) and
        returns the reference, put-if-absent like every blob."""
        try:
            return await self.store.put(self.namespace, self.run_uid, data)
        except StateStoreError as exc:
            raise as_sdk_error(exc) from None

    async def get_bytes(self, ref: BlobRef) -> bytes:
        """The bytes a reference names, read and verified (size and sha256): StateUnverifiable when the
        blob is missing or changed, StoreUnavailable when the store cannot answer now."""
        try:
            return await self.store.get(ref)
        except StateStoreError as exc:
            raise as_sdk_error(exc) from None

    async def get(self, reference: Mapping[str, Any]) -> Any:
        """The value a reference names, read and verified."""
        try:
            ref = BlobRef.from_json(reference)
        except ValueError as exc:
            key = str(reference.get("key", "")) if isinstance(reference, Mapping) else ""
            raise errors.StateUnverifiable(f"not a blob reference: {exc}", key=key) from None
        try:
            data = await self.store.get(ref)
        except StateStoreError as exc:
            raise as_sdk_error(exc) from None
        try:
            return json.loads(data)
        except ValueError as exc:  # verified bytes that are not JSON: written by something else
            raise errors.StateUnverifiable(f"state blob {ref.key} is not JSON: {exc}", key=ref.key) from None
