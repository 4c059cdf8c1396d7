"""Steps, usage and traces on real parts: the namespaced control plane (conftest.py), a namespace-scoped
operator exporting spans, attempt Pods running the scenario agent, and a real OpenTelemetry Collector.

The collector is built from its Go modules by hack/build-otelcol.sh (`make binaries`): the OTLP receiver
and the contrib file exporter, which writes every batch it received as one OTLP/JSON line; the tests
read that file. Like test_metrics.py, the module's operator watches only its namespace, and the
session's cluster-wide `operator` (started by other modules) never reconciles these Runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentrun.core.traces import TRACEPARENT_ANNOTATION, run_trace
from devcluster import security
from devcluster.operator import OperatorProcess
from devcluster.processes import free_port, spawn, stop_group
from support.clusters import opt_in_for_attempts
from support.corpus import REPO
from support.kube import Kube, wait_for
from support.runs import (
    FAST_RETRY,
    GROUP,
    VERSION,
    attempts,
    create_run,
    patch_spec,
    resume,
    scenario_run,
    wait_attempt_phase,
    wait_phase,
)

pytestmark = pytest.mark.cluster
JsonDict = dict[str, Any]


# ---- the collector -------------------------------------------------------------------------------------


@dataclass
class Collector:
    endpoint: str
    output: Path

    def spans(self) -> list[JsonDict]:
        """Every span received so far, with its service.name as `service`."""
        if not self.output.exists():
            return []
        out = []
        for line in self.output.read_text().splitlines():
            if not line.strip():
                continue
            for resource_spans in json.loads(line).get("resourceSpans", []):
                attributes = (resource_spans.get("resource") or {}).get("attributes", [])
                service = next(
                    (a["value"].get("stringValue") for a in attributes if a["key"] == "service.name"), None
                )
                for scope in resource_spans.get("scopeSpans", []):
                    out += [{**span, "service": service} for span in scope.get("spans", [])]
        return out

    def trace(self, trace_id: str) -> list[JsonDict]:
        return [s for s in self.spans() if s["traceId"] == trace_id]


def attribute(span: JsonDict, key: str) -> Any:
    for a in span.get("attributes", []):
        if a["key"] == key:
            return next(iter(a["value"].values()))
    return None


def collector_binary() -> Path:
    # `make test` builds it first (make binaries); building here keeps a bare pytest run working too.
    subprocess.run(["bash", str(REPO / "hack/build-otelcol.sh")], check=True, timeout=900)
    path = subprocess.run(
        ["bash", str(REPO / "hack/build-otelcol.sh"), "print-bin"], check=True, capture_output=True, text=True
    ).stdout.strip()
    return Path(path)


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    workdir = tmp_path_factory.mktemp("otelcol")
    port, output, log = free_port(), workdir / "traces.jsonl", workdir / "otelcol.log"
    config = workdir / "config.yaml"
    config.write_text(
        json.dumps(  # JSON is YAML
            {
                "receivers": {"otlp": {"protocols": {"http": {"endpoint": f"127.0.0.1:{port}"}}}},
                "exporters": {"file": {"path": str(output), "flush_interval": "100ms"}},
                "service": {
                    "telemetry": {"metrics": {"level": "none"}},
                    "pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["file"]}},
                },
            }
        )
    )
    process = spawn([str(collector_binary()), "--config", str(config)], log, tie_to_parent=True)
    try:
        wait_for(
            lambda: "Everything is ready" in log.read_text(errors="replace") or process.poll() is not None,
            timeout=120,
            what="the collector ready",
        )
        assert process.poll() is None, log.read_text(errors="replace")
        yield Collector(f"http://127.0.0.1:{port}", output)
    finally:
        stop_group(process.pid, grace_seconds=5)


# ---- a control plane and an operator of this module's own ----------------------------------------------


@pytest.fixture(scope="module")
def ns(kube: Kube, module_namespace: str) -> str:
    """As the session's run_namespace, for the module: the default account opted in, with the attempt
    role."""
    return opt_in_for_attempts(kube, module_namespace)


@dataclass
class Operator:
    process: OperatorProcess
    metrics_port: int


@pytest.fixture(scope="module")
def traced_operator(
    kube: Kube, ns: str, collector: Collector, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    workdir = tmp_path_factory.mktemp("traced-operator")
    kubeconfig = security.install(str(kube.kubectl_path), kube.kubeconfig, workdir / "kubeconfig")
    port = free_port()
    process = OperatorProcess(
        kubeconfig,
        workdir / "operator.log",
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint, "AGENTRUN_METRICS_PORT": str(port)},
        args=[f"--namespace={ns}"],
    )
    process.start()
    process.wait_ready()
    try:
        yield Operator(process, port)
    finally:
        process.stop()


def run_of(kube: Kube, ns: str, name: str) -> JsonDict:
    run: JsonDict = kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, "runs", name)
    return run


def checkpoints(kube: Kube, ns: str, run: str) -> list[JsonDict]:
    items: list[JsonDict] = kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, ns, "checkpoints", label_selector=f"agentrun.dev/run={run}"
    )["items"]
    return items


def succeeded(kube: Kube, ns: str, name: str, operator: Operator) -> JsonDict:
    run = wait_phase(kube, ns, name, {"Succeeded", "Failed", "NeedsReconciliation"}, timeout=120)
    assert run["status"]["phase"] == "Succeeded", (run["status"], operator.process.log_tail())
    return run


def usage_summed(kube: Kube, ns: str, name: str) -> JsonDict:
    """The Run once its status.usage is the sum of its Attempts' (the last flush may follow the end)."""

    def summed() -> JsonDict | None:
        run = run_of(kube, ns, name)
        total: dict[str, int] = {}
        for a in attempts(kube, ns, name):
            for k, v in ((a.get("status") or {}).get("usage") or {}).items():
                total[k] = total.get(k, 0) + v
        usage = run["status"].get("usage")
        return run if total and usage == total else None

    return wait_for(summed, timeout=120, what=f"{name}'s usage summed")


