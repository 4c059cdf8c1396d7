"""The operator's Prometheus metrics: what it decided and did, each with a small, bounded label set.

Thin hooks feed them, never steering anything: the reconciler (latency, outcomes, the phase of each Run it
read and wrote), the executor (Attempts started and ended, lease takeovers), the cache (rejected commits,
and the side effects it holds, counted at scrape time) and the work queue (its depth, read at scrape time).
Label values outside the known sets become "other", so no label can grow with the number of Runs.

Served by `serve(port)` (prometheus_client's HTTP server, on its own thread): the collectors that read the
operator's in-memory state take snapshots (list() of a dict is atomic under the GIL), never iterate live.
"""

from __future__ import annotations

import logging
import os
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from agentrun.api import (
    FINISHED_ATTEMPT_PHASES,
    FailureClass,
    RejectedCommitReason,
    RunPhase,
    SideEffectState,
    StateStoreMode,
    Usage,
)
from agentrun.api.usage import MICRO
from agentrun.core.plan import (
    CreateAttempt,
    DeletePod,
    PatchAttemptStatus,
    PatchRunStatus,
    Plan,
    RefuseMove,
    WriteLease,
)

if TYPE_CHECKING:  # the executor reports to these observers: its type only, no cycle
    from agentrun.api import Run
    from agentrun.operator.executor import Written

log = logging.getLogger("agentrun.operator")
JsonDict = dict[str, Any]
Key = tuple[str, str]  # (namespace, run name)

OTHER: Final = "other"
NONE: Final = "none"  # the failure_class of an Attempt that did not follow (or end in) a failure
ATTEMPT_REASONS: Final = ("initial", "retry", "lease_expired", "resume", "manual_retry")
FAILURE_CLASSES: Final = tuple(c.value for c in FailureClass)
TAKEOVER_KINDS: Final = ("revoked", "handed_over")
OUTCOMES: Final = ("ok", "superseded", "error")
# Usage counters: (Usage field, metric name without _total, what it counts). Cost is exported in USD.
USAGE_COUNTERS: Final = (
    ("input_tokens", "input_tokens", "Model input tokens"),
    ("output_tokens", "output_tokens", "Model output tokens"),
    ("cost_micro_usd", "cost_usd", "Cost in US dollars"),
    ("model_calls", "model_calls", "Model requests"),
    ("step_retries", "step_retries", "Step calls retried inside an Attempt"),
)
MAX_USAGE_NAMESPACES: Final = 200  # a label per namespace, bounded
# Reconciles are a GET plus a few writes: milliseconds to seconds.
LATENCY_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


# --- label mapping (pure) -----------------------------------------------------------------------------


def _known(value: object, known: Iterable[str]) -> str:
    return str(value) if str(value) in set(known) else OTHER


def failure_class_label(value: object) -> str:
    """A failure class as a label value: none when absent, other when unknown."""
    return NONE if value in (None, "") else _known(value, FAILURE_CLASSES)


def attempt_reason_labels(reason: str) -> tuple[str, str]:
    """(reason, failure_class) of an Attempt's spec.reason: `retry:<class>` becomes (retry, <class>),
    `resume:<requestId>` becomes (resume, none): request ids would make the label unbounded."""
    kind, _, detail = reason.partition(":")
    if kind == "retry" and detail:
        return "retry", failure_class_label(detail)
    if kind == "resume" and detail:
        return "resume", NONE
    if not detail and kind in ("initial", "lease_expired", "manual_retry"):
        return kind, NONE
    return OTHER, NONE


def run_phase_label(phase: object) -> str | None:
    """A Run phase as a label value; None for a Run without one yet (it is not counted)."""
    if phase in (None, ""):
        return None
    return _known(phase, (phase.value for phase in RunPhase))


def planned_run_phase(plan: Plan) -> str | None:
    """The phase the plan writes to the Run (its last PatchRunStatus that sets one), if any."""
    phase = None
    for action in plan.actions:
        if isinstance(action, PatchRunStatus) and action.patch.get("phase"):
            phase = str(action.patch["phase"])
    return phase


