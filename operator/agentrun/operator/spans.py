"""The operator's spans: the Run's and each Attempt's (ids derived from the Run, agentrun.core.traces),
recorded when the operator writes their end, and one span per reconcile that decided to write.

Recording them from the operator, not from the attempt Pod, keeps the tree whole whatever happened to
the Pod (an OOM kill, a lost node): the Pod's own spans hang from its Attempt's span by its id.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from agentrun.api import RunPhase
from agentrun.api.common import KubernetesObject
from agentrun.clock import Clock
from agentrun.core.plan import PatchAttemptStatus, PatchRunStatus, Plan
from agentrun.core.traces import RunTrace, run_trace
from agentrun.operator.metrics import finished_attempt_labels
from agentrun.tracing import Tracing

if TYPE_CHECKING:  # the executor reports to these observers: its type only, no cycle
    from agentrun.api import Run
    from agentrun.operator.executor import Written

JsonDict = dict[str, Any]
TRACED_END_PHASES: Final = frozenset(
    {RunPhase.SUCCEEDED.value, RunPhase.FAILED.value, RunPhase.CANCELLED.value}
)


def _seconds(value: Any) -> float | None:
    if isinstance(value, datetime.datetime):
        return value.timestamp()
    if isinstance(value, str) and value:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return None


def trace_of(run: KubernetesObject) -> RunTrace:
    meta = run.metadata
    return run_trace(str(meta.uid or meta.name), meta.annotations)


class RunSpans:
    def __init__(self, tracing: Tracing, clock: Clock) -> None:
        self.tracing, self.clock = tracing, clock

    def now(self) -> float:
        """The clock's wall time in seconds (a span's start and end)."""
        return self.clock.now().timestamp()

    def run_ended(self, run: KubernetesObject, phase: str) -> None:
        if not self.tracing.enabled:
            return
        trace = trace_of(run)
        start = _seconds(run.metadata.creation_timestamp) or self.now()
        self.tracing.record(
            f"run {run.metadata.name}",
            span=trace.run,
            parent=trace.parent,
            start=start,
            end=self.now(),
            attributes={
                "agentrun.run": str(run.metadata.name),
                "agentrun.namespace": str(run.metadata.namespace),
                "agentrun.phase": phase,
            },
            error=None if phase == RunPhase.SUCCEEDED.value else phase,
        )

    def attempt_written(
        self, run: KubernetesObject, attempt: JsonDict | None, patch: Mapping[str, Any]
    ) -> None:
        """An Attempt status patch that ends the Attempt: its span, from its start to now."""
        if not self.tracing.enabled or attempt is None or (labels := finished_attempt_labels(patch)) is None:
            return
        phase, failure_class = labels
        name = attempt["metadata"]["name"]
        status, spec = attempt.get("status") or {}, attempt.get("spec") or {}
        start = _seconds(status.get("startTime")) or _seconds(attempt["metadata"].get("creationTimestamp"))
        failure = patch.get("failure") or {}
        trace = trace_of(run)
        self.tracing.record(
            f"attempt {name}",
            span=trace.attempt(name),
            parent=trace.run,
            start=start or self.now(),
            end=self.now(),
            attributes={
                "agentrun.attempt": name,
                "agentrun.attempt_number": int(spec.get("number", 0)),
                "agentrun.reason": str(spec.get("reason", "")),
                "agentrun.phase": phase,
                "agentrun.failure_class": failure_class,
            },
            error=(failure.get("message") or phase)
            if phase != "Succeeded" and failure_class != "none"
            else None,
        )

    def written(self, run: Run, written: Written) -> None:
        """An observer of the executor: a Run that ended, an Attempt that ended, as spans."""
        match written.action:
            case PatchRunStatus(patch=patch) if patch.get("phase") in TRACED_END_PHASES:
                self.run_ended(run, str(patch["phase"]))
            case PatchAttemptStatus(patch=patch) if written.after is not None:
                self.attempt_written(run, written.after, patch)

    def decided(self, run: KubernetesObject, plan: Plan, start: float, error: str | None) -> None:
        """A reconcile that wrote something: what it decided, as a child of the Run's span."""
        if not self.tracing.enabled or not plan.actions:
            return
        trace = trace_of(run)
        phases = [
            a.patch["phase"] for a in plan.actions if isinstance(a, PatchRunStatus) and "phase" in a.patch
        ]
        status = getattr(run, "status", None)
        self.tracing.record(
            "reconcile",
            span=self.tracing.random_child(trace.run),
            parent=trace.run,
            start=start,
            end=self.now(),
            attributes={
                "agentrun.run": str(run.metadata.name),
                "agentrun.phase": str(getattr(status, "phase", None) or ""),
                "agentrun.next_phase": str(phases[-1]) if phases else "",
                "agentrun.actions": ",".join(type(a).__name__ for a in plan.actions),
            },
            error=error,
        )
