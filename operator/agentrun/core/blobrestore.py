"""Restoring an overwritten blob from the version the store kept (docs/state-store.md, "Restoring an
overwritten blob"): which blobs to restore for a Run, which stored versions to try, and what to tell the
person. Plain functions: the operator (agentrun.operator.blobrestore) lists the versions, reads them, writes
the one that verifies back and reads it back.

A blob is never changed by its writers (put-if-absent), but a Pod of the namespace may overwrite one (its
principal may put). The fenced object that references the blob records its sha256 and size, so the next
reader finds it out: the Attempt fails `StateUnverifiable` naming the key, and the Run waits in
NeedsReconciliation. A retry from that very checkpoint would stop again, forever, although the store (with
versioning on) kept the genuine bytes as an earlier version of the key. The operator, which alone holds the
credentials that may overwrite, restores them:

- **When**: the Run is NeedsReconciliation with reason `StateUnverifiable`, and no `StateRestored`
  condition answers that failure yet (every phase change rewrites the conditions without it, so a later
  failure is answered again). Never a retry: the Run stays where it is, a person decides.
- **Which blobs**: those whose key the failure's message names and that one of the Run's objects
  references (`{key, sha256, size}`: the recorded content to verify against). A key the failure names that
  nothing references (a blob planted at the address of a state the writer then refused to reference) is
  not restored: there is no recorded content to restore.
- **Which version**: the stored versions of the key whose size is the recorded size, newest first (delete
  markers skipped); the first whose sha256 is the recorded one is written back as the current version,
  then read back and verified. None matching: said loudly, the blob stays named, nothing is invented.
- **What is recorded**: the condition `StateRestored` (True: every named blob verifies now, and a
  `retryRequest` from the checkpoints that reference them resumes the whole state; False: the reason
  says why not), an Event on the Run, and the operator's metric of restored blobs.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Final, Literal

from agentrun.api import STATE_UNVERIFIABLE, RunPhase

STATE_RESTORED: Final = "StateRestored"
_CONTENT_ADDRESS: Final = re.compile(r"[^\s'\"(),;]*/sha256/[0-9a-f]{64}")
_MESSAGE_LIMIT: Final = 1024


@dataclass(frozen=True)
class Reference:
    """A blob reference one of the Run's objects records: its key, sha256 and size, the object holding it
    (`holder`, e.g. "Checkpoint victim-a1-s2"), and the Checkpoint id when it is that Checkpoint's state."""

    key: str
    sha256: str
    size: int
    holder: str
    checkpoint: str | None = None
    links: bool = False  # a document naming further blobs (statestore.documents)

    @property
    def addressed(self) -> bool:
        """Whether the key is the content address of the recorded sha256 (only then is it restorable)."""
        return self.key.endswith("/sha256/" + self.sha256)


@dataclass(frozen=True)
class Target:
    """A blob to restore: its recorded content, and the Checkpoints whose state it is (sorted)."""

    key: str
    sha256: str
    size: int
    checkpoints: tuple[str, ...] = ()
    holders: tuple[str, ...] = ()


def waits_for_restore(
    phase: str | None, failure: Mapping[str, Any] | None, condition_types: Iterable[str]
) -> bool:
    """Whether the Run waits in NeedsReconciliation for a StateUnverifiable failure that no StateRestored
    condition answers yet (a phase change rewrites the conditions without it: a later failure is new)."""
    return phase == RunPhase.NEEDS_RECONCILIATION.value and unanswered(failure, condition_types)


def unanswered(failure: Mapping[str, Any] | None, condition_types: Iterable[str]) -> bool:
    """Whether the Run's failure is StateUnverifiable and no StateRestored condition answers it yet (the
    Run's table asks it in NeedsReconciliation only: core.runs.restoring)."""
    return (
        bool(failure)
        and failure is not None
        and failure.get("reason") == STATE_UNVERIFIABLE
        and STATE_RESTORED not in set(condition_types)
    )


def named_keys(failure: Mapping[str, Any]) -> frozenset[str]:
    """The content addresses (`.../sha256/<hex>`) the failure's message names."""
    return frozenset(_CONTENT_ADDRESS.findall(str(failure.get("message") or "")))


def unreferenced(failure: Mapping[str, Any], references: Iterable[Reference]) -> frozenset[str]:
    """The content addresses the failure names that none of `references` records: where the operator
    looks further, in the documents the Run's references reach (a LangGraph channel blob)."""
    recorded = {r.key for r in references}
    return frozenset(k for k in named_keys(failure) if k not in recorded)


