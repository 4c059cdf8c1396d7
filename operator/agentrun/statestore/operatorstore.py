"""The operator's own client of the state store: a BlobStore that may also list, copy and delete, for
the one collector (agentrun.operator.collector). The worker SDK, the CLI and agents never import this
module (an import-linter contract): an agent's store client has no delete, and its credentials allow
none either (docs/state-store.md, "Collection").

Keys given to and returned by these operations are relative to the store's prefix, as the collector's
decisions (agentrun.core.collector) name them. With `buckets=namespace` each key is in its namespace's
bucket (a blob and its quarantine copy alike, so a copy never leaves its bucket), and a listing of the
whole store lists the URL's bucket and every namespace's.
"""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime
from typing import Final
from xml.etree import ElementTree

import obstore

from agentrun.core.blobrestore import StoredVersion
from agentrun.core.collector import BlobAddress, StoredBlob, relative_key

from .blobs import BlobRef, BlobStore, scrub
from .errors import StateUnverifiable, StoreRefused, StoreUnavailable
from .namespacebuckets import signing_endpoint, signing_region
from .sigv4 import S3Credentials, signed_request, transient_status

# More versions of one key than this is no store the operator trusts to page: said, not looped on.
_VERSIONS_LIMIT: Final = 100_000
_S3_NS: Final = "{http://s3.amazonaws.com/doc/2006-03-01/}"


