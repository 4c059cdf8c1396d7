"""LangGraph checkpoints in the agent-state store: a manifest per checkpoint, a blob per channel version,
and append-only lists written as their new items only.

With a state store, a LangGraph checkpoint is a small Checkpoint object (ids, parent, delta seeds) whose
`stateRef` names its **manifest**, a document (statestore.documents, every blob it names in `refs`):
- the checkpoint without its values and its metadata (LangGraph's serde, small);
- per channel, its value: inline when tiny, else the sha256 of a blob of `dumps_typed(value)`. A channel
  whose version did not change since the parent names the parent's blob: nothing is written again;
- per list channel, a **list document**: the list's items as segments (blobs of consecutive items),
  up to SEGMENTS_PER_NODE per document, and the previous document holding the segments before them. A
  list that extends its previous version (messages with operator.add or add_messages) writes only
  its new items: one new segment, in a new list document that names the ones before. A new item that
  a pending write of the parent also holds is stored as that write's own blob (one blob, not two);
- the parent's pending writes as this saver knew them when the checkpoint was saved;
- the parent's manifest, when delta channels of this checkpoint are rebuilt from ancestors, so that the
  delta-history walk reads the store, not the Checkpoint objects retention may have pruned.

Every read goes through the store's verified get (size and sha256 against the reference); a blob
missing or changed is StateUnverifiable, never a shorter value. Bytes written per checkpoint grow with
the change, not with the thread: the manifest and the newest list document are bounded by the graph's
channels and SEGMENTS_PER_NODE, not by the history.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import copy
import hashlib
import json
from collections import OrderedDict
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, TypeVar

from agentrun.clock import Clock, SystemClock
from agentrun.statestore import BlobRef
from agentrun.statestore.documents import decode_document, encode_document
from agentrun.worker import RunBlobs, StateUnverifiable

MANIFEST_KIND: Final = "LangGraphCheckpoint"
LIST_KIND: Final = "LangGraphList"
# Documents are written in format 2 (a list's newest segments in the manifest's channel entry, small
# segments inline); format 1 (every list in list documents, every segment a blob) is read as before.
FORMAT: Final = 2
READABLE_FORMATS: Final = (1, 2)
# Serialized values up to this many bytes stay inline (in a manifest, a Writes object): a store request
# costs more than they do, and they do not grow with the thread.
INLINE_LIMIT: Final = 512
# Segments one list node (the manifest's list entry, or a list document) names before it starts a new
# one that points at it: bounds the bytes a superstep rewrites (~300 bytes a segment) against the
# documents a reader walks (items / this).
SEGMENTS_PER_NODE: Final = 16
# Bytes of inline segments (each at most INLINE_LIMIT) a manifest's list entry carries: past this, the
# entry's segments go to a list document of their own and the next entry starts after it.
INLINE_NODE_BYTES: Final = 2048
# Blobs fetched at once when a list is read back.
READ_CONCURRENCY: Final = 16
_DOCUMENT_CACHE: Final = 4096
_VALUE_CACHE: Final = 256
# A blob this saver put moments ago is referenced again without a request (a checkpoint's new list
# item that its task's pending write has just stored) only this long after its put: far below the
# collector's grace period, so it cannot have been collected meanwhile.
RECENT_SECONDS: Final = 60.0
# Blob bytes this saver put or read and verified, kept to answer another read of the same digest (a
# list's segments are shared by every checkpoint holding them): bytes whose sha256 is their key.
_BYTES_CACHE: Final = 64 * 1024 * 1024
# Lists (by their list document) whose items this saver serialized or read back and verified, kept as
# those very objects: a new version of the list that starts with the same objects extends it.
_LIST_CACHE: Final = 16

JsonDict = dict[str, Any]
Typed = tuple[str, bytes]
T = TypeVar("T")


class Serde(Protocol):
    def dumps_typed(self, obj: Any) -> Typed: ...

    def loads_typed(self, data: Typed) -> Any: ...


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@dataclass(frozen=True)
class Segment:
    """Consecutive items of a list: `count` items serialized as a list, or one item (`single`); in a blob
    (its sha256) or, when at most INLINE_LIMIT bytes, inline (`data`, checked against the sha256)."""

    sha: str
    count: int
    type: str
    single: bool
    data: bytes | None = None

    def to_json(self) -> list[Any]:
        if self.data is None:
            return [self.sha, self.count, self.type, self.single]
        return [self.sha, self.count, self.type, self.single, _b64(self.data)]

    @classmethod
    def from_json(cls, value: Any) -> Segment:
        sha, count, type_, single, *inline = value
        if not isinstance(sha, str) or not isinstance(count, int) or count < 1 or len(inline) > 1:
            raise ValueError("a segment is [sha256, count >= 1, type, single] or with its data inline")
        data: bytes | None = None
        if inline:
            if not isinstance(inline[0], str):
                raise ValueError("a segment's inline data is base64")
            data = base64.b64decode(inline[0], validate=True)
            if sha256(data) != sha:
                raise ValueError(f"a segment's inline data does not have the sha256 {sha}")
        return cls(sha, count, str(type_), bool(single), data)


def list_key(entry: Mapping[str, Any]) -> str:
    """What identifies one version of a list: the digest of its manifest entry (which names its list
    document, or holds its newest segments and names the document before them)."""
    return sha256(json.dumps(entry, sort_keys=True, separators=(",", ":")).encode())


def is_list_entry(entry: Mapping[str, Any] | None) -> bool:
    if entry is None:
        return False
    return isinstance(entry.get("list"), str) or isinstance(entry.get("segments"), list)


@dataclass(frozen=True)
class Document:
    """A verified document of the store: its reference, its body, and the blobs it names by sha256."""

    ref: BlobRef
    body: JsonDict
    refs: dict[str, BlobRef]

    def named(self, sha: str) -> BlobRef:
        if sha not in self.refs:
            raise StateUnverifiable(
                f"the state-store document {self.ref.key} names the blob {sha} without its reference: it "
                "was not written by the saver and is not loaded",
                key=self.ref.key,
            )
        return self.refs[sha]


@dataclass(frozen=True)
class Write:
    """One pending write as stored: its value inline ({type, data}) or in a blob ({type, ref})."""

    task_id: str
    task_path: str
    idx: int
    channel: str
    stored: JsonDict

    @property
    def ref(self) -> BlobRef | None:
        ref = self.stored.get("ref")
        return BlobRef.from_json(ref) if isinstance(ref, Mapping) else None

    def digest(self) -> str:
        if (ref := self.ref) is not None:
            return ref.sha256
        return sha256(base64.b64decode(self.stored["data"]))


@dataclass(frozen=True)
class Applied:
    """A pending write as a list's new items are matched against it: where it sorts, its channel, and
    the digest of its serialized value."""

    task_path: str
    task_id: str
    idx: int
    channel: str
    type: str
    sha: str

    @classmethod
    def of(cls, write: Write) -> Applied:
        encoding = str(write.stored.get("type"))
        return cls(write.task_path, write.task_id, write.idx, write.channel, encoding, write.digest())


class _Item:
    """One list item as this saver stored or read it: the object, its attribute values then (a field
    reassigned in place is not the stored item), and a deep copy of whatever in it is mutable (a dict,
    a list, the item itself when it is a container): a change inside those, made in place, is seen too.
    An item whose mutable parts cannot be copied or compared is never taken as held (bytes decide)."""

    __slots__ = ("fields", "ids", "item", "mutable", "parts")

    def __init__(self, item: Any) -> None:
        self.item = item
        self.fields = _fields(item)  # held here, so their ids stay theirs while this lives
        self.ids = tuple(map(id, self.fields))
        self.parts = _mutable_parts(item, self.fields)
        try:
            self.mutable: tuple[Any, ...] | None = copy.deepcopy(self.parts)
        except Exception:  # an object deepcopy cannot take: compare its bytes instead
            self.mutable = None

    def holds(self, item: Any) -> bool:
        # Called for every item of a list at every superstep: comparisons made by the interpreter's C
        # code (ids of the fields now against theirs then; the parts against their deep copies), not a
        # Python loop per field, so that a list of 400 messages costs ~0.5 ms, not ~1.5.
        if item is not self.item or self.mutable is None:
            return False
        if tuple(map(id, _fields(item))) != self.ids:  # a field reassigned, added or removed
            return False
        try:
            # the very objects the fields held then, so the same mutable parts: changed in place?
            return bool(self.parts == self.mutable)
        except Exception:  # an __eq__ that refuses: not known to be unchanged
            return False


_ATOMS: Final = (str, bytes, int, float, complex, bool, type(None))


def _fields(item: Any) -> tuple[Any, ...]:
    """An object's attribute values (a pydantic model's fields, and its extra fields, kept apart)."""
    attributes = getattr(item, "__dict__", None)
    found = tuple(attributes.values()) if isinstance(attributes, dict) else ()
    extra = getattr(item, "__pydantic_extra__", None)
    return (*found, *extra.values()) if isinstance(extra, dict) else found


def _mutable_parts(item: Any, fields: tuple[Any, ...]) -> tuple[Any, ...]:
    """What of an item can change without a field being reassigned: its non-atomic field values, or
    the item itself when it has no fields (a dict or a list as a list item)."""
    if not fields:
        return () if isinstance(item, _ATOMS) else (item,)
    return tuple(value for value in fields if not isinstance(value, _ATOMS))


@dataclass
class Built:
    """A channel entry for a manifest and the blobs it names."""

    entry: JsonDict
    refs: list[BlobRef] = field(default_factory=list)


class ThreadBlobs:
    """A saver's access to one Run's blobs: verified reads, put-if-absent writes, documents cached by
    digest (immutable, verified once), and the decoded values of recent pending writes (to find a new
    list item that a write already stored)."""

    def __init__(self, blobs: RunBlobs, clock: Clock | None = None) -> None:
        self.blobs = blobs
        self.clock = clock or SystemClock()  # how recent a put is: on its monotonic clock
        self._documents: OrderedDict[str, Document] = OrderedDict()
        self._values: OrderedDict[str, Any] = OrderedDict()
        # puts under way (one request for the same bytes at once) and done lately: sha256 -> (put, when)
        self._puts: dict[tuple[int, str], asyncio.Future[BlobRef]] = {}
        self._recent: OrderedDict[str, tuple[BlobRef, float]] = OrderedDict()
        self._bytes: OrderedDict[str, bytes] = OrderedDict()
        self._bytes_held = 0
        self._lists: OrderedDict[str, list[_Item]] = OrderedDict()
        self.written = 0  # bytes this saver put (created or found already there), for measurements

    # ---- blobs ---------------------------------------------------------------------------------------

    def _fresh(self, put_at: float) -> bool:
        """A put this recent is trusted without a request (RECENT_SECONDS)."""
        return self.clock.monotonic() - put_at < RECENT_SECONDS

    async def put(self, data: bytes, known: Mapping[str, BlobRef] | None = None) -> BlobRef:
        """The reference of `data`: one a live object already names, or that this saver put moments ago
        (no request); the put under way of the same bytes (waited for); else put."""
        digest = sha256(data)
        if known is not None and (ref := known.get(digest)) is not None and ref.size == len(data):
            return BlobRef(ref.key, ref.sha256, ref.size)
        if (recent := self._recent.get(digest)) is not None and self._fresh(recent[1]):
            return recent[0]
        loop = asyncio.get_running_loop()
        key = (id(loop), digest)
        if (running := self._puts.get(key)) is not None:
            return await asyncio.shield(running)
        future: asyncio.Future[BlobRef] = loop.create_future()
        self._puts[key] = future
        try:
            ref = await self.blobs.put_bytes(data)
        except BaseException as exc:
            if isinstance(exc, Exception):
                future.set_exception(exc)
                future.exception()  # retrieved here: waiters, if any, get it too
            else:
                future.cancel()
            raise
        finally:
            self._puts.pop(key, None)
        future.set_result(ref)
        self._keep(digest, data)
        self.written += len(data)
        self._recent[digest] = (ref, self.clock.monotonic())
        while len(self._recent) > _VALUE_CACHE:
            self._recent.popitem(last=False)
        return ref

    async def get(self, ref: BlobRef) -> bytes:
        """The blob's bytes, verified: read from the store (size and sha256 checked), or bytes this saver
        already holds under that digest (checked when it put or read them)."""
        if (held := self._bytes.get(ref.sha256)) is not None and len(held) == ref.size:
            self._bytes.move_to_end(ref.sha256)
            return held
        data = await self.blobs.get_bytes(BlobRef(ref.key, ref.sha256, ref.size))
        self._keep(ref.sha256, data)
        return data

    def _keep(self, digest: str, data: bytes) -> None:
        if len(data) > _BYTES_CACHE // 8 or digest in self._bytes:
            return
        self._bytes[digest] = data
        self._bytes_held += len(data)
        while self._bytes_held > _BYTES_CACHE:
            _, dropped = self._bytes.popitem(last=False)
            self._bytes_held -= len(dropped)

    async def put_document(self, kind: str, refs: Iterable[BlobRef], body: JsonDict) -> Document:
        named = list(refs)
        data = encode_document(kind, named, body)
        ref = await self.put(data)  # awaited here, not a task: no turn of the event loop before it starts
        document = Document(
            BlobRef(ref.key, ref.sha256, ref.size, links=True), body, {r.sha256: r for r in named}
        )
        self._remember(document)
        return document

    def reserve(
        self, data: bytes, known: Mapping[str, BlobRef] | None = None
    ) -> tuple[BlobRef, asyncio.Future[BlobRef] | None]:
        """The reference of `data` at once (its content address), and its put, started: None when no
        request is needed (a live object names it already, or this saver put it moments ago). The
        caller awaits the put before any Checkpoint object names the reference, directly or through a
        document (write_manifest says why a document may be put at the same time as what it names)."""
        digest = sha256(data)
        if known is not None and (ref := known.get(digest)) is not None and ref.size == len(data):
            return BlobRef(ref.key, ref.sha256, ref.size), None
        if (recent := self._recent.get(digest)) is not None and self._fresh(recent[1]):
            return recent[0], None
        store = self.blobs.store
        ref = BlobRef(store.key_for(self.blobs.namespace, self.blobs.run_uid, digest), digest, len(data))

        async def put() -> BlobRef:
            done = await self.put(data)  # `known` was looked at above (the caller may add this ref to it)
            if (done.key, done.sha256, done.size) != (ref.key, ref.sha256, ref.size):
                raise StateUnverifiable(f"the blob {ref.key} was stored as {done.key}: not referenced")
            return done

        return ref, asyncio.ensure_future(put())

    def reserve_document(
        self, kind: str, refs: Iterable[BlobRef], body: JsonDict
    ) -> tuple[Document, asyncio.Future[BlobRef] | None]:
        """A document naming `refs` (reserve): known to this saver's reads only once its put succeeded."""
        named = list(refs)
        ref, put = self.reserve(encode_document(kind, named, body))
        document = Document(
            BlobRef(ref.key, ref.sha256, ref.size, links=True), body, {r.sha256: r for r in named}
        )
        if put is None:
            self._remember(document)
        else:
            put.add_done_callback(
                lambda done: None if done.cancelled() or done.exception() else self._remember(document)
            )
        return document, put

    async def document(self, ref: BlobRef, kind: str) -> Document:
        if (found := self._documents.get(ref.sha256)) is not None:
            self._documents.move_to_end(ref.sha256)
            return found
        data = await self.get(ref)
        try:
            raw = decode_document(data)
            if raw.get("kind") != kind or raw.get("format") not in READABLE_FORMATS:
                raise ValueError(f"not a {kind} document of format {' or '.join(map(str, READABLE_FORMATS))}")
            named = [BlobRef.from_json(r) for r in raw.pop("refs")]
        except (ValueError, TypeError) as exc:
            raise StateUnverifiable(
                f"the state-store document {ref.key} is not a readable {kind}: {exc}", key=ref.key
            ) from None
        raw.pop("kind")
        linked = BlobRef(ref.key, ref.sha256, ref.size, links=True)
        document = Document(linked, raw, {r.sha256: r for r in named})
        self._remember(document)
        return document

    def _remember(self, document: Document) -> None:
        self._documents[document.ref.sha256] = document
        while len(self._documents) > _DOCUMENT_CACHE:
            self._documents.popitem(last=False)

    # ---- values --------------------------------------------------------------------------------------

    async def store_value(
        self, typed: Typed, known: Mapping[str, BlobRef] | None = None
    ) -> tuple[JsonDict, BlobRef | None]:
        """A serialized value as a Writes object records it: inline when tiny, else a blob reference."""
        encoding, data = typed
        if len(data) <= INLINE_LIMIT:
            return {"type": encoding, "data": _b64(data)}, None
        ref = await self.put(data, known)
        return {"type": encoding, "ref": ref.to_json()}, ref

    async def load_value(self, stored: Mapping[str, Any], serde: Serde, what: str) -> Any:
        """A value recorded by store_value (inline or a verified blob), decoded."""
        try:
            encoding = str(stored["type"])
            if isinstance(stored.get("ref"), Mapping):
                ref = BlobRef.from_json(stored["ref"])
                data = await self.get(ref)
                value = serde.loads_typed((encoding, data))
                self.remember_value(ref.sha256, value)
                return value
            return serde.loads_typed((encoding, base64.b64decode(stored["data"])))
        except (KeyError, ValueError, TypeError) as exc:
            raise StateUnverifiable(f"{what} is not a readable stored value: {exc}") from None

    def remember_value(self, sha: str, value: Any) -> None:
        self._values[sha] = value
        self._values.move_to_end(sha)
        while len(self._values) > _VALUE_CACHE:
            self._values.popitem(last=False)

    def value_of(self, sha: str) -> tuple[bool, Any]:
        if sha in self._values:
            return True, self._values[sha]
        return False, None

    # ---- lists ---------------------------------------------------------------------------------------

    def remember_list(self, head: str, items: Sequence[Any], base: str | None = None) -> None:
        """The items of the list document `head` (its sha256), as this saver serialized them or read
        them back verified: the very objects. `base`: a list known here that `items` start with."""
        known = self._lists.get(base) if base is not None else None
        if known is not None and len(known) <= len(items):
            self._lists[head] = [*known, *(_Item(item) for item in items[len(known) :])]
        else:
            self._lists[head] = [_Item(item) for item in items]
        self._lists.move_to_end(head)
        while len(self._lists) > _LIST_CACHE:
            self._lists.popitem(last=False)

    def starts_with_list(self, value: Sequence[Any], head: str, count: int) -> bool:
        """Whether `value` starts with the items of the list document `head` as this saver stored or
        read them: the same objects, no field of them reassigned since. False says only "not known
        here" (another saver's list, another object of the same content): the caller compares bytes."""
        known = self._lists.get(head)
        if known is None or len(known) != count or len(value) < count:
            return False
        self._lists.move_to_end(head)
        return all(stored.holds(item) for stored, item in zip(known, value, strict=False))

    def node_segments(self, body: Mapping[str, Any], owner: Document) -> list[tuple[Segment, BlobRef | None]]:
        """The segments one list node holds (a list document's body, or a manifest's list entry), with
        the blob each names in `owner` (None: inline)."""
        found: list[tuple[Segment, BlobRef | None]] = []
        for raw in body.get("segments", []):
            try:
                segment = Segment.from_json(raw)
            except (ValueError, TypeError, binascii.Error) as exc:
                raise StateUnverifiable(
                    f"the list in {owner.ref.key} has a malformed segment: {exc}", key=owner.ref.key
                ) from None
            found.append((segment, None if segment.data is not None else owner.named(segment.sha)))
        return found

    async def chain(self, body: Mapping[str, Any], owner: Document) -> list[tuple[Segment, BlobRef | None]]:
        """Every segment of the list whose newest node is `body` (named in `owner`), oldest first: the
        node's own, after those of the list documents its `prev` names, back to the first."""
        parts: list[list[tuple[Segment, BlobRef | None]]] = []
        while True:
            parts.append(self.node_segments(body, owner))
            prev = body.get("prev")
            if not isinstance(prev, str):
                break
            owner = await self.document(owner.named(prev), LIST_KIND)
            body = owner.body
        return [segment for part in reversed(parts) for segment in part]

    async def list_chain(
        self, entry: Mapping[str, Any], manifest: Document
    ) -> list[tuple[Segment, BlobRef | None]]:
        """The segments of a manifest's list entry: in its own list document (format 1), or its newest
        in the entry itself."""
        if isinstance(entry.get("list"), str):
            head = await self.document(manifest.named(entry["list"]), LIST_KIND)
            return await self.chain(head.body, head)
        return await self.chain(entry, manifest)

    async def segments(self, head: BlobRef) -> list[tuple[Segment, BlobRef | None]]:
        """The segments of the list whose newest list document is `head`, oldest first."""
        node = await self.document(head, LIST_KIND)
        return await self.chain(node.body, node)

    async def read_list(self, entry: Mapping[str, Any], manifest: Document, serde: Serde) -> list[Any]:
        """A manifest's list entry read back: every segment verified (a blob's sha256 and size, inline
        data against its sha256), the count checked."""
        count = int(entry["count"])
        segments = await self.list_chain(entry, manifest)
        gate = asyncio.Semaphore(READ_CONCURRENCY)

        async def load(segment: Segment, ref: BlobRef | None) -> list[Any]:
            if ref is None:
                assert segment.data is not None
                data = segment.data
            else:
                async with gate:
                    data = await self.get(ref)
            value = serde.loads_typed((segment.type, data))
            if segment.single:
                return [value]
            if not isinstance(value, list) or len(value) != segment.count:
                where = ref.key if ref is not None else manifest.ref.key
                raise StateUnverifiable(f"the list segment {where} does not hold {segment.count} items")
            return value

        parts = await asyncio.gather(*(load(s, r) for s, r in segments))
        items = [item for part in parts for item in part]
        if len(items) != count:
            raise StateUnverifiable(
                f"a list in {manifest.ref.key} holds {len(items)} items, its manifest says {count}: not "
                "loaded",
                key=manifest.ref.key,
            )
        self.remember_list(list_key(entry), items)
        return items


