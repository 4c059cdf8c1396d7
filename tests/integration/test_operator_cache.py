"""The operator's view of what a Run owns, on the real API server: listed and watched by label before the
first reconcile, deaf to its own echoes, and corrected when a write finds the cache behind."""

from __future__ import annotations

import asyncio
import copy
import gc
from collections.abc import Iterator
from typing import Any

import pytest

from agentrun.api import GROUP, RUN_LABEL, VERSION
from agentrun.clock import SystemClock
from agentrun.core.plan import CreateAttempt, PatchAttemptStatus, Plan
from agentrun.kubeapi import KubeApi, load_configuration
from agentrun.kubewatch import Event, Gone, Listed, list_all, reflect, watch_from
from agentrun.operator.cache import AgentAccounts, Key, OwnedObjects, essentials
from agentrun.operator.executor import Executor, Superseded
from agentrun.operator.informers import Informers
from support.kube import Kube
from unit.factories import make_run

pytestmark = pytest.mark.usefixtures("agentrun_crds")


@pytest.fixture
def api(kube: Kube) -> Iterator[KubeApi]:
    client = KubeApi(load_configuration(str(kube.kubeconfig)), threads=2)
    yield client
    client.close()  # its sessions belong to the loops of the test's asyncio.run calls, ended by now


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


async def synced_informers(
    api: KubeApi, namespaces: list[str], woken: asyncio.Queue[Key]
) -> tuple[Informers, OwnedObjects, AgentAccounts]:
    cache, accounts = OwnedObjects(SystemClock()), AgentAccounts()
    informers = Informers(api, cache, accounts, namespaces, wake=woken.put_nowait)
    informers.start()
    await informers.synced.wait()
    return informers, cache, accounts


def drain(queue: asyncio.Queue[Key]) -> list[Key]:
    keys = []
    while not queue.empty():
        keys.append(queue.get_nowait())
    return keys


@pytest.mark.parametrize("scope", ["namespaced", "cluster-wide"])
def test_informers_list_and_watch_what_runs_own_and_nothing_else(
    kube: Kube, api: KubeApi, namespace: str, scope: str
) -> None:
    """The first list fills the cache before any reconcile; then only labelled objects arrive: the API
    server selects them (a foreign Lease created first would arrive first if it were sent)."""
    for number in (1, 2):
        create_attempt(kube, namespace, "filled", number)
    kube.coordination.create_namespaced_lease(
        namespace, lease_body("filled.run.agentrun.dev", {RUN_LABEL: "filled"})
    )
    kube.coordination.create_namespaced_lease(namespace, lease_body("unrelated", {"app": "other"}))

    async def scenario() -> tuple[OwnedObjects, Key]:
        woken: asyncio.Queue[Key] = asyncio.Queue()
        informers, cache, _ = await synced_informers(api, [namespace] if scope == "namespaced" else [], woken)
        key = (namespace, "filled")
        assert sorted(o["metadata"]["name"] for o in cache.of("attempts", key)) == ["filled-a1", "filled-a2"]
        # The first list wakes no Run: each Run's own event queues it. (Cluster-wide, other tests'
        # namespaces are live, so only this namespace's wake-ups are this test's.)
        assert [k for k in drain(woken) if k[0] == namespace] == []
        await asyncio.to_thread(
            kube.coordination.create_namespaced_lease, namespace, lease_body("foreign", {"app": "other"})
        )
        await asyncio.to_thread(create_attempt, kube, namespace, "filled", 3)
        try:
            while (woke := await woken.get())[0] != namespace:
                pass
            return cache, woke
        finally:
            await informers.stop()

    cache, woken = asyncio.run(scenario())

    assert woken == (namespace, "filled")
    assert [o["metadata"]["name"] for o in cache.of("leases", (namespace, "filled"))] == [
        "filled.run.agentrun.dev"
    ]
    assert not any(o["metadata"]["name"] in ("unrelated", "foreign") for o in cache.snapshot("leases"))
    assert len(cache.of("attempts", (namespace, "filled"))) == 3


def test_synced_informers_hold_no_listing(kube: Kube, api: KubeApi, namespace: str) -> None:
    """Once a listing is in the cache nothing holds it: kept by the watch that follows it (which waits,
    on a quiet selection, for good), a restart's listing of thousands of Pods would stay as RSS."""
    create_attempt(kube, namespace, "dropped", 1)

    async def scenario() -> int:
        informers, cache, _ = await synced_informers(api, [namespace], asyncio.Queue())
        try:
            assert [o["metadata"]["name"] for o in cache.of("attempts", (namespace, "dropped"))] == [
                "dropped-a1"
            ]
            gc.collect()
            return sum(isinstance(o, Listed) for o in gc.get_objects())
        finally:
            await informers.stop()

    assert asyncio.run(scenario()) == 0