# ---- steps ---------------------------------------------------------------------------------------------


def test_a_step_that_fails_twice_then_succeeds_stays_in_one_attempt(
    kube: Kube, ns: str, traced_operator: Operator, tmp_path: Path
) -> None:
    calls = tmp_path / "calls"
    step = {"name": "model", "calls": str(calls), "failTimes": 2, "retry": {"maxAttempts": 4}}
    create_run(kube, ns, scenario_run("stepper", {"steps": 1, "step": step}, retry=FAST_RETRY))
    run = succeeded(kube, ns, "stepper", traced_operator)

    [only] = attempts(kube, ns, "stepper")
    assert calls.read_text().splitlines() == ["stepper-a1"] * 3
    assert run["status"]["result"]["stepResults"] == [{"call": 3, "by": "stepper-a1"}]
    run = usage_summed(kube, ns, "stepper")
    assert only["status"]["phase"] == "Succeeded"
    assert run["status"]["usage"]["stepRetries"] == 2


def test_a_step_out_of_retries_fails_the_attempt_with_its_name(
    kube: Kube, ns: str, traced_operator: Operator, tmp_path: Path
) -> None:
    step = {"name": "model", "calls": str(tmp_path / "calls"), "failTimes": 99, "how": "ratelimited"}
    retry = {**FAST_RETRY, "maxAttempts": 1}
    create_run(kube, ns, scenario_run("gives-up", {"steps": 1, "step": step}, retry=retry))
    run = wait_phase(kube, ns, "gives-up", {"Succeeded", "Failed"}, timeout=120)

    assert run["status"]["phase"] == "Failed"
    [only] = attempts(kube, ns, "gives-up")
    failure = only["status"]["failure"]
    assert failure["class"] == "rate_limited"
    assert "step 'model' failed after 3 tries" in failure["message"]
    assert usage_summed(kube, ns, "gives-up")["status"]["usage"]["stepRetries"] == 2


