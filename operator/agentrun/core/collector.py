"""The one collector's decisions (docs/state-store.md): which blobs of the state store to mark,
quarantine, restore and delete, given what one sweep saw. Plain functions: the operator's loop
(agentrun.operator.collector) does the listing, the reading and the moving.

Keys here are relative to the store's prefix:

    <namespace>/<run uid>/sha256/<hex>                a blob, readable where its references point
    _quarantine/<namespace>/<run uid>/sha256/<hex>    the same blob, moved away by the collector
    _archives/...                                     Runs' archives: roots, never collected here

(`_` cannot start a namespace name, so neither reserved prefix can be a namespace's.) Any other key is
not the collector's and is never touched.

The rules:
- **Young blobs are never touched.** A blob whose last-modified is less than the grace period ago is
  left alone, not even marked: it may be an upload whose referencing object is not written yet. The
  grace period is longer than any upload (the SDK's store timeouts).
- **Roots are gathered after the listing**, from fresh lists of every live Run, Attempt, Checkpoint and
  SideEffect (every field: any reference anywhere in the object), every document reachable through a
  `links` reference, and every archive (which, with what it names, stays until the archive's own
  retention, not decided here). An object written after the listing is then seen; one written before
  it was listed. A reference is a key, so a blob of one Run that another Run names (a fork shares its
  source's blobs) stays whatever happens to its own Run.
- **Never on partial knowledge.** A document that cannot be read (missing, not its digest, not a
  document) holds its namespace: nothing there is marked, quarantined or deleted in that sweep (a
  document of one Run may name blobs of any Run of its namespace: forks). When the roots are not
  complete at all (an archive that cannot be read), nothing anywhere is. Holding never stops a restore.
- **Mark, quarantine, delete.** The first sweep that sees an old-enough blob unreferenced marks it;
  a later sweep that still sees it unreferenced once the grace period has passed since the mark
  quarantines it: copied under `_quarantine/` and deleted from its key, so a writer's later
  put-if-absent creates it afresh instead of verifying a blob that is about to go. A quarantined blob
  still unreferenced a second period (`quarantine_seconds`) after it was quarantined (or first seen
  there) is deleted for good.
- **Restore.** A quarantined blob that is referenced again (a writer that found it by put-if-absent and
  verified it just before the move) is restored to its key by the next sweep, whatever is held.
- **Marks live in the operator's memory.** After a restart the operator marks again from the start and
  counts the quarantine period from when it first sees a quarantined blob: it only waits longer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Final

# The reserved first segments under the store's prefix (not namespace names: those never start with _).
QUARANTINE_SEGMENT: Final = "_quarantine"
ARCHIVES_SEGMENT: Final = "_archives"

_LIVE_KEY: Final = re.compile(
    r"^(?P<namespace>[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)/(?P<run>[A-Za-z0-9][A-Za-z0-9-]{0,127})"
    r"/sha256/(?P<sha256>[0-9a-f]{64})$"
)


@dataclass(frozen=True)
class BlobAddress:
    """Where a collectable blob is: its Run's namespace and uid and its sha256."""

    namespace: str
    run_uid: str
    sha256: str

    @property
    def key(self) -> str:
        """The key its references name (relative to the store's prefix)."""
        return f"{self.namespace}/{self.run_uid}/sha256/{self.sha256}"

    @property
    def quarantine_key(self) -> str:
        return f"{QUARANTINE_SEGMENT}/{self.key}"


def live_address(key: str) -> BlobAddress | None:
    """The address of a key where references point; None for any other key."""
    found = _LIVE_KEY.match(key)
    if found is None:
        return None
    return BlobAddress(found["namespace"], found["run"], found["sha256"])


def quarantine_address(key: str) -> BlobAddress | None:
    """The address of a quarantined blob's key; None for any other key."""
    head, _, rest = key.partition("/")
    return live_address(rest) if head == QUARANTINE_SEGMENT else None


@dataclass(frozen=True)
class StoredBlob:
    """One object as the store's listing shows it (key relative to the store's prefix)."""

    key: str
    last_modified: datetime
    size: int


@dataclass(frozen=True)
class Roots:
    """What the sweep found referenced, gathered after the listing. `keys`: every referenced key
    (relative to the store's prefix); `held`: namespaces where a document could not be read;
    `complete`: False when the roots are not known anywhere (nothing is collected then)."""

    keys: frozenset[str] = frozenset()
    held: frozenset[str] = frozenset()
    complete: bool = True


@dataclass(frozen=True)
class Marks:
    """What the collector remembers between sweeps (in memory): since when a blob has been seen
    unreferenced, and since when a quarantined one has been in quarantine (both by its key)."""

    unreferenced_since: Mapping[str, datetime] = field(default_factory=dict)
    quarantined_since: Mapping[str, datetime] = field(default_factory=dict)


