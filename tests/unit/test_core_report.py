"""core.report: the counts and the report of a Run's external side effects."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agentrun.api import RunReport, SideEffect, SideEffectCounts
from agentrun.core.report import MAX_REPORTED, run_report, side_effect_counts, unresolved
from unit.factories import EARLIER, NO_SIDE_EFFECTS, make_side_effect


def counts(**nonzero: int) -> dict[str, int]:
    return {**NO_SIDE_EFFECTS, **nonzero}


# ---- counts ------------------------------------------------------------------------------------------------

COUNTS: dict[str, tuple[tuple[SideEffect, ...], dict[str, int]]] = {
    "none": ((), counts()),
    "confirmed-irreversible": ((make_side_effect("a", "Confirmed"),), counts(confirmed=1, irreversible=1)),
    "confirmed-reversible": ((make_side_effect("a", "Confirmed", reversible=True),), counts(confirmed=1)),
    "compensated": ((make_side_effect("a", "Compensated", reversible=True),), counts(compensated=1)),
    "compensated-not-reversible": ((make_side_effect("a", "Compensated"),), counts(compensated=1)),
    "unknown": ((make_side_effect("a", "Unknown"),), counts(unknown=1)),
    "pending": ((make_side_effect("a", "Pending"),), counts(unknown=1)),
    "no-status-yet": ((make_side_effect("a", None),), counts(unknown=1)),
    "failed": ((make_side_effect("a", "Failed"),), counts()),
    "failed-reversible": ((make_side_effect("a", "Failed", reversible=True),), counts()),
    "a-mix": (
        (
            make_side_effect("a", "Confirmed"),
            make_side_effect("b", "Confirmed"),
            make_side_effect("c", "Confirmed", reversible=True),
            make_side_effect("d", "Compensated", reversible=True),
            make_side_effect("e", "Unknown"),
            make_side_effect("f", "Pending", reversible=True),
            make_side_effect("g", "Failed"),
        ),
        counts(confirmed=3, compensated=1, unknown=2, irreversible=2),
    ),
}


@pytest.mark.parametrize(("effects", "expected"), COUNTS.values(), ids=COUNTS.keys())
def test_side_effect_counts(effects: tuple[SideEffect, ...], expected: dict[str, int]) -> None:
    got = side_effect_counts(effects)

    assert got == expected
    assert SideEffectCounts.model_validate(got).to_api() == got  # what the status schema accepts


def test_counts_take_any_iterable() -> None:
    effects = [make_side_effect("a", "Confirmed"), make_side_effect("b", "Unknown")]
    assert side_effect_counts(iter(effects)) == side_effect_counts(effects)


UNRESOLVED = {
    "unknown-blocks": (make_side_effect("a", "Unknown"), True),
    "pending-is-looked-up-not-blocking": (make_side_effect("a", "Pending"), False),
    "no-status-is-pending": (make_side_effect("a", None), False),
    "confirmed": (make_side_effect("a", "Confirmed"), False),
    "failed": (make_side_effect("a", "Failed"), False),
    "compensated": (make_side_effect("a", "Compensated"), False),
}


@pytest.mark.parametrize(("effect", "blocks"), UNRESOLVED.values(), ids=UNRESOLVED.keys())
def test_unresolved(effect: SideEffect, blocks: bool) -> None:
    assert unresolved([effect, make_side_effect("z", "Confirmed")]) == ([effect] if blocks else [])


# ---- the report --------------------------------------------------------------------------------------------


def test_report_entries() -> None:
    effects = [
        make_side_effect("a", "Confirmed", target="project-7", reference="T-1", created=EARLIER),
        make_side_effect("b", None, tool="send_mail", created=EARLIER + timedelta(seconds=1)),
        make_side_effect("c", "Compensated", reversible=True, created=EARLIER + timedelta(seconds=2)),
    ]
    report = run_report(effects)

    assert report == {
        "effects": [
            {
                "name": effects[0].metadata.name,
                "tool": "create_ticket",
                "target": "project-7",
                "state": "Confirmed",
                "externalReference": "T-1",
                "reversible": False,
            },
            {"name": effects[1].metadata.name, "tool": "send_mail", "state": "Pending", "reversible": False},
            {
                "name": effects[2].metadata.name,
                "tool": "create_ticket",
                "state": "Compensated",
                "reversible": True,
            },
        ],
        "omitted": 0,
        "happened": [effects[0].metadata.name],
        "compensated": [effects[2].metadata.name],
        "cannotBeUndone": [effects[0].metadata.name],
        "unknown": [effects[1].metadata.name],
    }
    assert RunReport.model_validate(report).to_api() == report  # what the status schema accepts


def name(key: str) -> str:
    return str(make_side_effect(key).metadata.name)


# (effects, happened, compensated, cannot be undone, unknown) by idempotency key
FATES: dict[str, tuple[list[SideEffect], list[str], list[str], list[str], list[str]]] = {
    "none": ([], [], [], [], []),
    "reversible-stands": ([make_side_effect("a", "Confirmed", reversible=True)], ["a"], [], [], []),
    "irreversible": ([make_side_effect("a", "Confirmed")], ["a"], [], ["a"], []),
    "compensated": ([make_side_effect("a", "Compensated", reversible=True)], [], ["a"], [], []),
    "pending-and-unknown": (
        [make_side_effect("a", "Pending"), make_side_effect("b", "Unknown")],
        [],
        [],
        [],
        ["a", "b"],
    ),
    "failed-is-nowhere": ([make_side_effect("a", "Failed")], [], [], [], []),
    "compensation-records-are-not-effects": (
        [
            make_side_effect("a", "Compensated", reversible=True),
            make_side_effect("a:compensate", "Confirmed", tool="undo_create_ticket", step="compensate"),
        ],
        [],
        ["a"],
        [],
        [],
    ),
}


@pytest.mark.parametrize(
    ("effects", "happened", "compensated", "irreversible", "unknown"), FATES.values(), ids=FATES.keys()
)
def test_report_lists_the_fate_of_each_effect(
    effects: list[SideEffect],
    happened: list[str],
    compensated: list[str],
    irreversible: list[str],
    unknown: list[str],
) -> None:
    report = run_report(effects)

    assert (report["happened"], report["compensated"], report["cannotBeUndone"], report["unknown"]) == (
        [name(k) for k in happened],
        [name(k) for k in compensated],
        [name(k) for k in irreversible],
        [name(k) for k in unknown],
    )
    assert len(report["effects"]) == len([e for e in effects if e.spec.step != "compensate"])
    assert RunReport.model_validate(report).to_api() == report


ORDERS = {
    "oldest-first": ([("b", 0), ("a", 2), ("c", 1)], ["b", "c", "a"]),
    "time-before-name": ([("a", 5), ("b", 0)], ["b", "a"]),
    "already-in-order": ([("a", 0), ("b", 1), ("c", 2)], ["a", "b", "c"]),
}


@pytest.mark.parametrize(("made", "order"), ORDERS.values(), ids=ORDERS.keys())
def test_report_is_oldest_first(made: list[tuple[str, int]], order: list[str]) -> None:
    """made: (idempotency key, seconds after EARLIER it was created); order: the keys as reported."""
    effects = [make_side_effect(k, "Confirmed", created=EARLIER + timedelta(seconds=s)) for k, s in made]
    key_of = {e.metadata.name: e.spec.idempotency_key for e in effects}

    assert [key_of[e["name"]] for e in run_report(effects)["effects"]] == order


def test_report_of_effects_made_at_the_same_time_is_by_name() -> None:
    effects = [make_side_effect(k, "Confirmed", created=EARLIER) for k in ("a", "b", "c", "d")]
    names = [e["name"] for e in run_report(effects)["effects"]]
    assert names == sorted(str(e.metadata.name) for e in effects)


def test_report_order_without_creation_times() -> None:
    effects = [make_side_effect(k, "Confirmed", created=None) for k in ("a", "b", "c")]
    names = [e["name"] for e in run_report(effects)["effects"]]
    assert names == sorted(str(e.metadata.name) for e in effects)


@pytest.mark.parametrize(
    ("total", "listed", "omitted"),
    [
        (0, 0, 0),
        (1, 1, 0),
        (MAX_REPORTED - 1, MAX_REPORTED - 1, 0),
        (MAX_REPORTED, MAX_REPORTED, 0),
        (MAX_REPORTED + 1, MAX_REPORTED, 1),
        (250, MAX_REPORTED, 250 - MAX_REPORTED),
    ],
    ids=["none", "one", "just-under", "exactly-the-bound", "one-over", "far-over"],
)
def test_report_is_bounded(total: int, listed: int, omitted: int) -> None:
    effects = [
        make_side_effect(f"key-{n:04d}", "Confirmed", created=EARLIER + timedelta(seconds=n))
        for n in range(total)
    ]
    report = run_report(reversed(effects))

    assert MAX_REPORTED == 30  # inside the Run's status budget, beside status.spentKeys
    assert len(report["effects"]) == listed
    assert report["omitted"] == omitted
    assert [e["name"] for e in report["effects"]] == [e.metadata.name for e in effects[:listed]], "the oldest"
    RunReport.model_validate(report)  # within the schema's maxItems


def test_counts_are_not_bounded_by_the_report() -> None:
    effects = [make_side_effect(f"key-{n}", "Confirmed") for n in range(150)]

    assert side_effect_counts(effects) == counts(confirmed=150, irreversible=150)
    assert run_report(effects)["omitted"] == 150 - MAX_REPORTED