def test_a_step_cancelled_in_its_backoff_stops_at_once(
    kube: Kube, ns: str, traced_operator: Operator, tmp_path: Path
) -> None:
    calls = tmp_path / "calls"
    hour = {"maxAttempts": 5, "initialSeconds": 3600, "maxSeconds": 3600}
    step = {"name": "model", "calls": str(calls), "failTimes": 99, "retry": hour}
    body = scenario_run("backoff", {"steps": 1, "step": step})
    # An hour of grace: a Pod gone within the wait below proves the agent stopped on the cancel.
    body["spec"]["agent"]["podTemplate"] = {"spec": {"terminationGracePeriodSeconds": 3600}}
    create_run(kube, ns, body)
    # the first call failed: the step now waits an hour before its second
    wait_for(lambda: calls.exists() and calls.read_text(), timeout=120, what="the step's first call")

    patch_spec(kube, ns, "backoff", {"cancelEpoch": 1})
    run = wait_phase(kube, ns, "backoff", {"Cancelled"}, timeout=120)
    # A stuck agent would hold its Pod for the hour of grace: this one stopped on the cancel, in its
    # backoff, and on its way out wrote what it used (the retry it had counted).
    wait_for(lambda: kube.pod("backoff-a1", ns) is None, timeout=120, what="the attempt Pod gone")
    only = wait_attempt_phase(kube, ns, "backoff", 1, {"Aborted"})  # written after the Run's decision
    assert (only["status"].get("usage") or {}).get("stepRetries") == 1
    assert calls.read_text().splitlines() == ["backoff-a1"]  # never called again
    assert run["status"]["attempts"] == 1


def test_a_journaled_step_is_not_called_again_after_a_crash(
    kube: Kube, ns: str, traced_operator: Operator, tmp_path: Path
) -> None:
    calls = tmp_path / "calls"
    scenario = {
        "steps": 1,
        "step": {"name": "plan", "calls": str(calls), "journal": True, "repeat": 2},
        # the process dies (no cleanup) after the two steps, before any checkpoint
        "fail": {"attempts": [1], "atStep": 1, "how": "exit75"},
    }
    create_run(kube, ns, scenario_run("journaled", scenario, retry=FAST_RETRY))
    run = succeeded(kube, ns, "journaled", traced_operator)

    first, second = attempts(kube, ns, "journaled")
    assert (first["status"]["phase"], second["spec"]["reason"]) == ("Failed", "retry:transient")
    assert calls.read_text().splitlines() == ["journaled-a1", "journaled-a1"]  # only by Attempt 1
    assert run["status"]["result"]["stepResults"] == [
        {"call": 1, "by": "journaled-a1"},
        {"call": 2, "by": "journaled-a1"},
    ]
    kinds = {c["metadata"]["name"]: c["spec"].get("kind") for c in checkpoints(kube, ns, "journaled")}
    assert sorted(kinds.values()) == ["Journal", "Journal", "State"]
    assert kinds[run["status"]["latestCheckpoint"]] == "State"


def test_a_journaled_step_is_called_again_after_an_answer(
    kube: Kube, ns: str, traced_operator: Operator, tmp_path: Path
) -> None:
    calls = tmp_path / "calls"
    scenario = {
        "steps": 1,
        "step": {"name": "look", "calls": str(calls), "journal": True},
        "ask": {"atStep": 1, "prompt": "go on?"},
    }
    create_run(kube, ns, scenario_run("answered", scenario))
    waiting = wait_phase(kube, ns, "answered", {"InputRequired", "Failed"}, timeout=120)
    pending = waiting["status"]["pendingRequest"]
    resume(kube, ns, "answered", pending, {"ok": 1}, key="k1")
    succeeded(kube, ns, "answered", traced_operator)
    # the world may have changed while the Run waited: the step looks again
    assert calls.read_text().splitlines() == ["answered-a1", "answered-a2"]