def targets(
    phase: str | None,
    failure: Mapping[str, Any] | None,
    condition_types: Iterable[str],
    references: Iterable[Reference],
) -> tuple[Target, ...]:
    """The blobs to restore for a Run now: empty unless it waits for a restore (waits_for_restore); the
    referenced blobs whose key the failure's message names, each with its recorded content and the
    Checkpoints whose state it is. Sorted by key."""
    if failure is None or not waits_for_restore(phase, failure, condition_types):
        return ()
    message = str(failure.get("message") or "")
    found: dict[str, list[Reference]] = {}
    for ref in references:
        if ref.key and ref.key in message and ref.addressed:
            found.setdefault(ref.key, []).append(ref)
    out = []
    for key, refs in sorted(found.items()):
        first = refs[0]
        if any((r.sha256, r.size) != (first.sha256, first.size) for r in refs):
            continue  # two records disagree about one content address: nothing to trust (never written so)
        out.append(
            Target(
                key,
                first.sha256,
                first.size,
                tuple(sorted({r.checkpoint for r in refs if r.checkpoint})),
                tuple(sorted({r.holder for r in refs})),
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class StoredVersion:
    """One version of a key as the store lists it (S3 ListObjectVersions): a delete marker has no bytes."""

    version_id: str
    last_modified: datetime
    size: int
    latest: bool = False
    delete_marker: bool = False


def versions_to_try(target: Target, versions: Sequence[StoredVersion]) -> tuple[str, ...]:
    """The version ids worth reading, newest first: not delete markers, of the recorded size (a version of
    another size cannot be the content). Equal times keep the listing's order (S3 lists newest first)."""
    order = {id(v): i for i, v in enumerate(versions)}
    kept = [v for v in versions if not v.delete_marker and v.size == target.size]
    kept.sort(key=lambda v: (-v.last_modified.timestamp(), order[id(v)]))
    return tuple(v.version_id for v in kept)


def verifies(target: Target, data: bytes) -> bool:
    """Whether `data` is the recorded content: its size and its sha256."""
    return len(data) == target.size and hashlib.sha256(data).hexdigest() == target.sha256


class Outcome(StrEnum):
    """What became of one blob: restored from a version; found verified already (restored before, e.g.
    by an operator that restarted before recording it); no version the store kept is its content; the
    store keeps no versions the operator can list (not an S3 store); the store refused the requests;
    no object of the Run references it (nothing recorded to restore it to: not_referenced)."""

    RESTORED = "restored"
    VERIFIED = "verified"
    NO_VERSION = "no_version"
    UNSUPPORTED = "unsupported"
    REFUSED = "refused"
    NOT_REFERENCED = "not_referenced"


@dataclass(frozen=True)
class Restoration:
    """One blob's outcome: the version restored (RESTORED), how many versions were listed and read, and
    what the store said (UNSUPPORTED, REFUSED)."""

    target: Target
    outcome: Outcome
    version_id: str | None = None
    listed: int = 0
    read: int = 0
    detail: str = ""


@dataclass(frozen=True)
class Verdict:
    """What is recorded: the StateRestored condition (to append to the Run's conditions) and the Event."""

    condition: dict[str, Any]
    event_type: Literal["Normal", "Warning"]
    event_reason: str
    message: str


_REASONS: Final = {
    Outcome.NO_VERSION: "NoVerifiedVersion",
    Outcome.UNSUPPORTED: "RestoreUnsupported",
    Outcome.REFUSED: "RestoreRefused",
    Outcome.NOT_REFERENCED: "NotReferenced",
}


def not_referenced(
    phase: str | None,
    failure: Mapping[str, Any] | None,
    condition_types: Iterable[str],
    references: Iterable[Reference],
) -> tuple[Restoration, ...]:
    """The content addresses a waiting Run's failure names that none of its references records (all of
    them, documents included), as outcomes to record: e.g. a blob planted at the address of a state its
    writer then refused to reference. Nothing is restored there: no content is recorded for it."""
    if failure is None or not waits_for_restore(phase, failure, condition_types):
        return ()
    return tuple(
        Restoration(Target(key, key.rsplit("/", 1)[-1], 0), Outcome.NOT_REFERENCED)
        for key in sorted(unreferenced(failure, references))
    )


def verdict(restorations: Sequence[Restoration], *, generation: int | None, now: datetime) -> Verdict:
    """The condition and Event for what the operator did. True only when every named blob verifies now;
    the message names each blob and what became of it, and tells the person what a retry can do."""
    failed = [r for r in restorations if r.outcome not in (Outcome.RESTORED, Outcome.VERIFIED)]
    parts = [_said(r) for r in restorations]
    event_type: Literal["Normal", "Warning"]
    if failed:
        reason = _REASONS[failed[0].outcome]
        lost = any(r.outcome == Outcome.NO_VERSION for r in failed)
        tail = (
            ("the state they held is lost" if lost else "the operator restored nothing")
            + ": retry from an earlier checkpoint (spec.retryRequest.fromCheckpoint), or restore the blob "
            "by hand with the store's own credentials; the Run does not retry on its own"
        )
        status, event_type, event_reason = "False", "Warning", "StateNotRestored"
    else:
        reason = "BlobsRestored"
        checkpoints = sorted({c for r in restorations for c in r.target.checkpoints})
        where = (
            f"from checkpoint {', '.join(checkpoints)}" if checkpoints else "from the checkpoint that failed"
        )
        tail = (
            f"a retryRequest {where} (spec.retryRequest.fromCheckpoint) now resumes the whole state; "
            "the Run does not retry on its own"
        )
        status, event_type, event_reason = "True", "Normal", STATE_RESTORED
    message = ("; ".join(parts) + "; " + tail)[:_MESSAGE_LIMIT]
    condition = {
        "type": STATE_RESTORED,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    return Verdict(condition, event_type, event_reason, message)


def _said(r: Restoration) -> str:
    key, target = r.target.key, r.target
    if r.outcome == Outcome.RESTORED:
        return (
            f"blob {key} restored from the version {r.version_id} the store kept (sha256 and size verified, "
            "read back)"
        )
    if r.outcome == Outcome.VERIFIED:
        return f"blob {key} holds its recorded content (sha256 and size verified)"
    if r.outcome == Outcome.NO_VERSION:
        return (
            f"no version of blob {key} the store keeps is its recorded content (sha256 {target.sha256}, "
            f"{target.size} bytes; {r.listed} versions listed, {r.read} of that size read): "
            "it stays unverifiable"
        )
    if r.outcome == Outcome.NOT_REFERENCED:
        return (
            f"blob {key} is referenced by no object of this Run (a writer never references what is not its "
            "content): there is no recorded content to restore it to"
        )
    if r.outcome == Outcome.UNSUPPORTED:
        return f"blob {key} cannot be restored here: {r.detail}"
    return f"the store refused restoring blob {key}: {r.detail}"
