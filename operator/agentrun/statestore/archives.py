"""Archives of finished Runs in the state store, and the index that lists them (docs/state-store.md, "Archives
of finished Runs"). Only the operator writes under the archive prefix; people read with their namespace's
credentials (`kubectl agentrun history`, `describe --archived`), and a fork reads an archived source through
`read_archive`.

    <prefix>/_archives/<namespace>/<run name>/<run uid>.json            one archive per Run (by uid)
    <prefix>/_archives/<namespace>/_index/<day>/<chain>-<seq>.json     the namespace's index segments

Every object under the archive prefix is a document (statestore.documents) whose `refs` list the blobs it
needs: the collector takes each as a root, so a Run's state stays while its archive does.

An archive is keyed by the Run's uid, so a Run recreated under the same name neither hides nor overwrites
an earlier archive. The key is not a content address: the index entry records the archive's sha256 and
size, and every read verifies them. Writes are put-if-absent, so a repeat (an operator restarted between
archive and delete) finds the first archive and keeps it.

The index is per namespace and day (the UTC day the Run was archived): a day holds chains of at most
CHAIN_LENGTH entries; each new entry writes the chain's next segment (put-if-absent) holding all of the
chain's entries, and the segment it supersedes is deleted. A reader lists the day folders and reads only
the last segment of each chain: `history` of 10,000 archives is one listing and 40 reads. Retention
deletes whole days (an archive is kept at least archiveRetention, at most a day more).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Final, TypeVar

from .blobs import BlobStore
from .documents import decode_document, encode_document, refs_in
from .errors import StateUnverifiable, StoreUnavailable

ARCHIVES_FOLDER: Final = "_archives"  # "_" starts no namespace: no Run's blobs are here
ARCHIVE_KIND: Final = "RunArchive"
INDEX_KIND: Final = "RunArchiveIndex"
INDEX_FOLDER: Final = "_index"  # no Run is named so (a Run's name is a DNS subdomain)
CHAIN_LENGTH: Final = 256
# Concurrent reads of index segments or archives by one reader.
READ_CONCURRENCY: Final = 16
# How often an index append retries when another writer took the segment it meant to write.
APPEND_TRIES: Final = 20
T = TypeVar("T")
_SEGMENT: Final = re.compile(r"/(\d{4}-\d{2}-\d{2})/(\d{6})-(\d{6})\.json$")


def archives_prefix(store: BlobStore) -> str:
    """`<store prefix>/_archives/`: where archives and their index live (the collector's roots)."""
    return store.location.key(ARCHIVES_FOLDER) + "/"


def archive_key(store: BlobStore, namespace: str, name: str, uid: str, version: str | None = None) -> str:
    """Where the archive of Run `namespace/name` with `uid` is: `<uid>.json`; `<uid>-<version>.json` for
    a later version of the Run when that key holds an earlier one (a Run changed after its archive was
    written and before its delete: the delete is refused, and the changed Run is archived again)."""
    store.key_for(namespace, uid, "0" * 64)  # checks the namespace and uid as a blob key would
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name):
        raise ValueError(f"not a Run name: {name!r}")
    if version is not None and not re.fullmatch(r"[0-9A-Za-z]{1,64}", version):
        raise ValueError(f"not a resourceVersion: {version!r}")
    leaf = f"{uid}.json" if version is None else f"{uid}-{version}.json"
    return store.location.key(ARCHIVES_FOLDER, namespace, name, leaf)


def index_prefix(store: BlobStore, namespace: str) -> str:
    return store.location.key(ARCHIVES_FOLDER, namespace, INDEX_FOLDER) + "/"


@dataclass(frozen=True)
class ArchiveEntry:
    """One archived Run as the index lists it: what `history` shows, and where its archive is (key,
    sha256 and size: what a read verifies)."""

    namespace: str
    name: str
    uid: str
    phase: str
    created_time: str | None
    finished_time: str | None
    archived_time: str
    key: str
    sha256: str
    size: int
    attempts: int = 0
    usage: Mapping[str, Any] | None = None

    @property
    def day(self) -> str:
        return self.archived_time[:10]

    def to_json(self) -> dict[str, Any]:
        value = asdict(self)
        value["usage"] = dict(self.usage) if self.usage is not None else None
        return value

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> ArchiveEntry:
        """An entry as an index segment lists it; TypeError or ValueError when it is not one."""
        fields: dict[str, Any] = {name: value[name] for name in cls.__dataclass_fields__ if name in value}
        entry = cls(**fields)
        names = (entry.namespace, entry.name, entry.uid, entry.key, entry.sha256)
        if not all(isinstance(name, str) for name in names):
            raise ValueError("an index entry names its Run and archive by strings")
        return entry


