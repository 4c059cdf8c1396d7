"""The operator carries Runs through Attempts on the real control plane, with real worker processes."""

from __future__ import annotations

import pytest

from support.kube import Kube
from support.operator import OperatorProcess
from support.runs import attempts, create_run, get_run, scenario_run, wait_phase

pytestmark = pytest.mark.cluster


def test_run_succeeds_on_its_first_attempt(kube: Kube, run_namespace: str, operator: OperatorProcess) -> None:
    ns = run_namespace
    create_run(kube, ns, scenario_run("ok", {"steps": 2}))
    run = wait_phase(kube, ns, "ok", {"Succeeded", "Failed"}, timeout=60)
    assert run["status"]["phase"] == "Succeeded", operator.log_tail()
    assert run["status"]["result"] == {"steps": 2, "resumedAt": 0, "attempt": "ok-a1"}
    assert run["status"]["committedBy"] == {"attempt": "ok-a1", "leaseEpoch": 1, "cancelEpoch": 0}
    assert run["status"]["latestCheckpoint"] == "ok-a1-s2"
    [attempt] = attempts(kube, ns, "ok")
    assert attempt["status"]["phase"] == "Succeeded"
    assert attempt["spec"]["reason"] == "initial"
    conditions = {c["type"]: c["status"] for c in run["status"]["conditions"]}
    assert conditions["Succeeded"] == "True"
    assert get_run(kube, ns, "ok")["status"]["observedGeneration"] == 1


FAST_RETRY = {
    "maxAttempts": 3,
    "backoff": {"initialSeconds": 1, "factor": 1.0, "maxSeconds": 1},
    "sameErrorLimit": 3,
}


def test_transient_failure_is_retried_and_history_is_kept(
    kube: Kube, run_namespace: str, operator: OperatorProcess
) -> None:
    ns = run_namespace
    scenario = {
        "steps": 3,
        "fail": {"attempts": [1], "atStep": 2, "how": "transient", "message": "upstream 503"},
    }
    create_run(kube, ns, scenario_run("flaky", scenario, retry=FAST_RETRY))
    run = wait_phase(kube, ns, "flaky", {"Succeeded", "Failed"})
    assert run["status"]["phase"] == "Succeeded", operator.log_tail()
    first, second = attempts(kube, ns, "flaky")
    assert first["status"]["phase"] == "Failed"
    assert first["status"]["failure"]["class"] == "transient"
    assert first["status"]["failure"]["message"] == "upstream 503"
    assert second["spec"]["reason"] == "retry:transient"
    assert second["spec"]["leaseEpoch"] == 2
    assert second["spec"]["resumeFrom"] == "flaky-a1-s1", "the retry continues from the latest checkpoint"
    assert run["status"]["result"]["resumedAt"] == 1
    assert run["status"]["attempts"] == 2


def test_deterministic_failure_is_not_retried(
    kube: Kube, run_namespace: str, operator: OperatorProcess
) -> None:
    ns = run_namespace
    scenario = {"fail": {"how": "permanent", "message": "the input is malformed"}}
    create_run(kube, ns, scenario_run("broken", scenario, retry=FAST_RETRY))
    run = wait_phase(kube, ns, "broken", {"Succeeded", "Failed"})
    assert run["status"]["phase"] == "Failed"
    assert run["status"]["failure"]["class"] == "deterministic"
    assert run["status"]["failure"]["reason"] == "NotRetryable"
    assert [a["status"]["phase"] for a in attempts(kube, ns, "broken")] == ["Failed"]


def test_retry_budget_is_bounded(kube: Kube, run_namespace: str, operator: OperatorProcess) -> None:
    ns = run_namespace
    retry = {**FAST_RETRY, "maxAttempts": 2, "sameErrorLimit": 5}
    create_run(kube, ns, scenario_run("budget", {"fail": {"how": "exit75"}}, retry=retry))
    run = wait_phase(kube, ns, "budget", {"Succeeded", "Failed"})
    assert run["status"]["failure"]["reason"] == "RetryBudgetExhausted"
    assert [a["status"]["failure"]["class"] for a in attempts(kube, ns, "budget")] == [
        "transient",
        "transient",
    ]


def test_the_same_error_twice_stops_the_run(
    kube: Kube, run_namespace: str, operator: OperatorProcess
) -> None:
    ns = run_namespace
    retry = {**FAST_RETRY, "maxAttempts": 5, "sameErrorLimit": 2}
    scenario = {"fail": {"how": "transient", "message": "tool timed out after 3000 ms"}}
    create_run(kube, ns, scenario_run("same", scenario, retry=retry))
    run = wait_phase(kube, ns, "same", {"Succeeded", "Failed"})
    assert run["status"]["failure"]["reason"] == "RepeatedFailure"
    assert len(attempts(kube, ns, "same")) == 2


def test_killed_worker_is_replaced_from_the_latest_checkpoint(
    kube: Kube, run_namespace: str, operator: OperatorProcess
) -> None:
    ns = run_namespace
    scenario = {"steps": 3, "fail": {"attempts": [1], "atStep": 3, "how": "crash"}}
    create_run(kube, ns, scenario_run("killed", scenario, retry=FAST_RETRY))
    run = wait_phase(kube, ns, "killed", {"Succeeded", "Failed"})
    assert run["status"]["phase"] == "Succeeded", operator.log_tail()
    first, second = attempts(kube, ns, "killed")
    assert first["status"]["failure"]["class"] == "infrastructure"
    assert first["status"]["failure"]["exitCode"] == 137
    assert (second["spec"]["leaseEpoch"], second["spec"]["resumeFrom"]) == (2, "killed-a1-s2")
    assert run["status"]["result"]["resumedAt"] == 2
