"""The operator's runtime without a cluster: which plans may be carried out from the cached Run, the
Run cache (echoes and stale events change nothing), relists that keep the operator's own creates, the
scheduler's backoff and lease checks, and which API errors are permanent."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentrun.api import Run, RunPhase
from agentrun.core.plan import (
    Consistency,
    DeletePod,
    PatchAttemptStatus,
    PatchRunStatus,
    Plan,
    RecordEvent,
    WriteLease,
    consistency_of,
)
from agentrun.core.runs import World, decide
from agentrun.kubeapi import ApiError
from agentrun.operator.cache import OwnedObjects
from agentrun.operator.metrics import OperatorMetrics
from agentrun.operator.run_cache import RunCache
from agentrun.operator.runtime import Runtime
from agentrun.operator.settings import OperatorSettings
from agentrun.operator.store_principals import NamespacePrincipals
from agentrun.operator.workqueue import BASE_DELAY, MAX_DELAY, WorkQueue
from agentrun.tracing import Tracing
from support.clock import FakeClock
from unit.factories import (
    NAMESPACE,
    RUN,
    committed_by,
    ended_pod,
    held_by,
    make_attempt,
    make_run,
    make_world,
    run_status,
    running_pod,
)

JsonDict = dict[str, Any]


def supervising(pod: Any, **status: Any) -> World:
    """A Run in phase Running whose Attempt 1 holds lease epoch 1; its Pod as given (None: not seen)."""
    run = make_run(run_status("Running", current=1, lease_epoch=1, **status))
    return make_world(
        run, attempts=[make_attempt(1)], pods=[pod] if pod else [], lease=held_by(1), expires_in=30.0
    )


# ---- which view of the Run a plan may be carried out from --------------------------------------------


def trusts_cached_run(plan: Plan, run: Run) -> bool:
    """What core states for a plan decided on `run` (core.plan.consistency_of): the cached view will do."""
    return (
        consistency_of(plan.actions, committed=run.status.committed_by is not None) == Consistency.CACHED_RUN
    )


@pytest.mark.parametrize(
    "world",
    [
        pytest.param(supervising(ended_pod(1, 0)), id="exit 0"),
        pytest.param(supervising(ended_pod(1, 1)), id="exit 1"),
        pytest.param(supervising(None), id="Pod gone"),
    ],
)
def test_an_attempt_ended_from_pod_evidence_without_a_commit_seen_is_never_decided_on_an_unread_run(
    world: World,
) -> None:
    plan = decide(world)

    assert plan.actions
    assert not trusts_cached_run(plan, world.run)
    assert plan.needs_fresh_run  # as the decision states it


def test_an_attempt_ended_after_the_commit_seen_is_decided_on_the_cached_run() -> None:
    world = supervising(ended_pod(1, 0), committedBy=committed_by(1, 1), result={"ticket": "T-1"})
    plan = decide(world)

    assert attempt_phases(plan) == ["Succeeded"]
    assert trusts_cached_run(plan, world.run)
    assert not plan.needs_fresh_run


def test_nothing_to_write_needs_no_read() -> None:
    world = supervising(running_pod(1))
    assert trusts_cached_run(decide(world), world.run)


RUNNING = make_run(run_status("Running", current=1, lease_epoch=1))
COMMITTED = make_run(run_status("Running", current=1, lease_epoch=1, committedBy=committed_by(1, 1)))
ENDED = PatchAttemptStatus("a1", {"phase": "Failed"}, "7")
STARTED = PatchAttemptStatus("a1", {"phase": "Running"}, "7")


@pytest.mark.parametrize(
    ("plan", "run", "trusted"),
    [
        (Plan(), RUNNING, True),
        (Plan(requeue_after=5), RUNNING, True),
        (Plan([PatchRunStatus({"phase": "Running"}), WriteLease("a1", 1, 60, None)]), RUNNING, True),
        (Plan([ENDED, PatchRunStatus({"phase": "Failed"})]), RUNNING, False),
        (Plan([ENDED, PatchRunStatus({"phase": "Succeeded"})]), COMMITTED, True),
        (Plan([STARTED]), RUNNING, True),
        (Plan([STARTED, ENDED]), RUNNING, False),
        (Plan([WriteLease("a1", 1, 60, None), PatchRunStatus({"phase": "Running"})]), RUNNING, True),
        (Plan([WriteLease("a2", 2, 60, "7"), PatchRunStatus({"phase": "Running"})]), RUNNING, False),
        (Plan([WriteLease(None, 2, 60, "7"), PatchRunStatus({"phase": "RetryBackoff"})]), RUNNING, False),
        (Plan([WriteLease("a1", 1, 60, None), RecordEvent("Normal", "X", "y")]), RUNNING, False),
        (Plan([DeletePod("a1")]), COMMITTED, False),
        (Plan([RecordEvent("Normal", "Queued", "waits")]), RUNNING, False),
    ],
)
def test_writes_ahead_of_the_preconditioned_run_write_decide_whether_the_run_is_read(
    plan: Plan, run: Run, trusted: bool
) -> None:
    assert trusts_cached_run(plan, run) is trusted


def test_a_first_grant_is_carried_out_from_the_cached_run() -> None:
    """The Lease create ahead of the Run's patch needs no read: the patch is preconditioned."""
    world = make_world(make_run())
    plan = decide(world)

    assert [type(a).__name__ for a in plan.actions[:2]] == ["WriteLease", "PatchRunStatus"]
    assert trusts_cached_run(plan, world.run)


