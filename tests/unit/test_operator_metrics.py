"""The operator's metrics and logs without a cluster: label mapping, the hooks in the cache and the executor
(against an in-memory API), the scrape-time gauges, and the JSON log lines."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import sys
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agentrun.api import StateStoreMode, Usage, lease_name
from agentrun.core.plan import (
    CreateAttempt,
    DeletePod,
    PatchAttemptStatus,
    PatchRunStatus,
    Plan,
    RecordEvent,
    WriteLease,
)
from agentrun.core.pods import owner_reference
from agentrun.kubeapi import ApiError, KubeApi
from agentrun.operator import logs, metrics
from agentrun.operator.cache import OwnedObjects
from agentrun.operator.executor import Executor, Written
from agentrun.operator.metrics import OperatorMetrics
from agentrun.operator.workqueue import WorkQueue
from support.clock import FakeClock
from unit.factories import NAMESPACE, RUN, make_run

JsonDict = dict[str, Any]


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    assert value is not None, f"{name}{labels} is not exported"
    return value


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def m(registry: CollectorRegistry) -> OperatorMetrics:
    return OperatorMetrics(registry)


# --- label mapping --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "labels"),
    [
        ("initial", ("initial", "none")),
        ("lease_expired", ("lease_expired", "none")),
        ("manual_retry", ("manual_retry", "none")),
        ("retry:transient", ("retry", "transient")),
        ("retry:rate_limited", ("retry", "rate_limited")),
        ("retry:made_up", ("retry", "other")),
        ("resume:req-7", ("resume", "none")),  # request ids would make the label unbounded
        ("resume:", ("other", "none")),
        ("initial:x", ("other", "none")),
        ("something", ("other", "none")),
    ],
)
def test_attempt_reasons_collapse_to_a_bounded_label_set(reason: str, labels: tuple[str, str]) -> None:
    assert metrics.attempt_reason_labels(reason) == labels


def test_failure_classes_and_phases_are_bounded() -> None:
    assert metrics.failure_class_label(None) == "none"
    assert metrics.failure_class_label("") == "none"
    assert metrics.failure_class_label("deterministic") == "deterministic"
    assert metrics.failure_class_label("cosmic_rays") == "other"
    assert metrics.run_phase_label(None) is None
    assert metrics.run_phase_label("Succeeded") == "Succeeded"
    assert metrics.run_phase_label("Exploded") == "other"


@pytest.mark.parametrize(
    ("patch", "labels"),
    [
        ({"phase": "Succeeded", "completionTime": "t"}, ("Succeeded", "none")),
        ({"phase": "Failed", "failure": {"class": "transient", "message": "503"}}, ("Failed", "transient")),
        ({"phase": "LeaseLost", "failure": {"class": "lease_lost"}}, ("LeaseLost", "lease_lost")),
        ({"phase": "Aborted", "failure": {"class": "cancelled"}}, ("Aborted", "cancelled")),
        ({"phase": "Interrupted"}, ("Interrupted", "none")),
        ({"phase": "Running", "startTime": "t"}, None),
        ({"phase": "Pending", "podName": "p"}, None),
        ({"podName": "p"}, None),
    ],
)
def test_only_finishing_attempt_patches_count_as_ended(
    patch: JsonDict, labels: tuple[str, str] | None
) -> None:
    assert metrics.finished_attempt_labels(patch) == labels


def lease(holder: str | None, epoch: int) -> JsonDict:
    return {
        "metadata": {"name": lease_name(RUN), "namespace": NAMESPACE, "resourceVersion": "7"},
        "spec": {"holderIdentity": holder, "leaseTransitions": epoch, "leaseDurationSeconds": 60},
    }


@pytest.mark.parametrize(
    ("previous", "action", "kind"),
    [
        (None, WriteLease("r-a1", 1, 60, None), None),  # the first grant creates the Lease
        (lease("r-a1", 1), WriteLease(None, 2, 60, "7"), "revoked"),  # expired lease, deadline
        (lease("r-a1", 1), WriteLease("r-a2", 2, 60, "7"), "handed_over"),  # retry while a1 held it
        (lease(None, 2), WriteLease("r-a2", 2, 60, "7"), None),  # grant of a revoked lease: counted then
        (lease("r-a1", 1), WriteLease("r-a1", 1, 60, "7"), None),
    ],
)
def test_lease_takeovers(previous: JsonDict | None, action: WriteLease, kind: str | None) -> None:
    assert metrics.lease_takeover_kind(previous, action) == kind


def test_planned_phase_is_the_last_phase_the_plan_writes() -> None:
    plan = Plan(
        [
            PatchRunStatus({"phase": "Running"}),
            RecordEvent("Normal", "AttemptStarted", "m"),
            PatchRunStatus({"controls": []}),
            PatchRunStatus({"phase": "Succeeded"}),
            PatchRunStatus({"message": "x"}),
        ]
    )
    assert metrics.planned_run_phase(plan) == "Succeeded"
    assert metrics.planned_run_phase(Plan([PatchRunStatus({"controls": []})])) is None


# --- hooks and scrape-time gauges ---------------------------------------------------------------------------


def attempt(name: str, rv: str, rejected: str | None = None, phase: str = "Running") -> JsonDict:
    status: JsonDict = {"phase": phase}
    if rejected:
        status = {"phase": "Rejected", "rejectedCommit": {"reason": rejected, "message": "m", "time": "t"}}
    return {
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "resourceVersion": rv,
            "labels": {"agentrun.dev/run": RUN},
        },
        "spec": {"runName": RUN, "number": 1},
        "status": status,
    }


def test_rejected_commits_count_each_attempt_once(registry: CollectorRegistry, m: OperatorMetrics) -> None:
    cache = OwnedObjects(FakeClock(), on_put=m.cached)
    cache.put("attempts", attempt("r-a1", "1"))
    assert sample(registry, "agentrun_rejected_commits_total", reason="stale_worker") == 0
    cache.put("attempts", attempt("r-a1", "2", rejected="stale_worker"))
    cache.put("attempts", attempt("r-a1", "3", rejected="stale_worker"))  # a later update of the same
    cache.put("attempts", attempt("r-a1", "2", rejected="stale_worker"))  # an old event: refused
    cache.put("attempts", attempt("r-a2", "4", rejected="stale_after_cancel"))  # first seen rejected
    assert sample(registry, "agentrun_rejected_commits_total", reason="stale_worker") == 1
    assert sample(registry, "agentrun_rejected_commits_total", reason="stale_after_cancel") == 1


def test_pods_collected_count_the_deletions_of_spec_pod_gc_only(
    registry: CollectorRegistry, m: OperatorMetrics
) -> None:
    run = make_run()
    m.written(run, Written(DeletePod("r-a1", collected=True)))
    m.written(run, Written(DeletePod("r-a2", grace_seconds=0)))  # a superseded Attempt's Pod: not podGC
    assert sample(registry, "agentrun_attempt_pods_collected_total") == 1


def effect(name: str, state: str | None, run: str = RUN) -> JsonDict:
    body: JsonDict = {
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "resourceVersion": "1",
            "labels": {"agentrun.dev/run": run},
        },
        "spec": {},
    }
    if state:
        body["status"] = {"state": state}
    return body


def test_gauges_are_read_at_scrape_time(registry: CollectorRegistry, m: OperatorMetrics) -> None:
    cache = OwnedObjects(FakeClock())
    queue: WorkQueue[tuple[str, str]] = WorkQueue(FakeClock())
    m.track(side_effects=lambda: cache.snapshot("sideeffects"), queue_depth=queue.__len__)
    for name, state in (("a", "Confirmed"), ("b", "Confirmed"), ("c", None), ("d", "Unknown")):
        cache.put("sideeffects", effect(name, state, run="r1" if name < "c" else "r2"))
    m.run_seen((NAMESPACE, "r1"), "Running")
    m.run_seen((NAMESPACE, "r2"), "Running")
    m.run_seen((NAMESPACE, "r2"), "Succeeded")
    m.run_seen((NAMESPACE, "r3"), None)  # no phase yet: not counted

    async def fill() -> None:
        queue.add((NAMESPACE, "r1"))
        queue.add((NAMESPACE, "r2"))

    asyncio.run(fill())
    assert sample(registry, "agentrun_side_effects", state="Confirmed") == 2
    assert sample(registry, "agentrun_side_effects", state="Pending") == 1  # no status counts as Pending
    assert sample(registry, "agentrun_side_effects", state="Unknown") == 1
    assert sample(registry, "agentrun_side_effects", state="Compensated") == 0
    assert sample(registry, "agentrun_runs", phase="Running") == 1
    assert sample(registry, "agentrun_runs", phase="Succeeded") == 1
    assert sample(registry, "agentrun_runs", phase="Queued") == 0
    assert sample(registry, "agentrun_work_queue_depth") == 2
    m.forget_run((NAMESPACE, "r2"))
    cache.forget_run((NAMESPACE, "r2"))
    assert sample(registry, "agentrun_runs", phase="Succeeded") == 0
    assert sample(registry, "agentrun_side_effects", state="Unknown") == 0


def test_reconciles_and_their_latency(registry: CollectorRegistry, m: OperatorMetrics) -> None:
    m.reconciled("ok", 0.02)
    m.reconciled("superseded", 0.3)
    m.reconciled("error", 4)
    assert sample(registry, "agentrun_reconciles_total", outcome="ok") == 1
    assert sample(registry, "agentrun_reconciles_total", outcome="error") == 1
    assert sample(registry, "agentrun_reconcile_duration_seconds_bucket", le="0.025") == 1
    assert sample(registry, "agentrun_reconcile_duration_seconds_bucket", le="+Inf") == 3
    assert sample(registry, "agentrun_reconcile_duration_seconds_count") == 3


def test_watch_events_by_kind_and_whether_they_woke_a_run(
    registry: CollectorRegistry, m: OperatorMetrics
) -> None:
    assert sample(registry, "agentrun_watch_events_total", kind="checkpoints", woke="false") == 0
    m.watch_event("checkpoints", False)
    m.watch_event("checkpoints", False)
    m.watch_event("attempts", True)
    assert sample(registry, "agentrun_watch_events_total", kind="checkpoints", woke="false") == 2
    assert sample(registry, "agentrun_watch_events_total", kind="checkpoints", woke="true") == 0
    assert sample(registry, "agentrun_watch_events_total", kind="attempts", woke="true") == 1


def test_every_metric_has_help_and_the_agentrun_prefix(registry: CollectorRegistry) -> None:
    OperatorMetrics(registry)
    families = list(registry.collect())
    assert {f.name for f in families} == {
        "agentrun_runs",
        "agentrun_side_effects",
        "agentrun_attempts_started",
        "agentrun_attempts_ended",
        "agentrun_reconcile_duration_seconds",
        "agentrun_reconciles",
        "agentrun_watch_events",
        "agentrun_lease_takeovers",
        "agentrun_rejected_commits",
        "agentrun_undeclared_moves",
        "agentrun_attempt_pods_collected",
        "agentrun_work_queue_depth",
        "agentrun_operator_active",
        "agentrun_state_store_mode",
        "agentrun_usage_input_tokens",
        "agentrun_usage_output_tokens",
        "agentrun_usage_cost_usd",
        "agentrun_usage_model_calls",
        "agentrun_usage_step_retries",
    }
    assert all(len(f.documentation) > 20 for f in families)
    assert b'agentrun_runs{phase="Succeeded"} 0.0' in generate_latest(registry)


def test_usage_counts_what_a_run_status_write_added_by_namespace(
    registry: CollectorRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    counted = OperatorMetrics(registry)
    first = Usage(input_tokens=100, cost_micro_usd=2500, step_retries=1)
    counted.usage_added("team-a", None, first)
    counted.usage_added("team-a", first, first.plus(Usage(input_tokens=20, model_calls=3)))
    counted.usage_added("team-b", Usage(output_tokens=7), Usage(output_tokens=7))  # no growth: nothing

    def sample(name: str, namespace: str) -> float | None:
        return registry.get_sample_value(f"agentrun_usage_{name}_total", {"namespace": namespace})

    assert sample("input_tokens", "team-a") == 120
    assert sample("cost_usd", "team-a") == pytest.approx(0.0025)
    assert sample("model_calls", "team-a") == 3
    assert sample("step_retries", "team-a") == 1
    assert sample("output_tokens", "team-b") is None

    # the namespace label is bounded: past the limit, namespaces count as "other"
    monkeypatch.setattr(metrics, "MAX_USAGE_NAMESPACES", 2)
    counted.usage_added("team-c", None, Usage(model_calls=1))
    counted.usage_added("team-a", None, Usage(model_calls=1))
    assert sample("model_calls", "other") == 1
    assert sample("model_calls", "team-a") == 4


class MemoryApi(KubeApi):
    """Just enough of the API server for the executor: objects by path, 409 on a second create."""

    def __init__(self) -> None:
        self.objects: dict[str, JsonDict] = {}
        self.version = 100

    def _store(self, path: str, obj: JsonDict) -> JsonDict:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        obj["metadata"].setdefault("uid", f"uid-{self.version}")
        self.objects[path] = obj
        return copy.deepcopy(obj)

    async def get(self, path: str) -> JsonDict | None:
        return copy.deepcopy(self.objects.get(path))

    async def create(self, path: str, body: JsonDict) -> JsonDict:
        path = f"{path}/{body['metadata']['name']}"
        if path in self.objects:
            raise ApiError(409, "AlreadyExists", path)
        return self._store(path, copy.deepcopy(body))

    async def merge_patch(self, path: str, patch: JsonDict) -> JsonDict:
        path = path.removesuffix("/status")
        if path not in self.objects:
            raise ApiError(404, "NotFound", path)
        obj = copy.deepcopy(self.objects[path])
        for section in ("spec", "status"):
            obj.setdefault(section, {}).update(patch.get(section, {}))
        return self._store(path, obj)


def test_executor_counts_attempts_once_and_lease_takeovers(
    registry: CollectorRegistry, m: OperatorMetrics
) -> None:
    run = make_run({"phase": "Running"})
    api, cache = MemoryApi(), OwnedObjects(FakeClock())
    executor = Executor(api, cache, clock=FakeClock(), observers=[m])
    body = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "Attempt",
        "metadata": {
            "name": f"{RUN}-a2",
            "namespace": NAMESPACE,
            "labels": {"agentrun.dev/run": RUN},
            "ownerReferences": [owner_reference(run, controller=True)],
        },
        "spec": {"runName": RUN, "number": 2, "reason": "retry:rate_limited"},
    }
    attempt_path = KubeApi.custom_path("attempts", NAMESPACE, f"{RUN}-a2")
    lease_collection = KubeApi.lease_path(NAMESPACE)

    async def scenario() -> None:
        await executor.execute(Plan([WriteLease(f"{RUN}-a1", 1, 60, None)]), run)
        held = cache.of("leases", (NAMESPACE, RUN))[0]["metadata"]["resourceVersion"]
        await executor.execute(Plan([WriteLease(f"{RUN}-a2", 2, 60, held)]), run)
        await executor.execute(Plan([CreateAttempt(body)]), run)
        await executor.execute(Plan([CreateAttempt(body)]), run)  # a repeat finds it: not counted
        finish = {"phase": "Failed", "failure": {"class": "transient", "message": "503"}}
        await executor.execute(Plan([PatchAttemptStatus(f"{RUN}-a2", {"phase": "Running"})]), run)
        await executor.execute(Plan([PatchAttemptStatus(f"{RUN}-a2", finish)]), run)
        await executor.execute(Plan([PatchAttemptStatus(f"{RUN}-a9", finish)]), run)  # gone: no count
        held = cache.of("leases", (NAMESPACE, RUN))[0]["metadata"]["resourceVersion"]
        await executor.execute(Plan([WriteLease(None, 3, 60, held)]), run)

    asyncio.run(scenario())
    assert attempt_path in api.objects
    assert f"{lease_collection}/{lease_name(RUN)}" in api.objects
    retries = {"reason": "retry", "failure_class": "rate_limited"}
    assert sample(registry, "agentrun_attempts_started_total", **retries) == 1
    assert sample(registry, "agentrun_attempts_ended_total", phase="Failed", failure_class="transient") == 1
    assert sample(registry, "agentrun_lease_takeovers_total", kind="handed_over") == 1
    assert sample(registry, "agentrun_lease_takeovers_total", kind="revoked") == 1


# --- logs -----------------------------------------------------------------------------------------------


def record(message: str, *args: object, **extra: Any) -> logging.LogRecord:
    made = logging.getLogger("agentrun.operator").makeRecord(
        "agentrun.operator", logging.WARNING, __file__, 1, message, args, None, extra=extra or None
    )
    return made


def test_json_lines_carry_time_level_logger_message_and_run_fields() -> None:
    line = logs.JsonFormatter().format(
        record("run %s: %s", "r", "lost", run="r", namespace="ns", attempt="r-a1")
    )
    entry = json.loads(line)
    assert "\n" not in line
    assert entry["level"] == "WARNING"
    assert entry["logger"] == "agentrun.operator"
    assert entry["message"] == "run r: lost"
    assert (entry["run"], entry["namespace"], entry["attempt"]) == ("r", "ns", "r-a1")
    assert entry["time"].endswith("Z")
    assert entry["time"][:2] == "20" and "T" in entry["time"]
    plain = json.loads(logs.JsonFormatter().format(record("no fields")))
    assert set(plain) == {"time", "level", "logger", "message"}


def test_json_lines_keep_exceptions_and_kopf_references() -> None:
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        failed = logging.getLogger("x").makeRecord(
            "x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info()
        )
    entry = json.loads(logs.JsonFormatter().format(failed))
    assert "ValueError: boom" in entry["exception"]
    ref = {"kind": "Run", "name": "r", "namespace": "ns", "uid": "u", "apiVersion": "agentrun.dev/v1alpha1"}
    entry = json.loads(logs.JsonFormatter().format(record("kopf says", k8s_ref=ref)))
    assert (entry["object"], entry["namespace"]) == ("Run/r", "ns")


def test_bound_fields_reach_records_made_in_that_context() -> None:
    context = logs.ContextFilter()
    with logs.bound(namespace="ns", run="r"):
        inside = record("inside")
        context.filter(inside)
        explicit = record("explicit", run="other")
        context.filter(explicit)
    outside = record("outside")
    context.filter(outside)
    assert (inside.run, inside.namespace) == ("r", "ns")  # type: ignore[attr-defined]
    assert explicit.run == "other"  # type: ignore[attr-defined]  # extra= wins
    assert not hasattr(outside, "run")


def test_text_stays_the_default_format_and_unknown_formats_are_refused() -> None:
    text = logs.handler("text")
    assert text.format(record("run %s", "r", run="r")).split(" ", 2)[2] == "WARNING agentrun.operator: run r"
    assert isinstance(logs.handler("json").formatter, logs.JsonFormatter)
    with pytest.raises(ValueError, match="unknown log format"):
        logs.handler("xml")


@pytest.mark.parametrize("mode", list(StateStoreMode), ids=[m.value for m in StateStoreMode])
def test_the_state_store_mode_is_one_series_at_1(
    registry: CollectorRegistry, m: OperatorMetrics, mode: StateStoreMode
) -> None:
    m.state_store(mode)

    assert {
        each.value.lower(): sample(registry, "agentrun_state_store_mode", mode=each.value.lower())
        for each in StateStoreMode
    } == {each.value.lower(): (1.0 if each == mode else 0.0) for each in StateStoreMode}
