"""The operator's Prometheus metrics and JSON logs, from a real operator process carrying a real Run.

This module starts its own operator, namespace-scoped (on the namespaced control plane: conftest.py),
with metrics on a free port (the process node shares one network namespace among all Pods and processes,
so the default port 8000 may be taken) and --log-format json. The session's cluster-wide `operator`
fixture, if another module started it, watches the session's cluster and never sees these Runs.
"""

from __future__ import annotations

import json
import urllib.request
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import watch
from prometheus_client.parser import text_string_to_metric_families

from agentrun.api import RUN_LABEL
from agentrun.core.runs import RECHECK_SECONDS
from devcluster import security
from devcluster.operator import OperatorProcess
from devcluster.processes import free_port
from support.kube import Kube, wait_for
from support.runs import (
    FAST_RETRY,
    GROUP,
    VERSION,
    create_run,
    scenario_run,
    support_agent_run,
    wait_phase,
)

pytestmark = pytest.mark.cluster
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def namespaced_operator(
    kube: Kube, run_namespace: str, tmp_path: Path, operator_kubeconfig: Path
) -> Iterator[tuple[OperatorProcess, int]]:
    port = free_port()
    process = OperatorProcess(
        operator_kubeconfig,
        tmp_path / "operator.log",
        env={"AGENTRUN_METRICS_PORT": str(port), **security.OPERATOR_ENV},
        args=[f"--namespace={run_namespace}", "--log-format=json"],
    )
    process.start()
    process.wait_ready()
    try:
        yield process, port
    finally:
        process.stop()


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), float("nan"))


def test_metrics_and_json_logs_of_a_retried_run(
    kube: Kube, run_namespace: str, namespaced_operator: tuple[OperatorProcess, int]
) -> None:
    operator, port = namespaced_operator
    ns = run_namespace
    before = scrape(port)
    assert value(before, "agentrun_runs", phase="Succeeded") == 0
    assert value(before, "agentrun_reconciles_total", outcome="error") == 0

    scenario = {"steps": 2, "fail": {"attempts": [1], "atStep": 2, "how": "transient", "message": "503"}}
    create_run(kube, ns, scenario_run("flaky", scenario, retry=FAST_RETRY))
    run = wait_phase(kube, ns, "flaky", {"Succeeded", "Failed"})
    assert run["status"]["phase"] == "Succeeded", operator.log_tail()

    # the gauge follows once the reconcile that wrote Succeeded has finished its plan
    def succeeded() -> Samples | None:
        samples = scrape(port)
        return samples if value(samples, "agentrun_runs", phase="Succeeded") == 1 else None

    samples = wait_for(succeeded, timeout=120, what="agentrun_runs{phase=Succeeded} 1")
    assert value(samples, "agentrun_runs", phase="Running") == 0
    assert value(samples, "agentrun_attempts_started_total", reason="initial", failure_class="none") == 1
    assert value(samples, "agentrun_attempts_started_total", reason="retry", failure_class="transient") == 1
    assert value(samples, "agentrun_attempts_ended_total", phase="Failed", failure_class="transient") == 1
    assert value(samples, "agentrun_attempts_ended_total", phase="Succeeded", failure_class="none") == 1
    # the retry took the lease from the failed first Attempt: one new epoch
    takeovers = [value(samples, "agentrun_lease_takeovers_total", kind=k) for k in ("revoked", "handed_over")]
    assert sum(takeovers) == 1
    reconciles = value(samples, "agentrun_reconcile_duration_seconds_count")
    assert reconciles >= 4
    assert value(samples, "agentrun_reconcile_duration_seconds_bucket", le="+Inf") == reconciles
    # the largest bucket is there and cumulative; how long a reconcile took is the machine's (not bounded)
    assert 0 <= value(samples, "agentrun_reconcile_duration_seconds_bucket", le="30.0") <= reconciles
    outcomes = sum(
        value(samples, "agentrun_reconciles_total", outcome=o) for o in ("ok", "superseded", "error")
    )
    assert outcomes == reconciles
    assert value(samples, "agentrun_rejected_commits_total", reason="stale_worker") == 0
    assert value(samples, "agentrun_side_effects", state="Confirmed") == 0
    assert value(samples, "agentrun_work_queue_depth") >= 0

    # JSON logs: every line one object; the Run's story carries run, namespace and attempt
    lines = [line for line in operator.log_path.read_text().splitlines() if line.strip()]
    entries: list[dict[str, Any]] = [json.loads(line) for line in lines]
    assert all({"time", "level", "logger", "message"} <= set(entry) for entry in entries)
    ours = [e for e in entries if e.get("run") == "flaky" and e.get("namespace") == ns]
    started = [e for e in ours if "AttemptStarted" in e["message"]]
    assert [e.get("attempt") for e in started] == ["flaky-a2"], ours  # the first Attempt's start is no news
    assert any(e.get("attempt") == "flaky-a1" and "AttemptFailed" in e["message"] for e in ours), ours
    assert any("Succeeded" in e["message"] and e["level"] == "INFO" for e in ours)

    # a deleted Run leaves the gauge
    kube.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, "runs", "flaky")
    wait_for(
        lambda: value(scrape(port), "agentrun_runs", phase="Succeeded") == 0,
        timeout=120,
        what="the deleted Run to leave agentrun_runs",
    )


def lease_renewals(kube: Kube, ns: str, name: str, most: int) -> Iterator[object]:
    """Each new renewTime of the Lease, as its watch reports it (at most `most` of them)."""
    stream = watch.Watch()
    seen = None
    try:
        for event in stream.stream(
            kube.coordination.list_namespaced_lease,
            ns,
            field_selector=f"metadata.name={name}",
            timeout_seconds=600,  # the renewals are the clock; this only bounds a stuck test
        ):
            renewed = event["object"].spec.renew_time
            if renewed is not None and renewed != seen:
                seen = renewed
                yield renewed
                most -= 1
                if most == 0:
                    return
    finally:
        stream.stop()


