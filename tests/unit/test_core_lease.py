"""core.lease (epochs of a grant, expiry on the operator's own clock) and core.fence (the commit fence)."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.api import RejectedCommitReason
from agentrun.core.fence import fence_violation
from agentrun.core.lease import LeaseView, Sighting, epoch_for_grant, lease_view, seconds_until_expiry, sight
from unit.factories import make_lease, make_run, name_of, run_status

# ---- reading the Lease -------------------------------------------------------------------------------------


def lease_object(spec: dict[str, Any] | None, resource_version: str = "77") -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": "triage.run.agentrun.dev",
            "namespace": "team-a",
            "resourceVersion": resource_version,
        },
    }
    if spec is not None:
        body["spec"] = spec
    return body


LEASE_OBJECTS = {
    "held": (
        {
            "holderIdentity": "triage-a2",
            "leaseTransitions": 2,
            "leaseDurationSeconds": 60,
            "renewTime": "2026-03-01T12:00:00.123456Z",
        },
        LeaseView(holder="triage-a2", epoch=2, resource_version="77"),
    ),
    "revoked": (
        {"holderIdentity": None, "leaseTransitions": 3, "leaseDurationSeconds": 30},
        LeaseView(holder=None, epoch=3, resource_version="77"),
    ),
    "empty-holder": (
        {"holderIdentity": "", "leaseTransitions": 1, "leaseDurationSeconds": 30},
        LeaseView(holder=None, epoch=1, resource_version="77"),
    ),
    "no-spec": (None, LeaseView(holder=None, epoch=0, resource_version="77")),
    "empty-spec": ({}, LeaseView(holder=None, epoch=0, resource_version="77")),
}


@pytest.mark.parametrize(("spec", "view"), LEASE_OBJECTS.values(), ids=LEASE_OBJECTS.keys())
def test_lease_view(spec: dict[str, Any] | None, view: LeaseView) -> None:
    assert lease_view(lease_object(spec)) == view


def test_lease_view_resource_version_is_a_string() -> None:
    body = lease_object({"holderIdentity": "triage-a1", "leaseTransitions": 1})
    body["metadata"]["resourceVersion"] = 1234
    assert lease_view(body).resource_version == "1234"


# ---- epochs ------------------------------------------------------------------------------------------------

GRANTS = {
    "no-lease-yet": (None, "triage-a1", (1, True)),
    "held-by-the-grantee": (make_lease("triage-a2", 2), "triage-a2", (2, False)),
    "held-by-the-previous-attempt": (make_lease("triage-a1", 1), "triage-a2", (2, True)),
    "held-by-an-older-attempt": (make_lease("triage-a1", 4), "triage-a3", (5, True)),
    "revoked-gives-out-its-fresh-epoch": (make_lease(None, 3), "triage-a4", (3, True)),
    "created-without-epoch": (make_lease("someone", 0), "triage-a1", (1, True)),
}


@pytest.mark.parametrize(("lease", "holder", "expected"), GRANTS.values(), ids=GRANTS.keys())
def test_epoch_for_grant(lease: LeaseView | None, holder: str, expected: tuple[int, bool]) -> None:
    assert epoch_for_grant(lease, holder) == expected


def test_an_interrupted_grant_is_adopted_not_repeated() -> None:
    """Grant, crash before anything else is written, grant again: the epoch moves once."""
    epoch, write = epoch_for_grant(make_lease(name_of(1), 1), name_of(2))
    after_write = make_lease(name_of(2), epoch, resource_version="4712")

    assert (epoch, write) == (2, True)
    assert epoch_for_grant(after_write, name_of(2)) == (2, False)


# ---- expiry on the operator's clock ------------------------------------------------------------------------


def test_first_sighting_starts_the_clock() -> None:
    assert sight(None, "10", 100.0) == Sighting("10", 100.0)


def test_same_resource_version_keeps_the_first_seen_time() -> None:
    first = sight(None, "10", 100.0)
    assert sight(first, "10", 150.0) is first
    assert sight(sight(first, "10", 150.0), "10", 170.0) == Sighting("10", 100.0)


def test_new_resource_version_restarts_the_clock() -> None:
    renewed = sight(sight(None, "10", 100.0), "11", 118.0)
    assert renewed == Sighting("11", 118.0)


EXPIRY = {
    "never-seen": (None, 60, 500.0, None),
    "just-seen": (Sighting("10", 100.0), 60, 100.0, 60.0),
    "half-way": (Sighting("10", 100.0), 60, 130.0, 30.0),
    "at-the-limit": (Sighting("10", 100.0), 60, 160.0, 0.0),
    "overdue": (Sighting("10", 100.0), 60, 175.5, -15.5),
}


@pytest.mark.parametrize(("sighting", "duration", "now", "left"), EXPIRY.values(), ids=EXPIRY.keys())
def test_seconds_until_expiry(
    sighting: Sighting | None, duration: int, now: float, left: float | None
) -> None:
    assert seconds_until_expiry(sighting, duration, now) == left


def test_renewals_keep_a_lease_alive_and_silence_expires_it() -> None:
    """A worker renews every 20 s (new resourceVersion each time) and then stops; duration 60 s."""
    sighting: Sighting | None = None
    for t, rv in [(0.0, "1"), (20.0, "2"), (40.0, "3"), (60.0, "4")]:
        sighting = sight(sighting, rv, t)
        assert seconds_until_expiry(sighting, 60, t) == 60.0
    for t in (80.0, 100.0, 119.0):  # silence: the operator keeps seeing rv 4
        sighting = sight(sighting, "4", t)
        assert (seconds_until_expiry(sighting, 60, t) or 0) > 0
    sighting = sight(sighting, "4", 120.0)
    assert seconds_until_expiry(sighting, 60, 120.0) == 0.0


def test_timestamps_written_on_the_lease_play_no_part() -> None:
    """An operator that restarts sees the Lease for the first time: the full duration starts again."""
    assert seconds_until_expiry(sight(None, "4", 5000.0), 60, 5000.0) == 60.0


# ---- the fence ---------------------------------------------------------------------------------------------

FENCES = {
    "current-holder": ((0, 2), (2, 0), None),
    "current-holder-after-an-earlier-cancel": ((3, 2), (2, 3), None),
    "cancelled-since-grant": ((1, 2), (2, 0), RejectedCommitReason.STALE_AFTER_CANCEL),
    "lease-taken-over": ((0, 3), (2, 0), RejectedCommitReason.STALE_WORKER),
    "lease-revoked-for-deadline": ((0, 4), (3, 0), RejectedCommitReason.STALE_WORKER),
    "worker-ahead-of-the-run": ((0, 1), (2, 0), RejectedCommitReason.STALE_WORKER),
    "cancel-wins-over-lease": ((1, 3), (2, 0), RejectedCommitReason.STALE_AFTER_CANCEL),
}


@pytest.mark.parametrize(("run_epochs", "worker_epochs", "violation"), FENCES.values(), ids=FENCES.keys())
def test_fence_violation(
    run_epochs: tuple[int, int], worker_epochs: tuple[int, int], violation: RejectedCommitReason | None
) -> None:
    """run_epochs: (spec.cancelEpoch, status.leaseEpoch); worker_epochs: (lease epoch, cancel epoch)."""
    cancel_epoch, lease_epoch = run_epochs
    run = make_run(
        run_status("Running", current=2, lease_epoch=lease_epoch), spec={"cancelEpoch": cancel_epoch}
    )

    assert fence_violation(run, *worker_epochs) == violation


def test_fence_on_a_run_without_status() -> None:
    run = make_run()
    assert fence_violation(run, 0, 0) is None
    assert fence_violation(run, 1, 0) == RejectedCommitReason.STALE_WORKER