@dataclass(frozen=True)
class CollectorSettings:
    """grace_seconds: how old a blob must be before it is marked, and how long it stays marked before
    quarantine; quarantine_seconds: how long it stays in quarantine before it is deleted for good."""

    grace_seconds: float
    quarantine_seconds: float

    def __post_init__(self) -> None:
        if self.grace_seconds <= 0 or self.quarantine_seconds <= 0:
            raise ValueError("the collector's grace and quarantine periods must be above 0 seconds")


@dataclass(frozen=True)
class Sweep:
    """What one sweep decides: blobs to move into quarantine, quarantined blobs to restore to their
    keys and to delete for good, and the marks to remember. The counts say what was left and why."""

    quarantine: tuple[BlobAddress, ...]
    restore: tuple[BlobAddress, ...]
    delete: tuple[BlobAddress, ...]
    marks: Marks
    referenced: int = 0
    young: int = 0
    held: int = 0
    marked: int = 0


def decide(
    listing: Iterable[StoredBlob],
    roots: Roots,
    marks: Marks,
    now: datetime,
    settings: CollectorSettings,
    *,
    namespaces: frozenset[str] | None = None,
) -> Sweep:
    """One sweep's decisions. `listing` is what the store listed before the roots were gathered;
    `namespaces` limits the sweep to the operator's namespaces (None: all)."""
    live: dict[str, tuple[BlobAddress, StoredBlob]] = {}
    quarantined: dict[str, BlobAddress] = {}
    for blob in listing:
        if (address := live_address(blob.key)) is not None:
            live[address.key] = (address, blob)
        elif (address := quarantine_address(blob.key)) is not None:
            quarantined[address.key] = address
    scope = _Scope(roots, namespaces)
    live_sweep = _sweep_live(live, scope, marks, now, settings)
    moving = {address.key for address in live_sweep.quarantine}
    restore, delete, quarantined_since = _sweep_quarantine(
        quarantined, scope, marks, now, settings, moving=moving
    )
    return replace(
        live_sweep,
        restore=restore,
        delete=delete,
        marks=Marks(live_sweep.marks.unreferenced_since, quarantined_since),
    )


@dataclass(frozen=True)
class _Scope:
    roots: Roots
    namespaces: frozenset[str] | None

    def mine(self, address: BlobAddress) -> bool:
        return self.namespaces is None or address.namespace in self.namespaces

    def held(self, address: BlobAddress) -> bool:
        return not self.roots.complete or address.namespace in self.roots.held


def _sweep_live(
    live: Mapping[str, tuple[BlobAddress, StoredBlob]],
    scope: _Scope,
    marks: Marks,
    now: datetime,
    settings: CollectorSettings,
) -> Sweep:
    grace = timedelta(seconds=settings.grace_seconds)
    quarantine: list[BlobAddress] = []
    unreferenced_since: dict[str, datetime] = {}
    referenced = young = held = 0
    for key, (address, blob) in sorted(live.items()):
        if not scope.mine(address):
            continue
        if key in scope.roots.keys:
            referenced += 1
        elif scope.held(address):
            held += 1  # marking starts again once the namespace is known
        elif now - blob.last_modified < grace:
            young += 1
        elif (since := marks.unreferenced_since.get(key)) is None:
            unreferenced_since[key] = now
        elif now - since >= grace:
            quarantine.append(address)
        else:
            unreferenced_since[key] = since
    return Sweep(
        quarantine=tuple(quarantine),
        restore=(),
        delete=(),
        marks=Marks(unreferenced_since),
        referenced=referenced,
        young=young,
        held=held,
        marked=len(unreferenced_since),
    )


def _sweep_quarantine(
    quarantined: Mapping[str, BlobAddress],
    scope: _Scope,
    marks: Marks,
    now: datetime,
    settings: CollectorSettings,
    *,
    moving: set[str],
) -> tuple[tuple[BlobAddress, ...], tuple[BlobAddress, ...], dict[str, datetime]]:
    period = timedelta(seconds=settings.quarantine_seconds)
    restore: list[BlobAddress] = []
    delete: list[BlobAddress] = []
    since_by_key: dict[str, datetime] = {key: now for key in moving}
    for key, address in sorted(quarantined.items()):
        if not scope.mine(address) or key in moving:
            continue  # moved into quarantine again this sweep: its period starts now
        if key in scope.roots.keys:
            restore.append(address)
            continue
        since = marks.quarantined_since.get(key, now)
        if not scope.held(address) and now - since >= period:
            delete.append(address)
        else:
            since_by_key[key] = since
    return tuple(restore), tuple(delete), since_by_key


def relative_key(prefix: str, key: str) -> str | None:
    """`key` relative to the store's prefix, or None when it lies outside it (not this store's)."""
    if not prefix:
        return key
    return key[len(prefix) + 1 :] if key.startswith(prefix + "/") else None
