"""Which watch events of owned objects queue a reconcile (agentrun.operator.handlers.news_for_decide)."""

from __future__ import annotations

import copy
from typing import Any

from agentrun.operator.informers import news_for_decide


def lease(
    holder: str | None, epoch: int, rv: str, renew: str = "2026-01-01T00:00:00.000000Z"
) -> dict[str, Any]:
    spec: dict[str, Any] = {"leaseDurationSeconds": 60, "leaseTransitions": epoch, "renewTime": renew}
    if holder:
        spec["holderIdentity"] = holder
    return {
        "metadata": {"name": "r.run.agentrun.dev", "namespace": "ns", "resourceVersion": rv},
        "spec": spec,
    }


def pod(rv: str, state: dict[str, Any] | None = None, **status: Any) -> dict[str, Any]:
    statuses = [{"name": "agent", "state": state}] if state else []
    return {
        "metadata": {"name": "r-a1", "namespace": "ns", "resourceVersion": rv},
        "status": {"phase": "Pending", "containerStatuses": statuses, **status},
    }


def test_a_renewal_is_no_news_a_new_holder_or_epoch_is() -> None:
    held = lease("r-a1", 1, "10")
    renewed = lease("r-a1", 1, "11", renew="2026-01-01T00:00:20.000000Z")
    assert not news_for_decide("leases", held, renewed)
    assert news_for_decide("leases", held, lease(None, 2, "12"))  # revoked: a new epoch, no holder
    assert news_for_decide("leases", held, lease("r-a2", 2, "12"))
    # The duration is the Run's (spec.lease): a holder rewriting the Lease's own changes nothing.
    assert not news_for_decide(
        "leases", held, lease("r-a1", 1, "12") | {"spec": held["spec"] | {"leaseDurationSeconds": 3600}}
    )
    assert news_for_decide("leases", None, held)  # first sight


def test_pod_updates_count_only_when_the_state_machine_would_see_them() -> None:
    running = pod("5", {"running": {"startedAt": "2026-01-01T00:00:01Z"}}, phase="Running")
    conditions_only = copy.deepcopy(running) | {"metadata": running["metadata"] | {"resourceVersion": "6"}}
    conditions_only["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    assert not news_for_decide("pods", running, conditions_only)
    assert news_for_decide("pods", pod("4"), running)  # the agent started
    ended = pod("7", {"terminated": {"exitCode": 0}}, phase="Succeeded")
    assert news_for_decide("pods", running, ended)
    deleting = copy.deepcopy(running)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:09Z"
    assert news_for_decide("pods", running, deleting)


def test_other_kinds_always_count() -> None:
    attempt = {"metadata": {"name": "r-a1", "resourceVersion": "1"}, "status": {"phase": "Running"}}
    assert news_for_decide("attempts", attempt, copy.deepcopy(attempt))
    assert news_for_decide("checkpoints", None, attempt)
