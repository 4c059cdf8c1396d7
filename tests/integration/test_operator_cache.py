"""The operator's view of what a Run owns, on the real API server: filled by listing before the first
reconcile, and corrected when a write finds the cache behind."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from agentrun.api import GROUP, RUN_LABEL, VERSION
from agentrun.core.plan import PatchAttemptStatus, Plan
from agentrun.kubeapi import KubeApi, load_configuration
from agentrun.operator import sync
from agentrun.operator.cache import OwnedObjects
from agentrun.operator.executor import Executor, Superseded
from support.kube import Kube
from unit.factories import make_run

pytestmark = pytest.mark.usefixtures("agentrun_crds")


def api_for(kube: Kube) -> KubeApi:
    return KubeApi(load_configuration(str(kube.kubeconfig)), threads=2)


def attempt_body(run: str, number: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Attempt",
        "metadata": {"name": f"{run}-a{number}", "labels": {RUN_LABEL: run}},
        "spec": {
            "runName": run,
            "number": number,
            "leaseEpoch": number,
            "cancelEpoch": 0,
            "reason": "initial",
        },
    }


def lease_body(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "spec": {"holderIdentity": "someone"}}


def create_attempt(kube: Kube, namespace: str, run: str, number: int) -> dict[str, Any]:
    created: dict[str, Any] = kube.custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "attempts", attempt_body(run, number)
    )
    return created


def set_attempt_status(kube: Kube, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
    written: dict[str, Any] = kube.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "attempts", name, {"status": status}
    )
    return written


@pytest.mark.parametrize("scope", ["namespaced", "cluster-wide"])
def test_fill_lists_what_runs_own_and_nothing_else(kube: Kube, namespace: str, scope: str) -> None:
    for number in (1, 2):
        create_attempt(kube, namespace, "filled", number)
    kube.coordination.create_namespaced_lease(
        namespace, lease_body("filled.run.agentrun.dev", {RUN_LABEL: "filled"})
    )
    kube.coordination.create_namespaced_lease(namespace, lease_body("unrelated", {"app": "other"}))
    cache = OwnedObjects()

    counts = asyncio.run(sync.fill(api_for(kube), cache, [namespace] if scope == "namespaced" else []))

    key = (namespace, "filled")
    assert sorted(o["metadata"]["name"] for o in cache.of("attempts", key)) == ["filled-a1", "filled-a2"]
    assert [o["metadata"]["name"] for o in cache.of("leases", key)] == ["filled.run.agentrun.dev"]
    assert counts["attempts"] >= 2 and counts["leases"] >= 1
    assert not any(o["metadata"]["name"] == "unrelated" for o in cache.snapshot("leases"))
    if scope == "namespaced":
        assert counts == {"attempts": 2, "checkpoints": 0, "sideeffects": 0, "pods": 0, "leases": 1}


def test_fill_pages_through_long_lists(kube: Kube, namespace: str) -> None:
    for number in range(1, 8):
        create_attempt(kube, namespace, "paged", number)
    api = api_for(kube)

    async def pages() -> list[list[dict[str, Any]]]:
        return [
            page async for page in api.list_pages(KubeApi.custom_path("attempts", namespace), RUN_LABEL, 3)
        ]

    found = asyncio.run(pages())

    assert [len(page) for page in found] == [3, 3, 1]
    assert sorted(o["spec"]["number"] for page in found for o in page) == list(range(1, 8))


def test_a_write_on_a_stale_attempt_changes_nothing_and_refreshes_the_cache(
    kube: Kube, namespace: str
) -> None:
    """The cache still shows the Attempt Running while it already ended Rejected (the SDK wrote that):
    a decision made on the stale view is refused by its resourceVersion, and the cache catches up."""
    create_attempt(kube, namespace, "stale", 1)
    running = set_attempt_status(kube, namespace, "stale-a1", {"phase": "Running"})
    rejected = set_attempt_status(
        kube, namespace, "stale-a1", {"phase": "Rejected", "rejectedCommit": {"reason": "stale_worker"}}
    )
    cache = OwnedObjects()
    cache.put("attempts", copy.deepcopy(running))
    run = make_run({"phase": "Running"}, metadata={"namespace": namespace, "name": "stale"})
    stale_rv = running["metadata"]["resourceVersion"]
    plan = Plan().add(PatchAttemptStatus("stale-a1", {"phase": "Failed"}, stale_rv))

    with pytest.raises(Superseded):
        asyncio.run(Executor(api_for(kube), cache).execute(plan, run))

    now = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "attempts", "stale-a1")
    assert now["status"]["phase"] == "Rejected"
    assert now["metadata"]["resourceVersion"] == rejected["metadata"]["resourceVersion"]
    [cached] = cache.of("attempts", (namespace, "stale"))
    assert cached["metadata"]["resourceVersion"] == rejected["metadata"]["resourceVersion"]