def test_a_lease_takeover_is_never_decided_on_an_unread_run() -> None:
    world = make_world(
        RUNNING, attempts=[make_attempt(1)], pods=[running_pod(1)], lease=held_by(1), expires_in=0.0
    )
    plan = decide(world)

    [lease] = plan.of(WriteLease)
    assert isinstance(lease, WriteLease) and lease.expected_resource_version is not None
    assert not trusts_cached_run(plan, RUNNING)


def test_a_first_lease_left_by_a_lost_race_is_adopted_by_the_grant_decided_again() -> None:
    """The Run's patch lost to a newer Run after the Lease was created: the grant decided on the newer
    Run adopts the Lease's epoch (no second Lease write, no epoch skipped or reused)."""
    plan = decide(make_world(make_run(), lease=held_by(1)))

    assert not plan.of(WriteLease)
    [patch] = plan.of(PatchRunStatus)
    assert isinstance(patch, PatchRunStatus)
    assert (patch.patch["leaseEpoch"], patch.patch["currentAttempt"]) == (1, 1)


def test_a_first_lease_left_by_a_lost_race_to_a_spec_change_starts_nothing() -> None:
    """The newer Run names a ServiceAccount that is not opted in: it fails; the Lease names an Attempt
    that is never created, so no Pod can ever renew or write under it."""
    plan = decide(make_world(make_run(), lease=held_by(1), account_refusal="not labelled"))

    [patch] = plan.of(PatchRunStatus)
    assert isinstance(patch, PatchRunStatus)
    assert patch.patch["phase"] == "Failed"
    assert not plan.of(WriteLease)
    assert not [a for a in plan.actions if type(a).__name__ in ("CreateAttempt", "CreatePod")]


def attempt_phases(plan: Plan) -> list[str]:
    return [a.patch["phase"] for a in plan.of(PatchAttemptStatus) if isinstance(a, PatchAttemptStatus)]


# ---- the Run cache -------------------------------------------------------------------------------------


def run_body(rv: str, uid: str = "uid-1", **status: Any) -> JsonDict:
    body = make_run(status or {"phase": "Running"}).to_api()
    metadata = body["metadata"]
    metadata.update(resourceVersion=rv, uid=uid, managedFields=[{"manager": "kubectl"}])
    metadata["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": "{}", "keep": "me"}
    return body


def test_the_echo_of_our_own_write_and_older_events_change_nothing() -> None:
    runs = RunCache()
    assert runs.put(run_body("10"))  # our write's response
    assert not runs.put(run_body("10"))  # its watch event: the echo
    assert not runs.put(run_body("9", phase="Queued"))  # an event older than the write
    assert runs.put(run_body("11", phase="Succeeded"))

    run = runs.get((NAMESPACE, RUN))
    assert run is not None and run.status.phase == "Succeeded"
    assert runs.resource_version((NAMESPACE, RUN)) == "11"


@pytest.mark.parametrize("phase", [p.value for p in RunPhase])
def test_a_run_comes_back_as_it_was_put_in_every_phase(phase: str) -> None:
    """Runs at rest are kept compressed and moving ones are not: both read back the same."""
    runs = RunCache()
    body = run_body("10", phase=phase)
    runs.put(body)

    run = runs.get((NAMESPACE, RUN))

    kept = {k: v for k, v in body["metadata"].items() if k != "managedFields"} | {
        "annotations": {"keep": "me"}
    }
    assert run == Run.model_validate({**body, "metadata": kept})
    assert run.status.phase == phase