# ---- usage ---------------------------------------------------------------------------------------------


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_usage_is_summed_across_a_failed_and_a_successful_attempt(
    kube: Kube, ns: str, traced_operator: Operator
) -> None:
    scenario = {
        "steps": 2,
        "usage": {"inputTokens": 100, "outputTokens": 10, "costUSD": 0.001, "modelCalls": 1},
        "fail": {"attempts": [1], "atStep": 2, "how": "transient"},
    }
    create_run(kube, ns, scenario_run("metered", scenario, retry=FAST_RETRY))
    succeeded(kube, ns, "metered", traced_operator)
    run = usage_summed(kube, ns, "metered")

    first, second = attempts(kube, ns, "metered")
    assert first["status"]["phase"] == "Failed"
    # Attempt 1 reported steps 1 and 2 (then failed), Attempt 2 step 2 again, from the checkpoint
    assert first["status"]["usage"] == {
        "inputTokens": 200,
        "outputTokens": 20,
        "costMicroUSD": 2000,
        "modelCalls": 2,
        "stepRetries": 0,
    }
    assert second["status"]["usage"]["inputTokens"] == 100
    assert run["status"]["usage"] == {
        "inputTokens": 300,
        "outputTokens": 30,
        "costMicroUSD": 3000,
        "modelCalls": 3,
        "stepRetries": 0,
    }

    described = subprocess.run(
        [sys.executable, "-m", "agentrun.cli", "-n", ns, "describe", "metered"],
        env={**os.environ, "KUBECONFIG": str(kube.kubeconfig)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    table = described.split("Usage:\n")[1].split("\n\n")[0].splitlines()
    assert table[1].split() == ["metered-a1", "Failed", "200", "20", "2", "$0.002000", "0"]
    assert table[2].split() == ["metered-a2", "Succeeded", "100", "10", "1", "$0.001000", "0"]
    assert table[3].split() == ["total", "-", "300", "30", "3", "$0.003000", "0"]

    def counted() -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
        samples = scrape(traced_operator.metrics_port)
        key = ("agentrun_usage_model_calls_total", frozenset({("namespace", ns)}))
        return samples if samples.get(key, 0) >= 3 else None

    samples = wait_for(counted, timeout=120, what="agentrun_usage_model_calls_total")
    # this module's other Runs report no tokens: these are the metered Run's alone
    assert samples[("agentrun_usage_input_tokens_total", frozenset({("namespace", ns)}))] == 300
    assert samples[("agentrun_usage_cost_usd_total", frozenset({("namespace", ns)}))] == pytest.approx(0.003)


def test_usage_and_steps_cost_no_request_per_call(kube: Kube, ns: str, traced_operator: Operator) -> None:
    """The requests an Attempt makes do not grow with its model calls and steps: 1 call against 500."""
    made = {}
    for name, times in (("once", 1), ("many", 500)):
        scenario = {
            "steps": 1,
            "usage": {"inputTokens": 10, "modelCalls": 1, "times": times},
            "reportRequests": True,
        }
        create_run(kube, ns, scenario_run(name, scenario))
        run = succeeded(kube, ns, name, traced_operator)
        made[name] = run["status"]["result"]["apiRequests"]
        assert usage_summed(kube, ns, name)["status"]["usage"]["modelCalls"] == times
    print(f"API requests of an Attempt until its result: {made}")
    assert made["once"] == made["many"]


# ---- traces --------------------------------------------------------------------------------------------


def test_one_trace_per_run_with_its_attempts_as_children(
    kube: Kube, ns: str, traced_operator: Operator, collector: Collector, tmp_path: Path
) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint}
    scenario = {
        "steps": 2,
        "step": {"name": "model", "calls": str(tmp_path / "calls"), "failTimes": 1},
        "fail": {"attempts": [1], "atStep": 2, "how": "transient"},
    }
    create_run(kube, ns, scenario_run("traced", scenario, retry=FAST_RETRY, env=env))
    user_parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    joined = scenario_run("joined", {"steps": 1}, env=env)
    joined["metadata"]["annotations"] = {TRACEPARENT_ANNOTATION: user_parent}
    create_run(kube, ns, joined)
    run = succeeded(kube, ns, "traced", traced_operator)
    joined_run = succeeded(kube, ns, "joined", traced_operator)

    trace = run_trace(run["metadata"]["uid"], run["metadata"].get("annotations"))
    names = ["traced-a1", "traced-a2"]
    for a in attempts(kube, ns, "traced"):
        assert a["status"]["traceId"] == trace.run.trace_id

    def complete() -> list[JsonDict] | None:
        spans = collector.trace(trace.run.trace_id)
        seen = {s["name"] for s in spans}
        wanted = {"run traced", *(f"attempt {n}" for n in names), "commit", "step", "checkpoint"}
        return spans if wanted <= seen else None

    spans = wait_for(complete, timeout=120, what="the Run's spans at the collector")
    by_id = {s["spanId"]: s for s in spans}
    [root] = [s for s in spans if not s.get("parentSpanId")]
    assert (root["name"], root["spanId"], root["service"]) == (
        "run traced",
        trace.run.span_id,
        "agentrun-operator",
    )
    attempt_spans = sorted((s for s in spans if s["name"].startswith("attempt ")), key=lambda s: s["name"])
    assert [s["name"] for s in attempt_spans] == [f"attempt {n}" for n in names]
    assert all(s["parentSpanId"] == root["spanId"] for s in attempt_spans)
    assert [s["spanId"] for s in attempt_spans] == [trace.attempt(n).span_id for n in names]
    assert attempt_spans[0]["status"].get("code") == 2  # STATUS_CODE_ERROR: Attempt 1 failed

    def attempt_above(span: JsonDict) -> str | None:
        while span.get("parentSpanId") and span["parentSpanId"] in by_id:
            span = by_id[span["parentSpanId"]]
            if span["name"].startswith("attempt "):
                return str(span["name"])
        return None

    worker_spans = [s for s in spans if s["service"] == "agentrun-worker"]
    assert {s["name"] for s in worker_spans} >= {"step", "checkpoint", "commit"}
    assert all(attempt_above(s) in {f"attempt {n}" for n in names} for s in worker_spans)
    [commit] = [s for s in worker_spans if s["name"] == "commit"]
    assert attempt_above(commit) == "attempt traced-a2"
    [step] = [s for s in worker_spans if s["name"] == "step"]  # run once: Attempt 2 resumed after it
    # (OTLP/JSON carries 64-bit integers as strings)
    assert int(attribute(step, "agentrun.tries")) == 2 and attribute(step, "agentrun.step") == "model"
    reconciles = [s for s in spans if s["name"] == "reconcile"]
    assert reconciles and all(s["parentSpanId"] == root["spanId"] for s in reconciles)
    assert {attribute(s, "agentrun.next_phase") for s in reconciles} >= {"Running", "Succeeded"}
    # one trace per Run: nothing of this Run's went anywhere else
    assert all(
        s["traceId"] == trace.run.trace_id
        for s in collector.spans()
        if attribute(s, "agentrun.run") == "traced"
    )

    # a Run whose creator set a traceparent joins that trace, under the creator's span
    def joined_spans() -> list[JsonDict] | None:
        spans = collector.trace("4bf92f3577b34da6a3ce929d0e0e4736")
        return spans if {"run joined", "attempt joined-a1", "commit"} <= {s["name"] for s in spans} else None

    spans = wait_for(joined_spans, timeout=120, what="the joined Run's spans")
    [run_span] = [s for s in spans if s["name"] == "run joined"]
    assert run_span["parentSpanId"] == "00f067aa0ba902b7"
    assert [a["status"]["traceId"] for a in attempts(kube, ns, "joined")] == [
        "4bf92f3577b34da6a3ce929d0e0e4736"
    ]
    assert joined_run["status"]["phase"] == "Succeeded"
