"""What carrying out a Plan observes and hands back to core (agentrun.operator.executor's Executed): the
writes decide nothing themselves. The decisions on these observations: test_core_runs_store_access.py,
test_core_runs_table.py; on a real cluster: tests/integration/test_store_access.py,
tests/integration/test_identity.py."""

from __future__ import annotations

import asyncio

import pytest

from agentrun.core.plan import Plan, ProvisionStoreCredentials
from agentrun.core.pods import StateStorePodEnv
from agentrun.kubeapi import KubeApi
from agentrun.operator.cache import OwnedObjects
from agentrun.operator.executor import Executed, Executor
from agentrun.operator.store_credentials import StoreCredentials
from support.clock import FakeClock
from unit.factories import NAMESPACE, make_run

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