@dataclass(frozen=True)
class Parent:
    """What a new checkpoint reuses of its parent: its manifest (None: saved inline, or none)."""

    manifest: Document | None
    versions: Mapping[str, Any]
    writes: Sequence[Write]  # stored: the manifest records them
    staged: Sequence[Applied] = ()  # being stored now by this saver (their tasks finished just before)

    def applied(self) -> list[Applied]:
        """Every write of the parent known here, in the order LangGraph applied them."""
        found = {(w.task_id, w.idx): Applied.of(w) for w in self.writes}
        for staged in self.staged:
            found.setdefault((staged.task_id, staged.idx), staged)
        return sorted(found.values(), key=lambda a: (a.task_path, a.task_id, a.idx))

    def known(self) -> dict[str, BlobRef]:
        """Blobs that live objects name already (the parent's and its writes'): referenced, not put."""
        found: dict[str, BlobRef] = {}
        if self.manifest is not None:
            found.update(self.manifest.refs)
        for write in self.writes:
            if (ref := write.ref) is not None:
                found[ref.sha256] = ref
        return found


class ManifestWriter:
    """Builds one checkpoint's manifest from its parent's, writing only what changed."""

    def __init__(self, blobs: ThreadBlobs, serde: Serde, parent: Parent) -> None:
        self.blobs = blobs
        self.serde = serde
        self.parent = parent
        self.known = parent.known()
        self.puts: list[asyncio.Future[BlobRef]] = []  # started, awaited at once by write_manifest

    def _put(self, data: bytes) -> BlobRef:
        """The reference of `data`, its put started (ThreadBlobs.reserve) and awaited in settle()."""
        ref, put = self.blobs.reserve(data, self.known)
        if put is not None:
            self.puts.append(put)
        self.known[ref.sha256] = ref
        return ref

    async def settle(self) -> None:
        """Waits for every put started, the first failure raised once all have ended."""
        puts, self.puts = self.puts, []
        await all_of(puts)

    async def channel(self, name: str, value: Any, version: Any, changed: bool) -> Built:
        previous = self.parent.manifest.body.get("channels", {}).get(name) if self.parent.manifest else None
        if previous is not None and not changed and self.parent.versions.get(name) == version:
            return Built(previous, self._named(previous))
        if isinstance(value, list) and value:
            return await self._list(name, value, previous)
        typed = self.serde.dumps_typed(value)
        if len(typed[1]) <= INLINE_LIMIT:
            return Built({"type": typed[0], "data": _b64(typed[1])})
        ref = self._put(typed[1])
        return Built({"type": typed[0], "blob": ref.sha256}, [ref])

    def _named(self, entry: Mapping[str, Any]) -> list[BlobRef]:
        """The blobs a channel entry of the parent's manifest names."""
        manifest = self.parent.manifest
        assert manifest is not None
        sha = entry.get("blob") or entry.get("list")
        if isinstance(sha, str):
            return [manifest.named(sha)]
        if isinstance(entry.get("segments"), list):
            refs = [ref for _, ref in self.blobs.node_segments(entry, manifest) if ref is not None]
            prev = entry.get("prev")
            return [*refs, manifest.named(prev)] if isinstance(prev, str) else refs
        return []

    async def _list(self, name: str, value: list[Any], previous: Mapping[str, Any] | None) -> Built:
        """A list channel: when the value starts with the parent's list, its new items only, as segments
        in the new entry beside the parent entry's own (or after them, in a list document of their own,
        once the entry is full); else the whole list, anew."""
        carried: list[tuple[Segment, BlobRef | None]] = []  # the parent entry's own segments, kept
        prev: BlobRef | None = None  # the list document holding the items before `carried`
        prev_count = done = 0
        manifest = self.parent.manifest
        if manifest is not None and previous is not None and is_list_entry(previous):
            count = int(previous["count"])
            if self.blobs.starts_with_list(value, list_key(previous), count) or await self._extends(
                value, previous, manifest
            ):
                done = count
                if isinstance(previous.get("list"), str):  # format 1: a list document holds them all
                    prev, prev_count = manifest.named(previous["list"]), count
                else:
                    carried = self.blobs.node_segments(previous, manifest)
                    if isinstance(previous.get("prev"), str):
                        prev, prev_count = manifest.named(previous["prev"]), int(previous.get("prevCount", 0))
        tail = value[done:]
        if done and not tail and not isinstance(previous and previous.get("list"), str):
            assert previous is not None
            return Built(dict(previous), self._named(previous))
        new = await self._segments(name, tail)
        inline = sum(len(s.data) for s, _ in [*carried, *new] if s.data is not None)
        if carried and (len(carried) + len(new) > SEGMENTS_PER_NODE or inline > INLINE_NODE_BYTES):
            prev = await self._spill(carried, prev, prev_count)
            prev_count, carried = done, []
        segments = [*carried, *new]
        entry: JsonDict = {
            "count": len(value),
            "prev": prev.sha256 if prev is not None else None,
            "prevCount": prev_count,
            "segments": [segment.to_json() for segment, _ in segments],
        }
        refs = [ref for _, ref in segments if ref is not None] + ([prev] if prev is not None else [])
        base = list_key(previous) if done and previous is not None else None
        self.blobs.remember_list(list_key(entry), value, base)
        return Built(entry, refs)

    async def _spill(
        self, segments: list[tuple[Segment, BlobRef | None]], prev: BlobRef | None, prev_count: int
    ) -> BlobRef:
        """A full list entry's segments as a list document of their own (naming the one before)."""
        refs = [ref for _, ref in segments if ref is not None] + ([prev] if prev is not None else [])
        body = {
            "format": FORMAT,
            "prev": prev.sha256 if prev is not None else None,
            "prevCount": prev_count,
            "segments": [segment.to_json() for segment, _ in segments],
        }
        document, put = self.blobs.reserve_document(LIST_KIND, refs, body)
        if put is not None:
            self.puts.append(put)
        return document.ref

    async def _extends(self, value: list[Any], previous: Mapping[str, Any], manifest: Document) -> bool:
        """Whether `value` starts with exactly the items of the parent's list: each of its segments
        serialized again from `value` gives the same bytes (not mere equality: what is stored is what
        a reader gets back). Only for a list whose items this saver does not hold (starts_with_list):
        the whole list is serialized again."""
        done = 0
        for segment, _ in await self.blobs.list_chain(previous, manifest):
            if done + segment.count > len(value):
                return False
            chunk = value[done] if segment.single else value[done : done + segment.count]
            encoding, data = self.serde.dumps_typed(chunk)
            if encoding != segment.type or sha256(data) != segment.sha:
                return False
            done += segment.count
        return True

    async def _segments(self, channel: str, tail: list[Any]) -> list[tuple[Segment, BlobRef | None]]:
        """The new items as segments: those the parent's pending writes of this channel hold (as a list
        or one item, in the order they were applied) are those writes' bytes (a blob already stored:
        no second put); the rest is one segment. A segment of at most INLINE_LIMIT bytes is inline."""
        aligned = self._aligned(channel, tail)
        start = len(tail) - sum(segment.count for segment, _ in aligned)
        pieces = list(aligned)
        if start > 0:
            encoding, data = self.serde.dumps_typed(tail[:start])
            pieces.insert(0, (Segment(sha256(data), start, encoding, False), data))
        found: list[tuple[Segment, BlobRef | None]] = []
        for segment, data in pieces:
            if len(data) <= INLINE_LIMIT:
                found.append((Segment(segment.sha, segment.count, segment.type, segment.single, data), None))
                continue
            found.append((segment, self._put(data)))
        return found

    def _aligned(self, channel: str, tail: list[Any]) -> list[tuple[Segment, bytes]]:
        """The parent's writes of `channel` that the end of `tail` holds, byte for byte, in order;
        none unless all of them match."""
        writes = [w for w in self.parent.applied() if w.channel == channel]
        values = [self.blobs.value_of(w.sha) for w in writes]
        if not writes or not all(known for known, _ in values):
            return []
        counts = [len(v) if isinstance(v, list) else 1 for _, v in values]
        offset = len(tail) - sum(counts)
        if offset < 0:
            return []
        aligned: list[tuple[Segment, bytes]] = []
        for write, (_, written), count in zip(writes, values, counts, strict=True):
            single = not isinstance(written, list)
            chunk = tail[offset] if single else tail[offset : offset + count]
            encoding, data = self.serde.dumps_typed(chunk)
            digest = sha256(data)
            if encoding != write.type or digest != write.sha:
                return []
            aligned.append((Segment(digest, count, encoding, single), data))
            offset += count
        return aligned


