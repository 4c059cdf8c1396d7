"""Restoring an overwritten blob (agentrun.core.blobrestore): which blobs, which versions, what is said."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agentrun.core.blobrestore import (
    STATE_RESTORED,
    Outcome,
    Reference,
    Restoration,
    StoredVersion,
    Target,
    named_keys,
    not_referenced,
    targets,
    unreferenced,
    verdict,
    verifies,
    versions_to_try,
)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
GENUINE = b'{"outputs":["output 0: aaaa"],"by":"victim-a1"}'
FORGED = GENUINE.replace(b"a", b"Z", 1)
SHA = hashlib.sha256(GENUINE).hexdigest()
KEY = f"team-a/3f1c2a9e-8d5b-4c47-9f0e-2b6d7a1c5e34/sha256/{SHA}"
OTHER_SHA = "b" * 64
OTHER = f"team-a/3f1c2a9e-8d5b-4c47-9f0e-2b6d7a1c5e34/sha256/{OTHER_SHA}"
PLANTED = "team-a/3f1c2a9e-8d5b-4c47-9f0e-2b6d7a1c5e34/sha256/" + "c" * 64


def unverifiable(*keys: str) -> dict[str, Any]:
    names = ", ".join(f"state blob {k} cannot be verified: received 48 bytes with sha256 x" for k in keys)
    return {"class": "deterministic", "reason": "StateUnverifiable", "message": f"{names}; restore it"}


CKPT = Reference(KEY, SHA, len(GENUINE), "Checkpoint victim-a1-s2", "victim-a1-s2")
PARENT = Reference(OTHER, OTHER_SHA, 20, "Checkpoint victim-a1-s1", "victim-a1-s1")
FORK = Reference(KEY, SHA, len(GENUINE), "Checkpoint fork-a1-s1", "fork-a1-s1")
NOT_ADDRESSED = Reference(KEY, OTHER_SHA, len(GENUINE), "SideEffect sfx-1")
DISAGREES = Reference(KEY, SHA, len(GENUINE) + 1, "SideEffect sfx-2")
TARGET = Target(KEY, SHA, len(GENUINE), ("victim-a1-s2",), ("Checkpoint victim-a1-s2",))


@dataclass(frozen=True)
class Case:
    phase: str | None = "NeedsReconciliation"
    failure: dict[str, Any] | None = field(default_factory=lambda: unverifiable(KEY))
    conditions: tuple[str, ...] = ("Succeeded", "Waiting", "CancelRequested", "LeaseHeld")
    references: tuple[Reference, ...] = (CKPT, PARENT)
    expected: tuple[Target, ...] = (TARGET,)


TARGET_CASES = {
    "the referenced blob the failure names, with the checkpoint whose state it is": Case(),
    "a Run that is not waiting for a person: nothing": Case(phase="Running", expected=()),
    "a Run waiting for another reason: nothing": Case(
        failure={**unverifiable(KEY), "reason": "UnknownSideEffect"}, expected=()
    ),
    "no failure recorded: nothing": Case(failure=None, expected=()),
    "answered already (StateRestored present): not again": Case(
        conditions=("Succeeded", STATE_RESTORED), expected=()
    ),
    "a key the failure names that nothing references (planted, refused by the writer): nothing": Case(
        failure=unverifiable(PLANTED), expected=()
    ),
    "only the named one, not every referenced blob": Case(references=(PARENT, CKPT), expected=(TARGET,)),
    "two named, both referenced: both, by key": Case(
        failure=unverifiable(OTHER, KEY),
        expected=(TARGET, Target(OTHER, OTHER_SHA, 20, ("victim-a1-s1",), ("Checkpoint victim-a1-s1",))),
    ),
    "one blob referenced by two checkpoints (a fork's copy): every checkpoint named": Case(
        references=(CKPT, FORK),
        expected=(
            Target(
                KEY,
                SHA,
                len(GENUINE),
                ("fork-a1-s1", "victim-a1-s2"),
                ("Checkpoint fork-a1-s1", "Checkpoint victim-a1-s2"),
            ),
        ),
    ),
    "a reference whose key is not its content address: not trusted": Case(
        references=(NOT_ADDRESSED,), expected=()
    ),
    "two records disagreeing about one address: nothing trusted": Case(
        references=(CKPT, DISAGREES), expected=()
    ),
    "referenced by a record that is no checkpoint's state: restored, no checkpoint named": Case(
        references=(Reference(KEY, SHA, len(GENUINE), "document team-a/x/sha256/m"),),
        expected=(Target(KEY, SHA, len(GENUINE), (), ("document team-a/x/sha256/m",)),),
    ),
}


@pytest.mark.parametrize("case", TARGET_CASES.values(), ids=TARGET_CASES.keys())
def test_targets(case: Case) -> None:
    assert targets(case.phase, case.failure, case.conditions, case.references) == case.expected


def test_the_named_keys_and_those_no_object_references() -> None:
    failure = unverifiable(KEY, PLANTED)
    assert named_keys(failure) == {KEY, PLANTED}
    assert unreferenced(failure, [CKPT, PARENT]) == {PLANTED}
    assert unreferenced(unverifiable(KEY), [CKPT]) == frozenset()


def test_what_the_failure_names_and_nothing_references_is_said_not_restored() -> None:
    failure = unverifiable(KEY, PLANTED)
    assert not_referenced("NeedsReconciliation", failure, [], [CKPT]) == (
        Restoration(Target(PLANTED, "c" * 64, 0), Outcome.NOT_REFERENCED),
    )
    assert not_referenced("NeedsReconciliation", unverifiable(KEY), [], [CKPT]) == ()
    assert not_referenced("Running", failure, [], [CKPT]) == ()
    assert not_referenced("NeedsReconciliation", failure, [STATE_RESTORED], [CKPT]) == ()


def version(vid: str, minutes: int, size: int = len(GENUINE), **kw: Any) -> StoredVersion:
    return StoredVersion(vid, NOW + timedelta(minutes=minutes), size, **kw)


VERSION_CASES = {
    "newest first": ([version("v1", 0), version("v2", 5, latest=True)], ("v2", "v1")),
    "the listing's order on equal times (S3 lists newest first)": (
        [version("v3", 5, latest=True), version("v2", 5), version("v1", 0)],
        ("v3", "v2", "v1"),
    ),
    "another size cannot be the content": ([version("v2", 5, size=24), version("v1", 0)], ("v1",)),
    "delete markers have no bytes": (
        [version("d", 9, size=0, delete_marker=True, latest=True), version("v1", 0)],
        ("v1",),
    ),
    "nothing kept": ([], ()),
}


@pytest.mark.parametrize(("versions", "expected"), VERSION_CASES.values(), ids=VERSION_CASES.keys())
def test_versions_to_try(versions: list[StoredVersion], expected: tuple[str, ...]) -> None:
    assert versions_to_try(TARGET, versions) == expected


@pytest.mark.parametrize(
    ("data", "expected"),
    [(GENUINE, True), (FORGED, False), (GENUINE[:10], False), (GENUINE + b" ", False), (b"", False)],
    ids=["genuine", "same size, one letter changed", "truncated", "longer", "empty"],
)
def test_verifies(data: bytes, expected: bool) -> None:
    assert verifies(TARGET, data) is expected


OTHER_TARGET = Target(OTHER, OTHER_SHA, 20, ("victim-a1-s1",))
VERDICT_CASES = {
    "restored: True, the version named, the retry from that checkpoint now works": (
        [Restoration(TARGET, Outcome.RESTORED, "v1", listed=2, read=1)],
        ("True", "BlobsRestored", "Normal", "StateRestored"),
        [f"blob {KEY} restored from the version v1", "a retryRequest from checkpoint victim-a1-s2"],
    ),
    "verified already (restored before a restart): True all the same": (
        [Restoration(TARGET, Outcome.VERIFIED)],
        ("True", "BlobsRestored", "Normal", "StateRestored"),
        [f"blob {KEY} holds its recorded content", "from checkpoint victim-a1-s2"],
    ),
    "no version matches: False, loudly, the blob named, the state lost": (
        [Restoration(TARGET, Outcome.NO_VERSION, listed=3, read=1)],
        ("False", "NoVerifiedVersion", "Warning", "StateNotRestored"),
        [
            f"no version of blob {KEY}",
            "3 versions listed, 1 of that size read",
            "the state they held is lost",
        ],
    ),
    "one of two restored, the other not: False": (
        [
            Restoration(TARGET, Outcome.RESTORED, "v1", 2, 1),
            Restoration(OTHER_TARGET, Outcome.NO_VERSION, listed=1, read=0),
        ],
        ("False", "NoVerifiedVersion", "Warning", "StateNotRestored"),
        ["restored from the version v1", f"no version of blob {OTHER}"],
    ),
    "a store without versions: said so": (
        [Restoration(TARGET, Outcome.UNSUPPORTED, detail="a file:// store keeps no versions")],
        ("False", "RestoreUnsupported", "Warning", "StateNotRestored"),
        ["a file:// store keeps no versions", "the operator restored nothing"],
    ),
    "named but referenced by nothing (planted): said so, nothing restored": (
        [Restoration(Target(PLANTED, "c" * 64, 0), Outcome.NOT_REFERENCED)],
        ("False", "NotReferenced", "Warning", "StateNotRestored"),
        [f"blob {PLANTED} is referenced by no object of this Run", "the operator restored nothing"],
    ),
    "refused by the store: said so": (
        [Restoration(TARGET, Outcome.REFUSED, detail="state store refused list versions: HTTP 403")],
        ("False", "RestoreRefused", "Warning", "StateNotRestored"),
        ["HTTP 403", "the operator restored nothing"],
    ),
}


@pytest.mark.parametrize(("restorations", "said", "words"), VERDICT_CASES.values(), ids=VERDICT_CASES.keys())
def test_verdict(restorations: list[Restoration], said: tuple[str, ...], words: list[str]) -> None:
    decided = verdict(restorations, generation=4, now=NOW)
    condition = decided.condition
    assert (condition["status"], condition["reason"], decided.event_type, decided.event_reason) == said
    assert condition["type"] == STATE_RESTORED
    assert condition["observedGeneration"] == 4
    assert condition["lastTransitionTime"] == "2026-03-01T12:00:00Z"
    assert condition["message"] == decided.message
    for word in words:
        assert word in decided.message
    assert "the Run does not retry on its own" in decided.message
    assert len(decided.message) <= 1024
