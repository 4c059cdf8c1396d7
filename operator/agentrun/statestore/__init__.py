"""The agent-state store (docs/state-store.md): immutable, content-addressed blobs in an object store,
configured by one URL, verified on every read. Used by the worker SDK and the operator alike.

    store = BlobStore.from_url("s3://bucket/prefix?endpoint=http://127.0.0.1:7070&region=us-east-1")
    ref = await store.put(namespace, run_uid, data)   # BlobRef {key, sha256, size}, put-if-absent
    data = await store.get(ref)                        # size and sha256 checked, every time
"""

from .blobs import BlobRef, BlobStore, StoreTimeouts
from .errors import StateStoreError, StateUnverifiable, StoreConfigError, StoreRefused, StoreUnavailable
from .location import StoreLocation, parse_store_url
from .observe import Observer, StoreRequest

__all__ = [
    "BlobRef",
    "BlobStore",
    "Observer",
    "StateStoreError",
    "StateUnverifiable",
    "StoreConfigError",
    "StoreLocation",
    "StoreRefused",
    "StoreRequest",
    "StoreTimeouts",
    "StoreUnavailable",
    "parse_store_url",
]
