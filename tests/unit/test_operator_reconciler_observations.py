"""The reconciler's loop with core, without a cluster: the World is built from reads only, what the table
asks to be written is carried out by the executor, and what those writes observe comes back to the table
in the next World, which decides. On a real cluster: tests/integration/namespaced/test_store_provisioning.py,
tests/integration/test_identity.py, tests/integration/test_hostile_store.py."""

from __future__ import annotations

import asyncio
from typing import Any

from agentrun.api import AGENT_LABEL, Run
from agentrun.api.common import Condition
from agentrun.core.blobrestore import Outcome, Restoration, Target
from agentrun.core.identity import Account
from agentrun.core.plan import Plan, ProvisionStoreCredentials
from agentrun.core.runs import World, decide
from agentrun.kubeapi import ApiError, KubeApi
from agentrun.operator.attempt_role import AttemptRoleChecks
from agentrun.operator.blobrestore import RestoreMetrics, StateRestorer
from agentrun.operator.cache import AgentAccounts, OwnedObjects
from agentrun.operator.executor import Executor
from agentrun.operator.lease import LeaseExpiry
from agentrun.operator.metrics import OperatorMetrics
from agentrun.operator.reconciler import Reconciler
from agentrun.operator.run_cache import RunCache
from agentrun.operator.spans import RunSpans
from agentrun.operator.store_credentials import StoreCredentials
from agentrun.operator.workqueue import WorkQueue
from agentrun.statestore.operatorstore import OperatorStore
from agentrun.tracing import Tracing
from support.clock import FakeClock
from unit.factories import NAMESPACE, RUN, make_run, run_patch, run_status
from unit.run_worlds import stopped, waiting
from unit.test_operator_executor_observations import BundledCredentials

JsonDict = dict[str, Any]


class ReadOnlyApi(KubeApi):
    """An API server with the Run's ServiceAccount opted in and no Secret; it refuses every write (and
    keeps what was asked)."""

    def __init__(self) -> None:
        self.reads: list[str] = []
        self.writes: list[str] = []

    async def get(self, path: str) -> JsonDict | None:
        self.reads.append(path)
        if "/serviceaccounts/" in path:
            return {"metadata": {"name": "default", "labels": {AGENT_LABEL: "true"}}}
        return None

    async def create(self, path: str, body: JsonDict) -> JsonDict:
        self.writes.append(f"create {path}")
        raise AssertionError(f"a write while observing: create {path}")

    async def merge_patch(self, path: str, patch: JsonDict) -> JsonDict:
        self.writes.append(f"patch {path}")
        raise AssertionError(f"a write while observing: patch {path}")


class Bound(AttemptRoleChecks):
    async def denied(self, account: Account) -> tuple[str, ...]:
        return ()


def reconciler(
    api: KubeApi, credentials: StoreCredentials, restorer: StateRestorer | None = None
) -> Reconciler:
    clock = FakeClock()
    cache = OwnedObjects(clock)
    return Reconciler(
        api,
        cache=cache,
        runs=RunCache(),
        accounts=AgentAccounts(),
        roles=Bound(api, clock),
        queue=WorkQueue(clock),
        executor=Executor(api, cache, clock=clock, store_credentials=credentials, restorer=restorer),
        leases=LeaseExpiry(cache, clock),
        metrics=OperatorMetrics(None),
        spans=RunSpans(Tracing("agentrun-operator", {}), clock),
        clock=clock,
        operator_account=None,
        workers=1,
        store_credentials=credentials,
        has_store=restorer is not None,
    )


def observed(r: Reconciler, run: Run) -> World:
    return asyncio.run(r._world((NAMESPACE, RUN), run))


def carried_out(r: Reconciler, plan: Plan, run: Run, world: World) -> None:
    asyncio.run(r._execute(plan, run, world))


def test_building_the_world_makes_no_secret_the_table_asks_for_it_and_a_refusal_fails_the_run() -> None:
    api, run = ReadOnlyApi(), make_run()
    credentials = BundledCredentials(api, made=False)
    r = reconciler(api, credentials)

    world = observed(r, run)

    assert (world.store_credentials_missing, world.provisions_store_credentials) == (True, True)
    assert (credentials.asked, api.writes) == ([], []), "observing only reads"
    plan = decide(world)
    assert list(plan.actions) == [ProvisionStoreCredentials(NAMESPACE)]

    carried_out(r, plan, run, world)  # the bundled store refuses

    assert credentials.asked == [NAMESPACE]
    again = observed(r, run)
    assert again.store_provisioning_refused
    failed = run_patch(decide(again))
    assert (failed["phase"], failed["failure"]["reason"]) == ("Failed", "StateStoreCredentialsMissing")
    assert credentials.asked == [NAMESPACE], "asked once: the refusal is decided on, not retried"


def test_a_refusal_is_forgotten_once_the_run_starts_no_pod() -> None:
    api, run = ReadOnlyApi(), make_run()
    r = reconciler(api, BundledCredentials(api, made=False))
    world = observed(r, run)
    carried_out(r, decide(world), run, world)
    failed = make_run({"phase": "Failed", "attempts": 0, "leaseEpoch": 0})

    assert not observed(r, failed).store_provisioning_refused  # a retry later asks the store again
    assert not observed(r, run).store_provisioning_refused