def test_the_watch_event_of_our_own_create_is_no_news(kube: Kube, api: KubeApi, namespace: str) -> None:
    """An Attempt the operator creates is in the cache from the create's response; its watch event
    carries the same resourceVersion and changes nothing; a change by someone else is news. (The watch
    is read after the writes, from before them, so that every event comes after the response.)"""
    run = make_run({"phase": "Running"}, metadata={"namespace": namespace, "name": "echo"})
    collection = KubeApi.custom_path("attempts", namespace)

    async def scenario() -> list[tuple[str, bool]]:
        cache = OwnedObjects(SystemClock())
        before = (await list_all(api, collection)).resource_version
        await Executor(api, cache, clock=SystemClock()).execute(
            Plan([CreateAttempt(attempt_body("echo", 1))]), run
        )
        assert [o["metadata"]["name"] for o in cache.of("attempts", (namespace, "echo"))] == ["echo-a1"]
        await asyncio.to_thread(set_attempt_status, kube, namespace, "echo-a1", {"phase": "Running"})
        seen: list[tuple[str, bool]] = []
        async for event in watch_from(api, collection, before, label_selector=RUN_LABEL):
            if isinstance(event, Event):
                seen.append((event.type, cache.take("attempts", event.object)[2]))
            if len(seen) == 2:
                break
        return seen

    assert asyncio.run(scenario()) == [("ADDED", False), ("MODIFIED", True)]


def test_an_expired_resource_version_is_gone_and_reflect_lists_first(
    kube: Kube, api: KubeApi, namespace: str
) -> None:
    create_attempt(kube, namespace, "listed", 1)
    collection = KubeApi.custom_path("attempts", namespace)

    async def scenario() -> Listed:
        with pytest.raises(Gone):
            async for _ in watch_from(api, collection, "1", label_selector=RUN_LABEL):
                pass
        async for first in reflect(api, collection, label_selector=RUN_LABEL):
            assert isinstance(first, Listed)  # before any watch request is made
            return first
        raise AssertionError("reflect ended")

    listed = asyncio.run(scenario())

    assert [o["metadata"]["name"] for o in listed.items] == ["listed-a1"]
    assert int(listed.resource_version) > 1


def test_a_list_pages_through_long_lists(kube: Kube, api: KubeApi, namespace: str) -> None:
    for number in range(1, 8):
        create_attempt(kube, namespace, "paged", number)
    collection = KubeApi.custom_path("attempts", namespace)

    listed = asyncio.run(list_all(api, collection, label_selector=RUN_LABEL, page=3))

    assert sorted(o["spec"]["number"] for o in listed.items) == list(range(1, 8))
    assert listed.resource_version


def test_a_list_with_keep_holds_only_the_kept_copy_of_each_object(
    kube: Kube, api: KubeApi, namespace: str
) -> None:
    """The informers list with keep=essentials: every page's objects are trimmed as the page arrives
    (managedFields dropped), none is lost between pages, and the snapshot's resourceVersion is kept."""
    for number in range(1, 8):
        create_attempt(kube, namespace, "kept", number)
    collection = KubeApi.custom_path("attempts", namespace)

    whole = asyncio.run(list_all(api, collection, label_selector=RUN_LABEL, page=3))
    kept = asyncio.run(
        list_all(api, collection, label_selector=RUN_LABEL, page=3, keep=lambda o: essentials("attempts", o))
    )

    assert all("managedFields" in o["metadata"] for o in whole.items)
    assert kept.items == [essentials("attempts", o) for o in whole.items]
    assert not any("managedFields" in o["metadata"] for o in kept.items)
    assert kept.resource_version


def test_a_write_on_a_stale_attempt_changes_nothing_and_refreshes_the_cache(
    kube: Kube, api: KubeApi, namespace: str
) -> None:
    """The cache still shows the Attempt Running while it already ended Rejected (the SDK wrote that):
    a decision made on the stale view is refused by its resourceVersion, and the cache catches up."""
    create_attempt(kube, namespace, "stale", 1)
    running = set_attempt_status(kube, namespace, "stale-a1", {"phase": "Running"})
    rejected = set_attempt_status(
        kube, namespace, "stale-a1", {"phase": "Rejected", "rejectedCommit": {"reason": "stale_worker"}}
    )
    cache = OwnedObjects(SystemClock())
    cache.put("attempts", copy.deepcopy(running))
    run = make_run({"phase": "Running"}, metadata={"namespace": namespace, "name": "stale"})
    stale_rv = running["metadata"]["resourceVersion"]
    plan = Plan([PatchAttemptStatus("stale-a1", {"phase": "Failed"}, stale_rv)])

    with pytest.raises(Superseded):
        asyncio.run(Executor(api, cache, clock=SystemClock()).execute(plan, run))

    now = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "attempts", "stale-a1")
    assert now["status"]["phase"] == "Rejected"
    assert now["metadata"]["resourceVersion"] == rejected["metadata"]["resourceVersion"]
    [cached] = cache.of("attempts", (namespace, "stale"))
    assert cached["metadata"]["resourceVersion"] == rejected["metadata"]["resourceVersion"]