async def write_manifest(
    blobs: ThreadBlobs,
    serde: Serde,
    parent: Parent,
    *,
    checkpoint: Mapping[str, Any],
    metadata: Mapping[str, Any],
    new_versions: Mapping[str, Any],
    header: JsonDict,
    link_parent: bool,
) -> Document:
    """Writes the manifest of `checkpoint` (and the blobs of what changed since `parent`).

    Every put of the checkpoint is made at once: each channel's new blobs, the list documents, and the
    manifest itself (its bytes are known before any put ends: a blob's reference is its content
    address). It returns only when every one of them is stored, and the caller creates the Checkpoint
    object that names the manifest only then. Crash points: a document may become durable before a blob
    it names; until the object exists nothing names that document (readers start from Checkpoint
    objects, the collector's roots are their references), so a crash or a failed put in between leaves
    an unreferenced document, invisible and collected like an interrupted upload. A later checkpoint
    with the same bytes puts the blobs again (a reference is reused without a put only when a live
    object names it, or this saver's own put of it succeeded), and waits for them as well."""
    writer = ManifestWriter(blobs, serde, parent)
    try:
        manifest = await _build_manifest(
            writer,
            checkpoint=checkpoint,
            metadata=metadata,
            new_versions=new_versions,
            header=header,
            link_parent=link_parent,
        )
    except BaseException:
        with contextlib.suppress(Exception):
            await writer.settle()  # no put is left running behind the caller; its own error is raised
        raise
    await writer.settle()
    return manifest