def test_a_run_holding_an_int_past_64_bits_is_cached() -> None:
    """kopf parses Run events with json, so a large number the API server sent arrives as a Python int
    that orjson refuses: the Run is cached all the same (else no reconcile would ever see it)."""
    runs = RunCache()
    body = run_body("10")
    body["spec"]["input"] = {"n": 20000000000000000000}

    assert runs.put(body)
    run = runs.get((NAMESPACE, RUN))
    assert run is not None and run.spec.input == {"n": 20000000000000000000}


def test_a_run_recreated_under_its_name_replaces_the_old_one_whatever_its_version() -> None:
    runs = RunCache()
    runs.put(run_body("10", uid="old"))
    assert runs.put(run_body("3", uid="new"))
    run = runs.get((NAMESPACE, RUN))
    assert run is not None and run.metadata.uid == "new"


def test_the_run_cache_keeps_what_decide_reads_only() -> None:
    runs = RunCache()
    runs.put(run_body("10"))
    run = runs.get((NAMESPACE, RUN))
    assert run is not None
    dumped = run.to_api()["metadata"]
    assert "managedFields" not in dumped
    assert dumped.get("annotations") == {"keep": "me"}


# ---- owned objects: echoes, relists, expectations ------------------------------------------------------


def attempt(name: str, rv: str, uid: str = "a-uid", phase: str = "Running") -> JsonDict:
    labels = {"agentrun.dev/run": RUN}
    metadata = {"name": name, "namespace": NAMESPACE, "resourceVersion": rv, "uid": uid, "labels": labels}
    return {"metadata": metadata, "status": {"phase": phase}}


def test_a_watched_version_is_news_only_when_newer_than_the_cached_one() -> None:
    cache = OwnedObjects(FakeClock())
    cache.put("attempts", attempt(f"{RUN}-a1", "5"))  # the create's response

    assert cache.take("attempts", attempt(f"{RUN}-a1", "5"))[2] is False  # its ADDED event: an echo
    assert cache.take("attempts", attempt(f"{RUN}-a1", "4"))[2] is False
    assert cache.take("attempts", attempt(f"{RUN}-a1", "6", phase="Failed"))[2] is True
    [cached] = cache.of("attempts", (NAMESPACE, RUN))
    assert cached["status"]["phase"] == "Failed"


def test_a_relist_drops_what_is_gone_but_keeps_what_we_created_after_its_snapshot() -> None:
    cache = OwnedObjects(FakeClock())
    cache.put("attempts", attempt(f"{RUN}-a1", "5"))
    cache.put("attempts", attempt(f"{RUN}-a2", "12"))  # created by us after the list's snapshot (10)
    cache.put("attempts", attempt(f"{RUN}-a0", "7"))  # gone before the list: missing from it

    touched = cache.replace("attempts", [attempt(f"{RUN}-a1", "5")], "10", NAMESPACE)

    names = sorted(o["metadata"]["name"] for o in cache.of("attempts", (NAMESPACE, RUN)))
    assert names == [f"{RUN}-a1", f"{RUN}-a2"]
    assert touched == {(NAMESPACE, RUN)}


def test_a_relist_of_one_namespace_leaves_the_others_alone() -> None:
    cache = OwnedObjects(FakeClock())
    elsewhere = attempt(f"{RUN}-a1", "5")
    elsewhere["metadata"]["namespace"] = "team-b"
    cache.put("attempts", elsewhere)
    cache.put("attempts", attempt(f"{RUN}-a1", "6"))

    touched = cache.replace("attempts", [], "10", NAMESPACE)

    assert touched == {(NAMESPACE, RUN)}
    assert cache.of("attempts", (NAMESPACE, RUN)) == []
    assert len(cache.of("attempts", ("team-b", RUN))) == 1


def test_a_deleted_event_of_an_older_object_of_that_name_keeps_the_new_one() -> None:
    cache = OwnedObjects(FakeClock())
    cache.put("attempts", attempt(f"{RUN}-a1", "9", uid="new"))
    cache.remove("attempts", attempt(f"{RUN}-a1", "8", uid="old"))
    assert len(cache.of("attempts", (NAMESPACE, RUN))) == 1


# ---- the scheduler ---------------------------------------------------------------------------------------


