"""The operator's own client of the state store: a BlobStore that may also list, copy and delete, for
the one collector (agentrun.operator.collector). The worker SDK, the CLI and agents never import this
module (an import-linter contract): an agent's store client has no delete, and its credentials allow
none either (docs/state-store.md, "Collection").

Keys given to and returned by these operations are relative to the store's prefix, as the collector's
decisions (agentrun.core.collector) name them.
"""

from __future__ import annotations

import obstore

from agentrun.core.collector import BlobAddress, StoredBlob, relative_key

from .blobs import BlobRef, BlobStore
from .errors import StateUnverifiable


class OperatorStore(BlobStore):
    """BlobStore plus what only the operator does: list with last-modified, copy and delete."""

    async def list_blobs(self, under: str = "") -> list[StoredBlob]:
        """Every object under `under` (a relative key prefix, whole segments; "" for the whole store),
        with its last-modified time and size, keys relative to the store's prefix."""
        prefix = self.location.key(under) or None
        found: list[StoredBlob] = []
        with self._request("list", prefix or "/") as request:
            async for batch in obstore.list(self._store, prefix, chunk_size=1000):
                for meta in batch:
                    key = relative_key(self.location.prefix, meta["path"])
                    if key is not None:
                        found.append(StoredBlob(key, meta["last_modified"], int(meta["size"])))
            request.outcome = "ok"
        return found

    async def copy(self, source: str, target: str) -> bool:
        """Copies the object at `source` to `target` (overwriting it) inside the store, without moving
        the bytes through the operator. False when nothing is at `source`."""
        with self._request("copy", self.location.key(source)) as request:
            try:
                await obstore.copy_async(
                    self._store, self.location.key(source), self.location.key(target), overwrite=True
                )
            except FileNotFoundError:
                request.outcome = "missing"
                return False
            request.outcome = "ok"
            return True

    async def delete(self, key: str) -> None:
        """Deletes the object at `key` (nothing there is fine: deleting is idempotent)."""
        with self._request("delete", self.location.key(key)) as request:
            try:
                await obstore.delete_async(self._store, self.location.key(key))
            except FileNotFoundError:
                request.outcome = "missing"
                return
            request.outcome = "ok"

    async def get_at(self, key: str, size: int) -> bytes:
        """The bytes at `key` (relative), a content address (`.../sha256/<hex>`), verified against the
        sha256 its key names and `size`: how the collector reads archives and quarantined blobs, which
        no reference names. StateUnverifiable when the key is not a content address."""
        full = self.location.key(key)
        digest = full.rsplit("/", 1)[-1]
        try:
            ref = BlobRef(full, digest, size)
        except ValueError as error:
            raise StateUnverifiable(full, f"not a content address: {error}") from None
        return await self.get(ref)

    async def quarantine(self, address: BlobAddress) -> bool:
        """Moves the blob away from its key: copied under the quarantine segment, then deleted, so that
        a writer's later put-if-absent creates it afresh. False when it was already gone."""
        if not await self.copy(address.key, address.quarantine_key):
            return False
        await self.delete(address.key)
        return True

    async def restore(self, address: BlobAddress, size: int) -> None:
        """Puts a quarantined blob back at its key after checking its digest, then deletes the
        quarantine copy. A copy that is not its content raises StateUnverifiable and stays where it is.

        Copied, not put-if-absent: on a versioned bucket the key's delete marker may refuse
        `If-None-Match: *` (versitygw v1.8.0 does), and what lands at the key is the address's own,
        verified content, so overwriting (a writer's identical blob) loses nothing."""
        await self.get_at(address.quarantine_key, size)
        if not await self.copy(address.quarantine_key, address.key):
            raise StateUnverifiable(self.location.key(address.quarantine_key), "gone before it was restored")
        await self.delete(address.quarantine_key)