async def _build_manifest(
    writer: ManifestWriter,
    *,
    checkpoint: Mapping[str, Any],
    metadata: Mapping[str, Any],
    new_versions: Mapping[str, Any],
    header: JsonDict,
    link_parent: bool,
) -> Document:
    blobs, serde, parent = writer.blobs, writer.serde, writer.parent
    values: Mapping[str, Any] = checkpoint.get("channel_values") or {}
    versions: Mapping[str, Any] = checkpoint.get("channel_versions") or {}
    channels: JsonDict = {}
    refs: list[BlobRef] = []
    names = sorted(values)
    built = await all_of(
        [writer.channel(name, values[name], versions.get(name), name in new_versions) for name in names]
    )
    for name, channel in zip(names, built, strict=True):
        channels[name] = channel.entry
        refs.extend(channel.refs)
    core = {k: v for k, v in checkpoint.items() if k != "channel_values"}
    writes = []
    for write in parent.writes:
        stored = dict(write.stored)
        if (ref := write.ref) is not None:
            refs.append(ref)
            stored = {"type": stored["type"], "blob": ref.sha256}
        writes.append([write.task_id, write.task_path, write.idx, write.channel, stored])
    body: JsonDict = {
        **header,
        "format": FORMAT,
        "checkpoint": _typed_json(serde.dumps_typed(core)),
        "metadata": _typed_json(serde.dumps_typed(dict(metadata))),
        "channels": channels,
        "parentWrites": writes,
    }
    if link_parent and parent.manifest is not None:
        body["parentManifest"] = parent.manifest.ref.sha256
        refs.append(parent.manifest.ref)
    if not writer.puts:  # nothing else to wait for: the manifest's put, started at once
        return await blobs.put_document(MANIFEST_KIND, refs, body)
    manifest, put = blobs.reserve_document(MANIFEST_KIND, refs, body)
    if put is not None:
        writer.puts.append(put)
    return manifest