def test_lease_renewals_cost_no_reconcile(
    kube: Kube, run_namespace: str, namespaced_operator: tuple[OperatorProcess, int]
) -> None:
    """A healthy worker renews its Lease every second; the operator's expiry check finds each renewal in
    its cache and waits for the new expiry, without deciding the Run again (nor reading it).

    The renewals are the clock: QUIET of them take more than two lease durations however loaded the
    machine is, and the old wake-ups would have reconciled twice in that time. The start's reconciles
    (and a recheck it scheduled) come first; among the first renewals some window of QUIET is quiet.
    The lease is 12 s, not shorter: at a 1-min load of 10-15 a worker was seen to miss a 5 s lease's
    renewals, and the takeover that followed was the machine's, not the operator's."""
    operator, port = namespaced_operator
    ns = run_namespace
    lease = {"durationSeconds": 12, "renewSeconds": 1}
    quiet = 2 * lease["durationSeconds"] + 2
    create_run(kube, ns, scenario_run("steady", {"steps": 1, "stepSeconds": 600}, lease=lease))

    def attempt_running() -> bool:
        attempt = kube.get("attempts.agentrun.dev", "steady-a1", ns) or {}
        return (attempt.get("status") or {}).get("phase") == "Running"

    wait_for(attempt_running, timeout=120, what="steady-a1 Running")
    lease_name = "steady.run.agentrun.dev"
    counts: deque[float] = deque(maxlen=quiet + 1)
    seen: list[float] = []
    for _ in lease_renewals(kube, ns, lease_name, most=quiet + 3 * int(RECHECK_SECONDS) + 10):
        counts.append(value(scrape(port), "agentrun_reconcile_duration_seconds_count"))
        seen.append(counts[-1])
        if len(counts) == counts.maxlen and counts[0] == counts[-1]:
            break
    else:
        raise AssertionError(
            f"no {quiet} renewals in a row without a reconcile: {seen}\n{operator.log_tail()}"
        )

    held = kube.coordination.read_namespaced_lease(lease_name, ns).spec
    assert held.holder_identity == "steady-a1" and held.lease_transitions == 1, operator.log_tail()
    run = kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, "runs", "steady")
    assert run["status"]["phase"] == "Running"


def test_a_stepping_run_s_checkpoints_wake_no_reconcile(
    kube: Kube, run_namespace: str, namespaced_operator: tuple[OperatorProcess, int], tmp_path: Path
) -> None:
    """A step's Checkpoint reaches the operator's watch (its cache stays current) and queues no reconcile.

    The agent steps when told (tests/support/stepping_agent.py: STEPS journaled steps a round, a
    Checkpoint each and no Run write). A round lasts until the operator's metrics count all its
    Checkpoint events delivered: the events are the clock. The first round may still share its window
    with the start's last reconciles (an Attempt status written at start); a later round is quiet, which
    it never was while each Checkpoint event woke its Run. The lease is long: no renewal while it steps."""
    operator, port = namespaced_operator
    ns, name, steps, rounds = run_namespace, "stepper", 20, 3
    body = support_agent_run(name, "stepping_agent", {"dir": str(tmp_path), "rounds": rounds, "steps": steps})
    body["spec"]["lease"] = {"durationSeconds": 3600, "renewSeconds": 1800}
    create_run(kube, ns, body)

    def attempt_running() -> bool:
        attempt = kube.get("attempts.agentrun.dev", f"{name}-a1", ns) or {}
        return (attempt.get("status") or {}).get("phase") == "Running"

    wait_for(attempt_running, timeout=120, what=f"{name}-a1 Running")

    def delivered(samples: Samples, woke: str | None = None) -> float:
        """Checkpoint events the operator's watch delivered (that woke a Run or not; None: all)."""
        return sum(
            value(samples, "agentrun_watch_events_total", kind="checkpoints", woke=each)
            for each in ([woke] if woke else ["true", "false"])
        )

    windows: list[dict[str, float]] = []
    for round_ in range(rounds):
        before = scrape(port)
        (tmp_path / f"go-{round_}").touch()

        def round_delivered(at: Samples = before) -> Samples | None:
            samples = scrape(port)
            return samples if delivered(samples) - delivered(at) >= steps else None

        after = wait_for(round_delivered, timeout=120, what=f"round {round_}: {steps} Checkpoint events")
        windows.append(
            {
                "checkpoint_events": delivered(after) - delivered(before),
                "checkpoint_wakes": delivered(after, "true") - delivered(before, "true"),
                "reconciles": value(after, "agentrun_reconcile_duration_seconds_count")
                - value(before, "agentrun_reconcile_duration_seconds_count"),
            }
        )
        if windows[-1]["reconciles"] == 0:
            break

    assert all(w["checkpoint_wakes"] == 0 for w in windows), windows
    assert any(w["reconciles"] == 0 and w["checkpoint_events"] >= steps for w in windows), (
        f"no round of {steps} Checkpoints without a reconcile: {windows}\n{operator.log_tail()}"
    )
    listed = kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, ns, "checkpoints", label_selector=f"{RUN_LABEL}={name}"
    )["items"]
    assert len([c for c in listed if c["spec"].get("kind") == "Journal"]) == steps * len(windows)

    for round_ in range(len(windows), rounds):
        (tmp_path / f"go-{round_}").touch()
    (tmp_path / "release").touch()
    run = wait_phase(kube, ns, name, {"Succeeded", "Failed"})
    assert run["status"]["phase"] == "Succeeded", operator.log_tail()
    assert run["status"]["result"]["steps"] == steps * rounds
