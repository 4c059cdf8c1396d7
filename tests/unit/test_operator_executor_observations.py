"""What carrying out a Plan observes and hands back to core (agentrun.operator.executor's Executed): the
writes decide nothing themselves. The decisions on these observations: test_core_runs_store_access.py,
test_core_runs_table.py; on a real cluster: tests/integration/test_store_access.py,
tests/integration/test_identity.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentrun.api import lease_name
from agentrun.core.blobrestore import Outcome, Restoration, Target
from agentrun.core.plan import (
    Action,
    CreateAttempt,
    CreatePod,
    PatchRunStatus,
    Plan,
    ProvisionStoreCredentials,
    RestoreBlobs,
    WriteLease,
)
from agentrun.core.pods import StateStorePodEnv
from agentrun.core.runs import World
from agentrun.kubeapi import ApiError, KubeApi
from agentrun.operator.blobrestore import RestoreMetrics, StateRestorer
from agentrun.operator.cache import OwnedObjects
from agentrun.operator.executor import Executed, Executor
from agentrun.operator.store_credentials import StoreCredentials
from agentrun.statestore.operatorstore import OperatorStore
from support.clock import FakeClock
from unit.factories import NAMESPACE, RUN, make_run, make_world

STORE = StateStorePodEnv("s3://agentrun?endpoint=http://objects.example:7070", "agentrun-state-store")


class BundledCredentials(StoreCredentials):
    """The bundled store's provisioning, answering `made` (False: the server refused)."""

    def __init__(self, api: KubeApi, made: bool) -> None:
        super().__init__(api, FakeClock(), STORE)
        self.made, self.asked = made, list[str]()

    @property
    def provisions(self) -> bool:
        return True

    async def provision(self, namespace: str) -> bool:
        self.asked.append(namespace)
        return self.made


@pytest.mark.parametrize(
    ("made", "executed"),
    [(True, Executed(changed=True)), (False, Executed(provisioning_refused=True))],
    ids=["made", "refused"],
)
def test_store_credentials_are_made_as_planned_and_a_refusal_goes_back_to_core(
    unreachable_api: KubeApi, made: bool, executed: Executed
) -> None:
    credentials = BundledCredentials(unreachable_api, made)
    executor = Executor(
        unreachable_api, OwnedObjects(FakeClock()), clock=FakeClock(), store_credentials=credentials
    )

    outcome = asyncio.run(executor.execute(Plan([ProvisionStoreCredentials(NAMESPACE)]), make_run()))

    assert (credentials.asked, outcome) == ([NAMESPACE], executed)


def test_store_credentials_planned_without_a_bundled_store_are_an_error(unreachable_api: KubeApi) -> None:
    executor = Executor(unreachable_api, OwnedObjects(FakeClock()), clock=FakeClock())

    with pytest.raises(RuntimeError, match="no bundled store"):
        asyncio.run(executor.execute(Plan([ProvisionStoreCredentials(NAMESPACE)]), make_run()))


class SquattedApi(KubeApi):
    """An API server where every name is taken by an object nobody owns (a squatter); what is asked is
    kept in `asked`."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.asked.append(f"create {path}")
        raise ApiError(409, "AlreadyExists", path)

    async def get(self, path: str) -> dict[str, Any] | None:
        self.asked.append(f"get {path}")
        return {"metadata": {"name": path.rsplit("/", 1)[-1], "uid": "someone-else", "resourceVersion": "7"}}


SQUATTED = {
    "pod": (CreatePod({"metadata": {"name": f"{RUN}-a1", "ownerReferences": []}}), "Pod", f"{RUN}-a1"),
    "attempt": (CreateAttempt({"metadata": {"name": f"{RUN}-a1"}}), "Attempt", f"{RUN}-a1"),
    "lease": (WriteLease(f"{RUN}-a1", 1, 60, None), "Lease", lease_name(RUN)),
}


@pytest.mark.parametrize(("create", "kind", "name"), SQUATTED.values(), ids=SQUATTED.keys())
def test_a_name_held_by_another_object_stops_the_plan_and_goes_back_to_core(
    create: Action, kind: str, name: str
) -> None:
    api = SquattedApi()
    executor = Executor(api, OwnedObjects(FakeClock()), clock=FakeClock())
    after = PatchRunStatus({"phase": "Running"})

    outcome = asyncio.run(executor.execute(Plan([create, after]), make_run()))

    assert outcome == Executed(squatted={name: kind})
    assert outcome.news, "the Run is decided again, on the squatted name"
    assert not any("runs" in asked for asked in api.asked), "nothing after the create is written"


class Restorer(StateRestorer):
    """Restores nothing: says what it was given to say, and on which World it was asked."""

    def __init__(self, said: tuple[Restoration, ...]) -> None:
        super().__init__(OperatorStore.from_url("memory://state"), metrics=RestoreMetrics(None))
        self.said, self.asked = said, list[World]()

    async def restore(self, world: World) -> tuple[Restoration, ...]:
        self.asked.append(world)
        return self.said


TARGET = Target(f"{NAMESPACE}/uid/sha256/{'a' * 64}", "a" * 64, 48)


@pytest.mark.parametrize(
    "said", [(Restoration(TARGET, Outcome.RESTORED, "v1"),), ()], ids=["restored", "nothing-to-look-at"]
)
def test_blobs_are_restored_on_the_world_decided_on_and_what_became_of_them_goes_back_to_core(
    unreachable_api: KubeApi, said: tuple[Restoration, ...]
) -> None:
    restorer = Restorer(said)
    executor = Executor(unreachable_api, OwnedObjects(FakeClock()), clock=FakeClock(), restorer=restorer)
    world = make_world(make_run())

    outcome = asyncio.run(executor.execute(Plan([RestoreBlobs((TARGET.key,))]), world.run, world))

    assert (restorer.asked, outcome) == ([world], Executed(restorations=said))
    assert outcome.news, "the Run is decided again, on what became of its blobs"


def test_blobs_to_restore_without_a_world_or_a_store_are_an_error(unreachable_api: KubeApi) -> None:
    world = make_world(make_run())
    plan = Plan([RestoreBlobs((TARGET.key,))])
    without_store = Executor(unreachable_api, OwnedObjects(FakeClock()), clock=FakeClock())
    without_world = Executor(
        unreachable_api, OwnedObjects(FakeClock()), clock=FakeClock(), restorer=Restorer(())
    )

    with pytest.raises(RuntimeError, match="no state store"):
        asyncio.run(without_store.execute(plan, world.run, world))
    with pytest.raises(RuntimeError, match="no World"):
        asyncio.run(without_world.execute(plan, world.run))