async def all_of(coroutines: Sequence[Awaitable[T]]) -> list[T]:
    """Runs independent coroutines (or puts already started) at once and waits for every one; the first
    failure is raised once all have ended (none is left running behind the caller)."""
    done = await asyncio.gather(*coroutines, return_exceptions=True)
    for outcome in done:
        if isinstance(outcome, BaseException):
            raise outcome
    return done  # type: ignore[return-value]


def _typed_json(typed: Typed) -> JsonDict:
    return {"type": typed[0], "data": _b64(typed[1])}


def _typed_of(value: Any, what: str) -> Typed:
    if not isinstance(value, Mapping) or not isinstance(value.get("data"), str):
        raise StateUnverifiable(f"{what} is not a readable stored value")
    return str(value.get("type")), base64.b64decode(value["data"])


@dataclass(frozen=True)
class Read:
    """A manifest read back: the checkpoint with its values, its metadata, its parent's writes."""

    checkpoint: dict[str, Any]
    metadata: dict[str, Any]


def core_of(manifest: Document, serde: Serde) -> dict[str, Any]:
    """The checkpoint without its values (ids, versions, versions seen)."""
    core: dict[str, Any] = serde.loads_typed(_typed_of(manifest.body.get("checkpoint"), manifest.ref.key))
    return core