def finished_attempt_labels(patch: Mapping[str, Any]) -> tuple[str, str] | None:
    """(phase, failure_class) of an Attempt status patch that finishes the Attempt; None otherwise."""
    phase = patch.get("phase")
    if phase not in {str(phase) for phase in FINISHED_ATTEMPT_PHASES}:
        return None
    failure = patch.get("failure") or {}
    return str(phase), failure_class_label(failure.get("class"))


def lease_takeover_kind(previous: JsonDict | None, action: WriteLease) -> str | None:
    """Whether a WriteLease takes the lease from someone: a revocation (no new holder) or a handover to
    a new holder, both with a new epoch. Creating the Lease (the first grant) and granting a revoked
    Lease (its epoch was taken at the revocation, which was counted) are no takeovers."""
    if previous is None:
        return None
    spec = previous.get("spec") or {}
    if not spec.get("holderIdentity") or action.epoch <= int(spec.get("leaseTransitions") or 0):
        return None
    return "revoked" if action.holder is None else "handed_over"


def rejected_commit_reason(attempt: JsonDict | None) -> str | None:
    """status.rejectedCommit.reason of an Attempt as a label value, None when it has none."""
    rejected = ((attempt or {}).get("status") or {}).get("rejectedCommit")
    if not rejected:
        return None
    return _known(rejected.get("reason"), (r.value for r in RejectedCommitReason))


def side_effect_state_label(effect: JsonDict) -> str:
    """A SideEffect without status counts as Pending (as in the ledger rules)."""
    state = (effect.get("status") or {}).get("state") or SideEffectState.PENDING.value
    return _known(state, (s.value for s in SideEffectState))


# The kinds the operator's own watches deliver (operator.informers), each a series from the start.
WATCHED_KINDS: Final = ("attempts", "checkpoints", "sideeffects", "pods", "leases", "serviceaccounts")


# --- the metrics ----------------------------------------------------------------------------------------


class _StateCollector(Collector):
    """Gauges computed at scrape time from the operator's in-memory state."""

    def __init__(self, metrics: OperatorMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily]:
        runs = GaugeMetricFamily(
            "agentrun_runs",
            "Runs by phase, as this operator last read or wrote them (Runs it has not reconciled yet, "
            "e.g. on a standby replica, are not counted).",
            labels=["phase"],
        )
        phases = Tally(list(self.metrics.run_phases.values()))
        for phase in [*(phase.value for phase in RunPhase), OTHER]:
            runs.add_metric([phase], phases.get(phase, 0))
        yield runs
        effects = GaugeMetricFamily(
            "agentrun_side_effects",
            "SideEffects (ledger entries) of the Runs this operator watches, by state.",
            labels=["state"],
        )
        states = Tally(side_effect_state_label(e) for e in self.metrics.side_effects())
        for state in [*(s.value for s in SideEffectState), OTHER]:
            effects.add_metric([state], states.get(state, 0))
        yield effects