class SquattedApi(ReadOnlyApi):
    """Every name the Run creates is taken by an object it does not own."""

    async def create(self, path: str, body: JsonDict) -> JsonDict:
        self.writes.append(f"create {path}")
        raise ApiError(409, "AlreadyExists", path)

    async def get(self, path: str) -> JsonDict | None:
        if "/attempts/" in path:
            return {"metadata": {"name": path.rsplit("/", 1)[-1], "uid": "someone-else"}}
        return await super().get(path)


def test_a_squatted_name_found_by_a_create_is_decided_by_the_table_then_forgotten_once_the_run_ended() -> (
    None
):
    api = SquattedApi()
    r = reconciler(api, StoreCredentials(api, FakeClock(), None))
    run = make_run(run_status("Running", current=1, lease_epoch=1))  # its Attempt promised, not seen
    world = observed(r, run)
    plan = decide(world)
    assert [type(a).__name__ for a in plan.actions][:1] == ["CreateAttempt"]

    carried_out(r, plan, run, world)

    again = observed(r, run)
    assert again.squatted == {f"{RUN}-a1": "Attempt"}
    failed = run_patch(decide(again))
    assert (failed["phase"], failed["failure"]["reason"]) == ("Failed", "NameSquatted")
    assert f"Attempt {RUN}-a1 exists and is not owned by this Run" in failed["message"]
    ended = make_run(run_status("Failed", current=1, lease_epoch=2))
    assert observed(r, ended).squatted == {}
    assert observed(r, run).squatted == {}, "a retry after the squatter was deleted starts afresh"


SHA = "a" * 64
KEY = f"{NAMESPACE}/uid/sha256/{SHA}"
RESTORED = (Restoration(Target(KEY, SHA, 48, ("ckpt-2",)), Outcome.RESTORED, "v1"),)


class Restorer(StateRestorer):
    """Says it restored the blob, once per time it is asked."""

    def __init__(self) -> None:
        super().__init__(OperatorStore.from_url("memory://state"), metrics=RestoreMetrics(None))
        self.asked = 0

    async def restore(self, world: World) -> tuple[Restoration, ...]:
        self.asked += 1
        return RESTORED


def waiting_over(key: str) -> Run:
    failure = {
        "class": "deterministic",
        "reason": "StateUnverifiable",
        "message": f"state blob {key} differs",
    }
    return stopped("NeedsReconciliation", failure=failure).run  # at rest: its report current


def test_blobs_restored_are_recorded_through_the_table_for_the_failure_they_were_restored_for() -> None:
    api, restorer, run = ReadOnlyApi(), Restorer(), waiting_over(KEY)
    r = reconciler(api, StoreCredentials(api, FakeClock(), None), restorer)
    world = observed(r, run)
    plan = decide(world)
    assert [type(a).__name__ for a in plan.actions] == ["RestoreBlobs"]

    carried_out(r, plan, run, world)

    again = observed(r, run)
    assert (restorer.asked, again.restorations) == (1, RESTORED)
    condition = run_patch(decide(again))["conditions"][-1]
    assert (condition["type"], condition["status"]) == ("StateRestored", "True")
    answered = run.model_copy(
        update={"status": run.status.model_copy(update={"conditions": decided_conditions(decide(again))})}
    )
    assert observed(r, answered).restorations is None
    assert observed(r, run).restorations is None, "forgotten once the condition answers the failure"

    carried_out(r, plan, run, world)
    assert observed(r, waiting_over(KEY.replace("a", "b"))).restorations is None, "another failure: not it"
    assert observed(r, run).restorations is None, "forgotten with it"


def decided_conditions(plan: Plan) -> list[Condition]:
    return [Condition.model_validate(c) for c in run_patch(plan)["conditions"]]


class DeletedDuringRead(ReadOnlyApi):
    """The Run's DELETED event arrives (the reconciler forgets it) while a reconcile reads a Checkpoint."""

    def __init__(self) -> None:
        super().__init__()
        self.reconciler: Reconciler | None = None

    async def get(self, path: str) -> JsonDict | None:
        if "/checkpoints/" in path and self.reconciler is not None:
            self.reconciler.forget((NAMESPACE, RUN))
        return await super().get(path)


def test_a_run_deleted_while_its_reconcile_awaits_leaves_the_phase_gauge() -> None:
    """A reconcile that was under way when its Run was deleted must not count the Run again: nothing would
    ever take it out of agentrun_runs."""
    api = DeletedDuringRead()
    r = reconciler(api, StoreCredentials(api, FakeClock(), None))
    api.reconciler = r
    body = waiting().run.to_api()  # InputRequired, its pointer a Checkpoint the cache does not hold
    body["metadata"]["resourceVersion"] = "7"
    r.run_seen(body)

    asyncio.run(r.reconcile((NAMESPACE, RUN)))

    assert any("/checkpoints/" in read for read in api.reads)
    assert r.metrics.run_phases == {}
    assert api.writes == []