@dataclass(frozen=True)
class RunSummary:
    """What the operator knows of the Run it archives, for its index entry."""

    namespace: str
    name: str
    uid: str
    phase: str
    created_time: str | None
    finished_time: str | None
    attempts: int = 0
    usage: Mapping[str, Any] | None = None


# ---- writing (the operator) ----------------------------------------------------------------------------


async def write_archive(
    store: BlobStore, summary: RunSummary, version: str, body: Mapping[str, Any], archived_time: datetime
) -> ArchiveEntry:
    """Writes the archive of the Run at resourceVersion `version` (put-if-absent), reads it back and
    verifies it, and returns its index entry (not indexed yet: `index_archive`). An archive of this
    version already there (written before an operator restart) is kept. Raises StoreUnavailable or
    StoreRefused when the store cannot do it now, StateUnverifiable when what is read back is not what
    was meant."""
    document = {
        "run": {
            "namespace": summary.namespace,
            "name": summary.name,
            "uid": summary.uid,
            "resourceVersion": version,
        },
        "archivedTime": archived_time.strftime("%Y-%m-%dT%H:%M:%SZ"),
        **body,
    }
    data = encode_document(ARCHIVE_KIND, list(refs_in(dict(body))), document)
    for key in (
        archive_key(store, summary.namespace, summary.name, summary.uid),
        archive_key(store, summary.namespace, summary.name, summary.uid, version),
    ):
        if not await store.put_new(key, data):
            existing = await store.read_key(key)
            if existing is None:  # deleted between our put and read (retention): try again later
                raise StoreUnavailable("put", key, "the archive vanished right after it was found")
            if _check_archive(key, existing, summary.uid)["run"].get("resourceVersion") != version:
                continue  # an earlier version of the Run: this one goes to the next key
            data = existing
        stored = await store.read_key(key)
        digest = hashlib.sha256(data).hexdigest()
        if stored is None or hashlib.sha256(stored).hexdigest() != digest:
            raise StateUnverifiable(key, "the archive read back is not the one written")
        found = _check_archive(key, stored, summary.uid)
        return ArchiveEntry(
            summary.namespace,
            summary.name,
            summary.uid,
            summary.phase,
            summary.created_time,
            summary.finished_time,
            str(found["archivedTime"]),
            key,
            digest,
            len(stored),
            summary.attempts,
            summary.usage,
        )
    raise StateUnverifiable(key, f"holds another version of the Run, not resourceVersion {version}")


async def index_archive(store: BlobStore, entry: ArchiveEntry) -> bool:
    """Adds the entry to its namespace's index: a new segment of the day's last chain, put-if-absent (a
    writer that lost the race lists again). Nothing when that chain lists it already (an archive
    indexed before an operator restart); a duplicate in an older chain is harmless: readers keep one
    entry per uid, the latest archived. Returns whether it was added now."""
    prefix = index_prefix(store, entry.namespace) + entry.day + "/"
    added = False
    for _ in range(APPEND_TRIES):
        heads = _heads(await store.list_keys(prefix))
        chain, seq, entries = 0, -1, list[ArchiveEntry]()
        if heads:
            (_, chain), (seq, last) = max(heads.items())
            found = await _segment_entries(store, last)
            if found is None:
                continue  # superseded meanwhile: list again
            entries = found
        if any(e.key == entry.key for e in entries):
            return added
        if len(entries) >= CHAIN_LENGTH:
            chain, seq, entries = chain + 1, -1, []
        target = f"{prefix}{chain:06d}-{seq + 1:06d}.json"
        body = {"namespace": entry.namespace, "entries": [e.to_json() for e in (*entries, entry)]}
        if await store.put_new(target, encode_document(INDEX_KIND, [], body)):
            if seq >= 0:
                await store.delete_key(f"{prefix}{chain:06d}-{seq:06d}.json")  # superseded
            added = True
            if await _is_head(store, prefix, (entry.day, chain), seq + 1):
                return True
            # A later segment was there already: ours took the key of one deleted as superseded while we
            # read (a chain's last segment only grows, so ours is no reader's). The loop appends again
            # to the chain's last segment, unless that one holds the entry by now.
            await store.delete_key(target)
    raise StoreUnavailable("put", prefix, f"the index was taken {APPEND_TRIES} times in a row")


# ---- reading (people, the operator, a fork) ------------------------------------------------------------


async def archived_runs(store: BlobStore, namespace: str) -> list[ArchiveEntry]:
    """The namespace's archived Runs, from its index (one listing, one read per chain), oldest first."""
    found: dict[str, ArchiveEntry] = {}
    for _ in range(APPEND_TRIES):
        heads = _heads(await store.list_keys(index_prefix(store, namespace)))
        segments = await _gather(_segment_entries(store, key) for _, key in heads.values())
        listed = sorted((e for entries in segments for e in entries or ()), key=lambda e: e.archived_time)
        found.update((e.uid, e) for e in listed)
        if all(entries is not None for entries in segments):
            break  # else a chain grew between the listing and the read: list again
    return sorted(found.values(), key=lambda e: (e.archived_time, e.name, e.uid))


