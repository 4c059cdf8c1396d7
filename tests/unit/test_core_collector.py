"""The collector's decisions (agentrun.core.collector), one table row per rule of its docstring."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from agentrun.core.collector import (
    BlobAddress,
    CollectorSettings,
    Marks,
    Roots,
    StoredBlob,
    decide,
    live_address,
    quarantine_address,
    relative_key,
)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SETTINGS = CollectorSettings(grace_seconds=3600, quarantine_seconds=7200)
RUN, FORK = "0b7e3a52-51c4-4c1e-9d0c-6f3f2f8f1a77", "7d1c2b3a-0000-4c1e-9d0c-6f3f2f8f1a77"
A = BlobAddress("team-a", RUN, "a" * 64)
B = BlobAddress("team-b", RUN, "b" * 64)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def live(address: BlobAddress, age: float = 86400) -> StoredBlob:
    return StoredBlob(address.key, ago(age), 100)


def quarantined(address: BlobAddress) -> StoredBlob:
    # a copy's last-modified is not trusted (some stores keep the original's): the period is in marks
    return StoredBlob(address.quarantine_key, ago(10 * 86400), 100)


@dataclass(frozen=True)
class Case:
    listing: tuple[StoredBlob, ...]
    roots: Roots = field(default_factory=Roots)
    marks: Marks = field(default_factory=Marks)
    namespaces: frozenset[str] | None = None
    quarantine: tuple[BlobAddress, ...] = ()
    restore: tuple[BlobAddress, ...] = ()
    delete: tuple[BlobAddress, ...] = ()
    unreferenced_since: dict[str, datetime] = field(default_factory=dict)
    quarantined_since: dict[str, datetime] = field(default_factory=dict)


CASES = {
    "an upload younger than the grace period is not even marked": Case((live(A, age=3599),)),
    "an old unreferenced blob is marked by the first sweep that sees it": Case(
        (live(A),), unreferenced_since={A.key: NOW}
    ),
    "a referenced blob is never marked, and its mark is dropped": Case(
        (live(A),), Roots(frozenset({A.key})), Marks({A.key: ago(86400)})
    ),
    "a blob another Run references stays (a fork names its source's key)": Case(
        (live(A),), Roots(frozenset({A.key})), Marks({A.key: ago(86400)})
    ),
    "a marked blob waits out the grace period since its mark": Case(
        (live(A),), marks=Marks({A.key: ago(3599)}), unreferenced_since={A.key: ago(3599)}
    ),
    "a blob marked for the grace period and still unreferenced is quarantined": Case(
        (live(A),), marks=Marks({A.key: ago(3600)}), quarantine=(A,), quarantined_since={A.key: NOW}
    ),
    "a held namespace (a document not readable) marks nothing and drops its marks": Case(
        (live(A), live(B)),
        Roots(held=frozenset({"team-a"})),
        Marks({A.key: ago(86400), B.key: ago(86400)}),
        quarantine=(B,),
        quarantined_since={B.key: NOW},
    ),
    "roots not complete: nothing anywhere is marked or quarantined": Case(
        (live(A), live(B)), Roots(complete=False), Marks({A.key: ago(86400)})
    ),
    "a quarantined blob is first given its period": Case((quarantined(A),), quarantined_since={A.key: NOW}),
    "a quarantined blob still in its period stays": Case(
        (quarantined(A),),
        marks=Marks(quarantined_since={A.key: ago(7199)}),
        quarantined_since={A.key: ago(7199)},
    ),
    "a quarantined blob unreferenced for the whole period is deleted for good": Case(
        (quarantined(A),), marks=Marks(quarantined_since={A.key: ago(7200)}), delete=(A,)
    ),
    "a quarantined blob referenced again is restored": Case(
        (quarantined(A),),
        Roots(frozenset({A.key})),
        Marks(quarantined_since={A.key: ago(7200)}),
        restore=(A,),
    ),
    "a restore happens even where nothing may be deleted": Case(
        (quarantined(A),), Roots(frozenset({A.key}), complete=False), restore=(A,)
    ),
    "a held namespace deletes nothing from quarantine and keeps the period": Case(
        (quarantined(A),),
        Roots(held=frozenset({"team-a"})),
        Marks(quarantined_since={A.key: ago(7200)}),
        quarantined_since={A.key: ago(7200)},
    ),
    "a blob moved into quarantine again does not lose its new copy to the old period": Case(
        (live(A), quarantined(A)),
        marks=Marks({A.key: ago(3600)}, {A.key: ago(86400)}),
        quarantine=(A,),
        quarantined_since={A.key: NOW},
    ),
    "outside the operator's namespaces nothing is decided": Case(
        (live(A), quarantined(B)),
        marks=Marks({A.key: ago(86400)}, {B.key: ago(86400)}),
        namespaces=frozenset({"team-c"}),
    ),
    "keys of other layouts and archives are never touched": Case(
        (
            StoredBlob("notes/readme.txt", ago(86400), 1),
            StoredBlob(f"_archives/team-a/{RUN}/sha256/{'c' * 64}", ago(86400), 1),
            StoredBlob(f"team-a/{RUN}/sha256/{'C' * 64}", ago(86400), 1),
        )
    ),
    "marks of blobs no longer listed are forgotten": Case(
        (), marks=Marks({A.key: ago(10)}, {B.key: ago(10)})
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_decide(case: Case) -> None:
    sweep = decide(case.listing, case.roots, case.marks, NOW, SETTINGS, namespaces=case.namespaces)
    assert (sweep.quarantine, sweep.restore, sweep.delete) == (case.quarantine, case.restore, case.delete)
    assert dict(sweep.marks.unreferenced_since) == case.unreferenced_since
    assert dict(sweep.marks.quarantined_since) == case.quarantined_since


def test_a_blob_goes_from_mark_to_quarantine_to_deletion_across_sweeps() -> None:
    in_store, in_quarantine = [live(A)], [quarantined(A)]
    sweeps = [
        (0, in_store, "mark"),
        (1800, in_store, "wait"),
        (3600, in_store, "quarantine"),
        (3600 + 7199, in_quarantine, "wait"),
        (3600 + 7200, in_quarantine, "delete"),
    ]
    marks, seen = Marks(), []
    for seconds, listing, _ in sweeps:
        sweep = decide(listing, Roots(), marks, NOW + timedelta(seconds=seconds), SETTINGS)
        newly_marked = A.key in sweep.marks.unreferenced_since and A.key not in marks.unreferenced_since
        marks = sweep.marks
        moved = "quarantine" if sweep.quarantine else "delete" if sweep.delete else None
        seen.append(moved or ("mark" if newly_marked else "wait"))
    assert seen == [expected for _, _, expected in sweeps]
    assert marks == Marks()


def test_the_counts_say_why_blobs_stayed() -> None:
    sweep = decide(
        [
            live(A),
            live(B),
            live(BlobAddress("team-c", RUN, "c" * 64), age=1),
            live(BlobAddress("team-d", FORK, "d" * 64)),
        ],
        Roots(frozenset({A.key}), held=frozenset({"team-b"})),
        Marks(),
        NOW,
        SETTINGS,
    )
    assert (sweep.referenced, sweep.held, sweep.young, sweep.marked) == (1, 1, 1, 1)


@pytest.mark.parametrize(
    ("key", "address"),
    [
        (A.key, A),
        (f"team-a/{RUN}/sha256/{'a' * 63}", None),
        (f"team-a/{RUN}/sha256/{'a' * 64}/more", None),
        (f"_quarantine/{A.key}", None),
        (f"Team-A/{RUN}/sha256/{'a' * 64}", None),
    ],
)
def test_live_address(key: str, address: BlobAddress | None) -> None:
    assert live_address(key) == address


def test_quarantine_address_is_the_live_address_under_the_reserved_segment() -> None:
    assert quarantine_address(A.quarantine_key) == A
    assert quarantine_address(A.key) is None
    assert quarantine_address(f"_archives/{A.key}") is None


@pytest.mark.parametrize(
    ("prefix", "key", "relative"),
    [("", "a/b", "a/b"), ("runs", "runs/a/b", "a/b"), ("runs", "runsx/a/b", None), ("runs", "other/a", None)],
)
def test_relative_key(prefix: str, key: str, relative: str | None) -> None:
    assert relative_key(prefix, key) == relative


def test_the_periods_must_be_positive() -> None:
    with pytest.raises(ValueError, match="above 0"):
        CollectorSettings(grace_seconds=0, quarantine_seconds=1)