class OperatorStore(BlobStore):
    """BlobStore plus what only the operator does: list with last-modified, copy and delete."""

    async def list_blobs(self, under: str = "") -> list[StoredBlob]:
        """Every object under `under` (a relative key prefix, whole segments; "" for the whole store),
        with its last-modified time and size, keys relative to the store's prefix."""
        prefix = self.location.key(under) or None
        found: list[StoredBlob] = []
        with self._request("list", prefix or "/") as request:
            for bucket, store in await self._stores_under(prefix or ""):
                try:
                    async for batch in obstore.list(store, prefix, chunk_size=1000):
                        for meta in batch:
                            key = relative_key(self.location.prefix, meta["path"])
                            if key is not None and self._listed_here(bucket, meta["path"]):
                                found.append(StoredBlob(key, meta["last_modified"], int(meta["size"])))
                except Exception as exc:
                    if not self._not_made(bucket, exc):
                        raise
            request.outcome = "ok"
        return found

    async def copy(self, source: str, target: str) -> bool:
        """Copies the object at `source` to `target` (overwriting it) inside the store, without moving
        the bytes through the operator. False when nothing is at `source`. Both keys are in one bucket
        (a namespace's blob and its quarantine copy are)."""
        full_source, full_target = self.location.key(source), self.location.key(target)
        if self.bucket_for(full_source) != self.bucket_for(full_target):
            raise ValueError(f"{source} and {target} are in different buckets: no copy between them")
        with self._request("copy", full_source) as request:
            try:
                await obstore.copy_async(
                    self._store_for(full_source), full_source, full_target, overwrite=True
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
                await obstore.delete_async(self._store_for(self.location.key(key)), self.location.key(key))
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

    # ---- versions of a key: restoring an overwritten blob (agentrun.core.blobrestore) -------------------

    def keeps_versions(self) -> bool:
        """Whether the operator can list a key's versions here: an S3 store (ListObjectVersions)."""
        return self.location.scheme == "s3"

    async def versions(self, key: str, *, page_size: int = 1000) -> list[StoredVersion]:
        """Every version the store keeps of `key` (a full key, as references name it), delete markers
        included, in the store's order (newest first): S3 ListObjectVersions, paged, signed with the
        operator's own credentials. StoreUnavailable when the store cannot answer now, StoreRefused when
        it says no, pages without moving on, or is not an S3 store (keeps_versions)."""
        self._check_inside(key)
        if not self.keeps_versions():
            raise StoreRefused("list versions", key, f"a {self.location.scheme}:// store keeps no versions")
        found: list[StoredVersion] = []
        markers: dict[str, str] = {}
        while True:
            query = {"versions": "", "prefix": key, "max-keys": str(page_size), **markers}
            with self._request("list", key) as request:
                bucket = f"/{self.bucket_for(key)}"
                status, body = await asyncio.to_thread(self._signed, "GET", bucket, query)
                if status != 200:
                    request.outcome = "unavailable" if transient_status(status) else "refused"
                    detail = scrub(f"HTTP {status}: {body[:300]!r}")
                    if request.outcome == "unavailable":
                        raise StoreUnavailable("list versions", key, detail)
                    raise StoreRefused("list versions", key, detail)
                request.outcome = "ok"
            page, following = _versions_page(body, key)
            found += page
            if not following:
                return found
            if following == markers or len(found) > _VERSIONS_LIMIT:
                # A server that pages without moving on (versitygw v1.8.0 answers the page of its markers
                # again) or without end: never looped on, and asking again cannot help.
                raise StoreRefused(
                    "list versions", key, f"its paging does not move on ({len(found)} versions listed)"
                )
            markers = following

    async def get_version(self, key: str, version_id: str) -> bytes:
        """The bytes of one version of `key` (a full key), unverified: the caller checks them. A version
        gone meanwhile reads as empty bytes (which verify as nothing)."""
        self._check_inside(key)
        with self._request("get", key) as request:
            try:
                result = await obstore.get_async(self._store_for(key), key, options={"version": version_id})
            except FileNotFoundError:
                request.outcome = "missing"
                return b""
            data = bytes(await result.bytes_async())
            request.outcome, request.size = "ok", len(data)
            return data

    async def put_back(self, ref: BlobRef, data: bytes) -> None:
        """Writes `data` as the current version of the blob's key, overwriting what is there (only the
        operator's credentials may: the blob's writers put-if-absent), then reads it back and verifies it
        against `ref`: StateUnverifiable when it is not that content, so nothing unverified is claimed."""
        self._check_address(ref)
        with self._request("put", ref.key) as request:
            await obstore.put_async(
                self._store_for(ref.key), ref.key, bytes(data), mode="overwrite", use_multipart=False
            )
            request.outcome, request.size = "created", len(data)
        await self.get(ref)

    def _signed(self, method: str, path: str, query: dict[str, str]) -> tuple[int, bytes]:
        env = os.environ if self._env is None else self._env
        region, endpoint = signing_region(self.location, env), signing_endpoint(self.location, env)
        access, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
        if not access or not secret:
            return 403, b"no S3 access key in the operator's environment to sign ListObjectVersions with"
        return signed_request(
            method,
            endpoint,
            path,
            credentials=S3Credentials(access, secret),
            query=query,
            region=region,
            session_token=env.get("AWS_SESSION_TOKEN") or None,
        )

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


def _versions_page(body: bytes, key: str) -> tuple[list[StoredVersion], dict[str, str]]:
    """One ListObjectVersions answer: the versions and delete markers of exactly `key`, in its order,
    and the markers of the next page (empty when this was the last)."""
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError as error:
        raise StoreUnavailable("list versions", key, f"an answer that is not XML: {error}") from None
    found = []
    for item in root:
        kind = item.tag.removeprefix(_S3_NS)
        if kind not in ("Version", "DeleteMarker") or _text(item, "Key") != key:
            continue
        found.append(
            StoredVersion(
                version_id=_text(item, "VersionId") or "null",
                last_modified=_when(_text(item, "LastModified")),
                size=int(_text(item, "Size") or 0),
                latest=_text(item, "IsLatest") == "true",
                delete_marker=kind == "DeleteMarker",
            )
        )
    markers: dict[str, str] = {}
    if _text(root, "IsTruncated") == "true":
        markers = {
            "key-marker": _text(root, "NextKeyMarker"),
            "version-id-marker": _text(root, "NextVersionIdMarker"),
        }
        if not markers["key-marker"]:
            raise StoreUnavailable("list versions", key, "a truncated answer without its next markers")
    return found, markers


def _text(element: ElementTree.Element, name: str) -> str:
    found = element.find(_S3_NS + name)
    if found is None:
        found = element.find(name)
    return (found.text or "").strip() if found is not None else ""


def _when(value: str) -> datetime:
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return datetime.fromtimestamp(0, UTC)