async def archived_namespaces(store: BlobStore) -> list[str]:
    """The namespaces with archives."""
    folders = await store.list_folders(archives_prefix(store))
    return [folder.rstrip("/").rsplit("/", 1)[-1] for folder in folders]


async def read_archive(
    store: BlobStore, namespace: str, name: str, uid: str | None = None
) -> tuple[ArchiveEntry, dict[str, Any]]:
    """The archive of Run `name` (the one with `uid`, else the latest archived), verified against its
    index entry: (entry, document). LookupError when there is none; StateUnverifiable when the bytes are
    missing or not the ones indexed."""
    matching = [e for e in await archived_runs(store, namespace) if e.name == name]
    if uid is not None:
        matching = [e for e in matching if e.uid == uid]
    if not matching:
        which = f" with uid {uid}" if uid else ""
        raise LookupError(f"no archive of Run {name}{which} in namespace {namespace}")
    entry = matching[-1]
    return entry, await read_entry(store, entry)


async def read_entry(store: BlobStore, entry: ArchiveEntry) -> dict[str, Any]:
    """The archive an index entry names, its size and sha256 checked."""
    data = await store.read_key(entry.key)
    if data is None:
        raise StateUnverifiable(entry.key, "no archive at this key (deleted by retention?)", missing=True)
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != entry.size or digest != entry.sha256:
        raise StateUnverifiable(
            entry.key, f"{len(data)} bytes with sha256 {digest}, the index names {entry.sha256}"
        )
    return _check_archive(entry.key, data, entry.uid)


# ---- retention (the operator) --------------------------------------------------------------------------


async def index_days(store: BlobStore, namespace: str) -> list[str]:
    """The days the namespace's index has segments for."""
    folders = await store.list_folders(index_prefix(store, namespace))
    return [folder.rstrip("/").rsplit("/", 1)[-1] for folder in folders]


async def delete_day(store: BlobStore, namespace: str, day: str) -> int:
    """Deletes the archives the namespace's index lists for `day`, then the day's index segments (in
    that order: a pass interrupted between them is repeated, never leaving an archive unlisted).
    Returns how many archives were deleted."""
    prefix = index_prefix(store, namespace) + day + "/"
    keys = await store.list_keys(prefix)
    segments = await _gather(_segment_entries(store, key) for _, key in _heads(keys).values())
    archives = {entry.key for entries in segments for entry in entries or ()}
    await _gather(store.delete_key(key) for key in sorted(archives))
    await _gather(store.delete_key(key) for key in keys)
    return len(archives)


# ---- helpers -------------------------------------------------------------------------------------------


def _check_archive(key: str, data: bytes, uid: str) -> dict[str, Any]:
    try:
        document = decode_document(data)
    except ValueError as error:
        raise StateUnverifiable(key, str(error)) from None
    run = document.get("run") or {}
    if document.get("kind") != ARCHIVE_KIND or run.get("uid") != uid:
        raise StateUnverifiable(key, f"not the archive of the Run with uid {uid}")
    return document


def _heads(keys: Sequence[str]) -> dict[tuple[str, int], tuple[int, str]]:
    """The last segment of each chain: (day, chain) -> (seq, key)."""
    heads: dict[tuple[str, int], tuple[int, str]] = {}
    for key in keys:
        found = _SEGMENT.search(key)
        if found is None:
            continue
        chain, seq = (found.group(1), int(found.group(2))), int(found.group(3))
        if chain not in heads or heads[chain][0] < seq:
            heads[chain] = (seq, key)
    return heads


async def _is_head(store: BlobStore, prefix: str, chain: tuple[str, int], seq: int) -> bool:
    """Whether segment `seq` is its chain's last, as a listing now shows."""
    head = _heads(await store.list_keys(prefix)).get(chain)
    return head is not None and head[0] == seq


async def _segment_entries(store: BlobStore, key: str) -> list[ArchiveEntry] | None:
    """A segment's entries; None when it is gone (superseded between a listing and this read)."""
    data = await store.read_key(key)
    if data is None:
        return None
    try:
        document = decode_document(data)
        return [ArchiveEntry.from_json(value) for value in document.get("entries") or []]
    except (ValueError, TypeError) as error:
        raise StateUnverifiable(key, f"not an archive index segment: {error}") from None


async def _gather(jobs: Iterable[Awaitable[T]]) -> list[T]:
    """The jobs' results in order, at most READ_CONCURRENCY at a time."""
    limit = asyncio.Semaphore(READ_CONCURRENCY)

    async def bounded(job: Awaitable[T]) -> T:
        async with limit:
            return await job

    return list(await asyncio.gather(*(bounded(job) for job in jobs)))