def metadata_of(manifest: Document, serde: Serde) -> dict[str, Any]:
    metadata: dict[str, Any] = serde.loads_typed(_typed_of(manifest.body.get("metadata"), manifest.ref.key))
    return metadata


async def channel_value(blobs: ThreadBlobs, manifest: Document, name: str, serde: Serde) -> Any:
    what = f"the channel {name} of {manifest.ref.key}"
    try:
        entry = manifest.body["channels"][name]
        if is_list_entry(entry):
            return await blobs.read_list(entry, manifest, serde)
        if isinstance(entry.get("blob"), str):
            ref = manifest.named(entry["blob"])
            return serde.loads_typed((str(entry.get("type")), await blobs.get(ref)))
        return serde.loads_typed(_typed_of(entry, what))
    except (KeyError, ValueError, TypeError, AttributeError) as exc:  # a manifest not written by a saver
        raise StateUnverifiable(f"{what} is not readable: {exc!r}", key=manifest.ref.key) from None


async def read_manifest(blobs: ThreadBlobs, manifest: Document, serde: Serde) -> Read:
    """The whole checkpoint a manifest names: every channel value read and verified."""
    checkpoint = core_of(manifest, serde)
    names = sorted(manifest.body.get("channels", {}))
    values = await asyncio.gather(*(channel_value(blobs, manifest, n, serde) for n in names))
    checkpoint["channel_values"] = dict(zip(names, values, strict=True))
    return Read(checkpoint, metadata_of(manifest, serde))


def parent_writes(manifest: Document) -> list[Write]:
    """The parent's pending writes as the manifest recorded them (blob references resolved)."""
    found = []
    try:
        for task_id, task_path, idx, channel, stored in manifest.body.get("parentWrites", []):
            entry = dict(stored)
            if isinstance(entry.get("blob"), str):
                entry = {"type": entry["type"], "ref": manifest.named(entry.pop("blob")).to_json()}
            found.append(Write(str(task_id), str(task_path), int(idx), str(channel), entry))
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise StateUnverifiable(
            f"the pending writes in {manifest.ref.key} are not readable: {exc!r}", key=manifest.ref.key
        ) from None
    return found