def test_errors_back_off_exponentially_per_key_up_to_the_cap_and_reset_on_success() -> None:
    async def scenario() -> tuple[list[float], float, float]:
        queue: WorkQueue[str] = WorkQueue(FakeClock())
        delays = [queue.add_rate_limited("a") for _ in range(5)]
        other = queue.add_rate_limited("b")
        for _ in range(30):
            queue.add_rate_limited("a")
        capped = queue.add_rate_limited("a")
        queue.succeeded("a")
        queue.forget("a")
        queue.forget("b")
        return [*delays, other], capped, queue.add_rate_limited("a")

    delays, capped, after_success = asyncio.run(scenario())

    assert delays == [BASE_DELAY * 2**i for i in range(5)] + [BASE_DELAY]
    assert capped == MAX_DELAY
    assert after_success == BASE_DELAY


def test_a_due_lease_check_reconciles_only_when_the_lease_was_not_renewed() -> None:
    renewed = {"a": True, "b": False}
    checked: list[str] = []

    def lease_due(key: str) -> float | None:
        checked.append(key)
        if renewed[key]:
            renewed[key] = False  # renewed once; the next check finds it expired
            return 0.0
        return None

    async def scenario() -> list[str]:
        queue: WorkQueue[str] = WorkQueue(FakeClock(), lease_due=lease_due)
        queue.check_lease_in("a", 0.0)
        queue.check_lease_in("b", 0.0)
        first, second = await queue.get(), await queue.get()
        return [first, second]

    got = asyncio.run(scenario())

    assert got == ["b", "a"]  # b at once; a only at its second check, after the renewal moved it on
    assert checked == ["a", "b", "a"]


# ---- permanent and transient refusals --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "permanent"),
    [
        *[(400, True), (403, True), (404, True), (422, True)],
        *[(408, False), (409, False), (429, False), (500, False), (503, False)],
    ],
)
def test_a_4xx_is_permanent_but_for_timeout_conflict_and_throttling(status: int, permanent: bool) -> None:
    assert ApiError(status, "Reason", "message").permanent is permanent


def test_the_reconciler_reads_the_very_caches_it_is_given_even_empty_ones() -> None:
    """An empty cache is falsy (it has a length): the reconciler once put a fresh one of its own in the
    place of the empty accounts cache the informers fill, and read every account from the API."""

    runtime = start_up()
    reconciler = runtime.reconciler
    runs, accounts = runtime.runs, runtime.accounts

    assert reconciler.runs is runs and reconciler.accounts is accounts
    assert runtime.informers.accounts is accounts and runtime.informers.cache is reconciler.cache


def start_up(clock: FakeClock | None = None, config: OperatorSettings | None = None) -> Runtime:
    """The operator's object graph, as start-up builds it, on a fake clock (no API server is called)."""
    return Runtime(
        None,  # type: ignore[arg-type]
        config or OperatorSettings(),
        operator_account=None,
        tracing=Tracing("agentrun-operator", {}),
        operator_metrics=OperatorMetrics(None),
        clock=clock or FakeClock(),
        identity="replica-a",
    )


def test_every_collaborator_is_built_once_on_the_one_clock() -> None:
    clock = FakeClock()
    runtime = start_up(clock)

    assert runtime.reconciler.queue is runtime.queue and runtime.reconciler.executor is runtime.executor
    assert runtime.reconciler.leases is runtime.leases and runtime.queue.clock is clock
    for collaborator in (runtime.cache, runtime.executor, runtime.reconciler, runtime.leases):
        assert collaborator.clock is clock


def test_the_namespaces_principals_are_administered_while_active_only_with_the_bundled_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An activity (it runs only while the replica acts), on the reconciler's credentials and the
    informers' accounts: an opt-in seen by the watch is what it acts on."""
    assert not [a for a in start_up().activities if isinstance(a, NamespacePrincipals)]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ROOT")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "root-secret")
    url = "s3://agentrun?endpoint=http://127.0.0.1:7070&region=us-east-1"
    clock = FakeClock()
    runtime = start_up(clock, OperatorSettings(state_store_url=url, state_store_provision=True))

    [principals] = [a for a in runtime.activities if isinstance(a, NamespacePrincipals)]
    assert principals.credentials is runtime.reconciler.store_credentials
    assert principals.accounts is runtime.accounts and principals.clock is clock
    assert principals.synced() is runtime.informers.synced
