"""Byte budgets on the real control plane, without a state store (with one, large values go there:
tests/integration/test_state_store_worker.py): an agent whose result or checkpoint state is over its
budget ends its Run Failed, class deterministic, with the budget and what to do in status.failure, after
one Attempt (never retried as an infrastructure failure); and the API server's own answer to an oversize
write is recognised as one.

The operator is told of no object store, and the namespace holds no store credentials: no Pod can reach
the control plane's store."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrun.api import budgets
from agentrun.kubeapi import ApiError, KubeApi, load_configuration
from devcluster.operator import OperatorProcess
from integration.namespaced.test_archive import start_operator
from support.clusters import operator_identity, opt_in_for_attempts
from support.corpus import valid_object
from support.kube import Kube
from support.runs import attempts, create_run, scenario_run, wait_phase

pytestmark = pytest.mark.cluster


@pytest.fixture
def run_namespace(kube: Kube, namespace: str) -> str:
    """Overrides the session's: opted in for attempt Pods, and no store credentials (there is no store)."""
    return opt_in_for_attempts(kube, namespace)


@pytest.fixture
def operator(
    kube: Kube, run_namespace: str, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The operator for this test's namespace, told of no state store."""
    process = start_operator(
        operator_identity(kube, tmp_path_factory), tmp_path / "operator.log", run_namespace
    )
    try:
        yield process
    finally:
        process.stop()


OVERSIZE: dict[str, tuple[dict[str, Any], str]] = {
    "result": (
        {"steps": 1, "padding": {"result": budgets.RESULT_BUDGET}},
        "the result is",
    ),
    "checkpoint-state": (
        {"steps": 1, "padding": {"state": budgets.CHECKPOINT_STATE_BUDGET}},
        "the checkpoint state is",
    ),
}


@pytest.mark.parametrize(("scenario", "what"), OVERSIZE.values(), ids=OVERSIZE.keys())
def test_an_oversize_write_fails_the_run_for_good_with_advice(
    kube: Kube, run_namespace: str, operator: OperatorProcess, scenario: dict[str, Any], what: str
) -> None:
    ns = run_namespace
    create_run(kube, ns, scenario_run("big", scenario))

    failed = wait_phase(kube, ns, "big", {"Failed", "Succeeded"}, timeout=120)

    assert failed["status"]["phase"] == "Failed", operator.log_tail()
    failure = failed["status"]["failure"]
    assert failure["class"] == "deterministic"
    assert failure["message"].startswith(what)
    assert "bytes of JSON, over its budget of" in failure["message"]
    assert "store large data elsewhere" in failure["message"]
    [only] = attempts(kube, ns, "big")
    assert (only["status"]["phase"], only["status"]["failure"]["class"]) == ("Failed", "deterministic")


@pytest.mark.parametrize(
    ("state_bytes", "status"),
    [(2 * 1024 * 1024, 500), (4 * 1024 * 1024, 413)],
    ids=["over-etcds-limit", "over-the-api-servers-body-limit"],
)
def test_the_api_servers_answer_to_an_oversize_object_is_too_large(
    kube: Kube, namespace: str, state_bytes: int, status: int
) -> None:
    checkpoint = valid_object("Checkpoint", "huge", {".spec.state": {"blob": "x" * state_bytes}})

    async def create() -> ApiError:
        api = KubeApi(load_configuration(str(kube.kubeconfig)))
        try:
            await api.create(api.custom_path("checkpoints", namespace), checkpoint)
        except ApiError as refused:
            return refused
        finally:
            api.close()
        raise AssertionError("the API server stored an object over etcd's limit")

    refused = asyncio.run(create())

    assert (refused.status, refused.too_large) == (status, True), refused