class OperatorMetrics:
    """The operator's metrics, registered in `registry` (None: not registered, e.g. in tests)."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.registry = registry
        self.run_phases: dict[Key, str] = {}
        self.side_effects: Callable[[], list[JsonDict]] = list
        self.attempts_started = Counter(
            "agentrun_attempts_started",
            "Attempts the operator created, by reason (initial, retry, lease_expired, resume, "
            "manual_retry) and, for retries, the failure class retried.",
            ["reason", "failure_class"],
            registry=registry,
        )
        self.attempts_ended = Counter(
            "agentrun_attempts_ended",
            "Attempts the operator recorded as finished, by final phase and failure class.",
            ["phase", "failure_class"],
            registry=registry,
        )
        self.reconcile_duration = Histogram(
            "agentrun_reconcile_duration_seconds",
            "Time to reconcile one Run: read it, decide, carry out the plan.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.reconciles = Counter(
            "agentrun_reconciles",
            "Reconciles by outcome: ok, superseded (a preconditioned write lost a race: decided again) "
            "or error (retried after a backoff).",
            ["outcome"],
            registry=registry,
        )
        self.watch_events = Counter(
            "agentrun_watch_events",
            "Watch events the operator's own watches delivered (the objects Runs own, and the opted-in "
            "ServiceAccounts; kopf's Run watch aside), by kind and whether the event queued its Run for a "
            "reconcile (woke: true) or only kept the cache current (a Checkpoint, a Lease renewal, an echo "
            "of the operator's own write: false).",
            ["kind", "woke"],
            registry=registry,
        )
        self.lease_takeovers = Counter(
            "agentrun_lease_takeovers",
            "Leases taken from their holder with a new epoch: revoked (expired lease, deadline) or "
            "handed_over (granted to the next Attempt while the previous one held it).",
            ["kind"],
            registry=registry,
        )
        self.pods_collected = Counter(
            "agentrun_attempt_pods_collected",
            "Pods of ended Attempts deleted by the Run's spec.podGC, after their log tail was kept.",
            registry=registry,
        )
        self.undeclared_moves = Counter(
            "agentrun_undeclared_moves",
            "Moves of a Run's phase that the rule making them does not declare in the Run's table: refused, "
            "not written (the Run keeps its phase), by rule. Anything but 0 is a bug of the operator.",
            ["rule"],
            registry=registry,
        )
        self.rejected_commits = Counter(
            "agentrun_rejected_commits",
            "Attempts seen with a commit refused by a fence, by reason (stale_after_cancel, "
            "stale_worker); each Attempt counts once per operator process.",
            ["reason"],
            registry=registry,
        )
        self.active = Gauge(
            "agentrun_operator_active",
            "1 while this replica acts, 0 while it stands by (peering: a live peer of higher priority acts).",
            registry=registry,
        )
        self.store_mode = Gauge(
            "agentrun_state_store_mode",
            "1 for where this operator keeps agent state, 0 for the others: bundled (the bundled object "
            "store), external (the store its URL names) or inline (no store).",
            ["mode"],
            registry=registry,
        )
        self.work_queue_depth = Gauge(
            "agentrun_work_queue_depth",
            "Runs waiting in the work queue for a reconcile worker.",
            registry=registry,
        )
        # What the agents reported (Attempt status.usage), counted when the operator adds it to a Run's
        # status.usage: by namespace, at most MAX_USAGE_NAMESPACES of them (then "other").
        self.usage = {
            field: Counter(
                f"agentrun_usage_{metric}",
                f"{help_text} reported by the Attempts of the Runs in the namespace (failed ones included).",
                ["namespace"],
                registry=registry,
            )
            for field, metric, help_text in USAGE_COUNTERS
        }
        self._usage_namespaces: set[str] = set()
        # Series known up front exist from the start (at zero), so rate() and alerts see them.
        for reason in ("initial", "lease_expired", "resume", "manual_retry"):
            self.attempts_started.labels(reason, NONE)
        for failure_class in FAILURE_CLASSES:
            self.attempts_started.labels("retry", failure_class)
        for outcome in OUTCOMES:
            self.reconciles.labels(outcome)
        for kind in TAKEOVER_KINDS:
            self.lease_takeovers.labels(kind)
        for kind in WATCHED_KINDS:
            for woke in ("true", "false"):
                self.watch_events.labels(kind, woke)
        for rejected in RejectedCommitReason:
            self.rejected_commits.labels(rejected.value)
        if registry is not None:
            registry.register(_StateCollector(self))

    def state_store(self, mode: StateStoreMode) -> None:
        """Where this operator keeps agent state: its series 1, the other modes' 0."""
        for each in StateStoreMode:
            self.store_mode.labels(each.value.lower()).set(1.0 if each == mode else 0.0)

    # --- sources read at scrape time

    def track(self, side_effects: Callable[[], list[JsonDict]], queue_depth: Callable[[], int]) -> None:
        self.side_effects = side_effects
        self.work_queue_depth.set_function(lambda: float(queue_depth()))

    # --- hooks

    def run_seen(self, key: Key, phase: object) -> None:
        label = run_phase_label(phase)
        if label is not None:
            self.run_phases[key] = label

    def forget_run(self, key: Key) -> None:
        self.run_phases.pop(key, None)

    def forget_runs(self) -> None:
        self.run_phases.clear()

    def reconciled(self, outcome: str, seconds: float) -> None:
        self.reconciles.labels(_known(outcome, OUTCOMES)).inc()
        self.reconcile_duration.observe(seconds)

    def watch_event(self, kind: str, woke: bool) -> None:
        self.watch_events.labels(kind, "true" if woke else "false").inc()

    def attempt_started(self, reason: str) -> None:
        self.attempts_started.labels(*attempt_reason_labels(reason)).inc()

    def attempt_status_written(self, patch: Mapping[str, Any]) -> None:
        if labels := finished_attempt_labels(patch):
            self.attempts_ended.labels(*labels).inc()

    def usage_added(self, namespace: str, before: Usage | None, after: Usage) -> None:
        """A Run's status.usage was written from `before` (as stored, the write was preconditioned on
        it) to `after`: counts the growth once, whatever the operator restarts."""
        grown = after.minus(before or Usage())
        label = self._usage_namespace(namespace)
        for field, counter in self.usage.items():
            if amount := getattr(grown, field):
                counter.labels(label).inc(amount / MICRO if field == "cost_micro_usd" else amount)

    def _usage_namespace(self, namespace: str) -> str:
        if namespace in self._usage_namespaces or len(self._usage_namespaces) < MAX_USAGE_NAMESPACES:
            self._usage_namespaces.add(namespace)
            return namespace
        return OTHER

    def lease_written(self, previous: JsonDict | None, action: WriteLease) -> None:
        if kind := lease_takeover_kind(previous, action):
            self.lease_takeovers.labels(kind).inc()

    def written(self, run: Run, written: Written) -> None:
        """An observer of the executor: what a write means for the counters."""
        match written.action:
            case PatchRunStatus(patch=patch) if "usage" in patch:
                before = run.status.usage
                self.usage_added(str(run.metadata.namespace), before, Usage.model_validate(patch["usage"]))
            case WriteLease():
                self.lease_written(written.before, written.action)
            case CreateAttempt(body=body) if written.created:
                self.attempt_started(str(body["spec"]["reason"]))
            case PatchAttemptStatus(patch=patch) if written.after is not None:
                self.attempt_status_written(patch)
            case DeletePod(collected=True):
                self.pods_collected.inc()
            case RefuseMove(rule=rule):
                self.undeclared_moves.labels(rule).inc()

    def cached(self, kind: str, previous: JsonDict | None, obj: JsonDict) -> None:
        """The cache took in obj (replacing previous): an Attempt first seen with a rejected commit."""
        if kind != "attempts" or rejected_commit_reason(previous) is not None:
            return
        if reason := rejected_commit_reason(obj):
            self.rejected_commits.labels(reason).inc()


def new_registry() -> CollectorRegistry:
    """A registry for one operator runtime, with what prometheus_client's default one holds (the
    process, the platform, the garbage collector)."""
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def serve(port: int, registry: CollectorRegistry | None, address: str | None = None) -> WSGIServer | None:
    """Serves `registry` on address:port (0, or no registry: not at all; address:
    $AGENTRUN_METRICS_ADDRESS, else 0.0.0.0; the chart sets the Pod's IP on a local cluster whose Pods
    share the host's network). A port already taken is logged, not fatal: the operator's work matters
    more than its metrics. Returns the server (to shut it down)."""
    if port == 0 or registry is None:
        log.info("metrics are off (AGENTRUN_METRICS_PORT=0)")
        return None
    address = address or os.environ.get("AGENTRUN_METRICS_ADDRESS") or "0.0.0.0"
    try:
        server, _ = start_http_server(port, addr=address, registry=registry)
    except OSError as exc:
        log.error("metrics not served: cannot listen on %s:%d: %s", address, port, exc)
        return None
    log.info("metrics served on %s:%d/metrics", address, port)
    return server


# The *_created series (one per labelled counter) would double the output for little use.
disable_created_metrics()  # type: ignore[no-untyped-call]
