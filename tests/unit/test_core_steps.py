"""core.steps (step backoff, journal keys and when they replay), core.traces (one trace per Run) and the
retention of Journal and Writes entries with their parent checkpoint."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.api import Attempt, Checkpoint, FailureClass, Run, Usage
from agentrun.core import failures, retention, steps, traces
from agentrun.core.plan import PatchRunStatus
from agentrun.core.runs import decide
from agentrun.core.steps import StepRetry
from unit.factories import (
    make_attempt,
    make_checkpoint,
    make_run,
    make_world,
    of_type,
    pending_request,
    run_status,
)

# ---- backoff ---------------------------------------------------------------------------------------------

POLICY = StepRetry(max_attempts=4, initial_seconds=1.0, max_seconds=3.0)

DELAYS: dict[str, tuple[StepRetry, int, float | None, float, float | None]] = {
    # (policy, failed calls so far, retry_after, jitter) -> wait
    "first-retry-no-jitter-is-half": (POLICY, 1, None, 0.0, 0.5),
    "first-retry-full-jitter": (POLICY, 1, None, 0.999999, 0.9999995),
    "doubles": (POLICY, 2, None, 1.0, 2.0),
    "capped-at-max": (POLICY, 3, None, 1.0, 3.0),
    "out-of-tries": (POLICY, 4, None, 0.5, None),
    "retry-after-wins-when-longer": (POLICY, 1, 10.0, 0.5, 10.0),
    "retry-after-shorter-than-backoff": (POLICY, 3, 0.1, 1.0, 3.0),
    "retry-after-cannot-add-a-try": (POLICY, 4, 1.0, 0.5, None),
    "single-try-policy": (steps.NO_RETRY, 1, None, 0.5, None),
}


@pytest.mark.parametrize(
    ("policy", "failed", "retry_after", "jitter", "wait"), DELAYS.values(), ids=DELAYS.keys()
)
def test_step_delay(
    policy: StepRetry, failed: int, retry_after: float | None, jitter: float, wait: float | None
) -> None:
    assert steps.step_delay(policy, failed, retry_after, jitter) == pytest.approx(wait)


@pytest.mark.parametrize(
    "bad", [{"max_attempts": 0}, {"initial_seconds": -1.0}, {"initial_seconds": 5.0, "max_seconds": 1.0}]
)
def test_invalid_step_retry_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="invalid"):
        StepRetry(**bad)


# ---- the journal -----------------------------------------------------------------------------------------

REPLAYS = {
    "initial": False,
    "retry:transient": True,
    "retry:infrastructure": True,
    "retry:lease_lost": True,
    "lease_expired": True,
    "manual_retry": True,
    "resume:run-r1": False,  # an answer: observe the world again
    "resume:pause-1": False,  # a pause, too
    "compensate": False,
}


@pytest.mark.parametrize(("reason", "replays"), REPLAYS.items(), ids=REPLAYS.keys())
def test_journal_replays_only_when_continuing_the_same_observations(reason: str, replays: bool) -> None:
    assert steps.journal_replays(reason) is replays


def test_journal_names_are_deterministic_and_distinct_per_key() -> None:
    keys = [
        ("ckpt-1", None, "plan", 0),
        ("ckpt-1", None, "plan", 1),
        ("ckpt-1", None, "draft", 0),
        ("ckpt-2", None, "plan", 0),
        (None, None, "plan", 0),
        ("ckpt-1", "run-r1", "plan", 0),  # after an answer: a key of its own
    ]
    names = [steps.journal_entry_name("run", *key) for key in keys]
    assert len(set(names)) == len(keys)
    assert names == [steps.journal_entry_name("run", *key) for key in keys]
    assert all(n.startswith("run-j") and len(n) == len("run-j") + 24 for n in names)


# ---- traces ----------------------------------------------------------------------------------------------

USER_PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACEPARENTS: dict[str, tuple[str | None, traces.SpanRef | None]] = {
    "valid": (USER_PARENT, traces.SpanRef("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")),
    "not-sampled": (
        USER_PARENT[:-2] + "00",
        traces.SpanRef("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", sampled=False),
    ),
    "upper-case-and-spaces": (
        f" {USER_PARENT.upper()} ",
        traces.SpanRef("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"),
    ),
    "absent": (None, None),
    "garbage": ("hello", None),
    "zero-trace-id": ("00-" + "0" * 32 + "-00f067aa0ba902b7-01", None),
    "zero-span-id": ("00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01", None),
    "version-ff": ("ff" + USER_PARENT[2:], None),
}


@pytest.mark.parametrize(("value", "parsed"), TRACEPARENTS.values(), ids=TRACEPARENTS.keys())
def test_parse_traceparent(value: str | None, parsed: traces.SpanRef | None) -> None:
    assert traces.parse_traceparent(value) == parsed


def test_a_run_without_annotation_gets_a_trace_derived_from_its_uid() -> None:
    trace = traces.run_trace("uid-1", None)
    again = traces.run_trace("uid-1", {"other": "x"})
    other = traces.run_trace("uid-2", None)
    assert trace == again and trace.parent is None
    assert trace.run.trace_id != other.run.trace_id
    assert len(trace.run.trace_id) == 32 and len(trace.run.span_id) == 16
    a1, a2 = trace.attempt("r-a1"), trace.attempt("r-a2")
    assert a1.trace_id == a2.trace_id == trace.run.trace_id
    assert len({a1.span_id, a2.span_id, trace.run.span_id}) == 3
    assert a1 == traces.run_trace("uid-1", None).attempt("r-a1")
    assert a1.traceparent() == f"00-{trace.run.trace_id}-{a1.span_id}-01"


def test_a_run_with_a_traceparent_joins_the_callers_trace() -> None:
    trace = traces.run_trace("uid-1", {traces.TRACEPARENT_ANNOTATION: USER_PARENT})
    assert trace.parent == traces.parse_traceparent(USER_PARENT)
    assert trace.run.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert trace.run.span_id != "00f067aa0ba902b7"
    assert trace.attempt("r-a1").trace_id == trace.run.trace_id


# ---- retention of journal and writes entries -------------------------------------------------------------


def entry(name: str, parent: str | None, kind: str = "Journal") -> Checkpoint:
    body = make_checkpoint(name, 0).model_dump(mode="json", by_alias=True, exclude_none=True)
    body["spec"] |= {"kind": kind, **({"parent": parent} if parent else {})}
    return Checkpoint.model_validate(body)


def chain(n: int) -> list[Checkpoint]:
    """c-1 .. c-n, each the parent of the next, as the SDK saves them."""
    out = []
    for i in range(1, n + 1):
        body = make_checkpoint(f"c-{i}", i).model_dump(mode="json", by_alias=True, exclude_none=True)
        if i > 1:
            body["spec"]["parent"] = f"c-{i - 1}"
        out.append(Checkpoint.model_validate(body))
    return out


def kept_run(
    retention_count: int, latest: str = "c-5", pending: str | None = None, phase: str = "Running"
) -> Run:
    status: dict[str, Any] = {"latestCheckpoint": latest}
    if pending:
        status["pendingRequest"] = {**pending_request(), "checkpointId": pending}
    return make_run(run_status(phase, current=2, **status), spec={"checkpointRetention": retention_count})


ENTRIES = [
    entry("j-start", None),
    entry("j-1", "c-1"),
    entry("j-3", "c-3"),
    entry("w-4", "c-4", kind="Writes"),
    entry("j-5", "c-5"),
    entry("j-orphan", "c-gone"),  # its parent was pruned before, never existed, or is still being stored
]
ENTRY_RETENTION: dict[str, tuple[Run, list[Checkpoint], list[Attempt], list[str]]] = {
    "entries-never-count-toward-retention": (kept_run(5), chain(5) + ENTRIES, [], []),
    "entries-go-with-their-parent": (
        kept_run(2),
        chain(5) + ENTRIES,
        [],
        ["j-start", "j-1", "j-3", "c-3", "c-2", "c-1"],
    ),
    "entries-of-an-absent-parent-stay-after-the-run-finished": (
        kept_run(2, phase="Succeeded"),
        chain(5) + ENTRIES,
        [],
        ["j-start", "j-1", "j-3", "c-3", "c-2", "c-1"],
    ),
    "entries-of-a-protected-checkpoint-stay": (
        kept_run(2, pending="c-3"),
        chain(5) + ENTRIES,
        [make_attempt(1, resume_from="c-1")],
        ["c-2"],
    ),
    "entries-before-any-checkpoint-stay": (kept_run(1), [entry("j-start", None)], [], []),
    "only-entries-stay": (kept_run(1, phase="Failed"), [entry("j-1", "c-1")], [], []),
}


@pytest.mark.parametrize(
    ("run", "checkpoints", "attempts", "pruned"), ENTRY_RETENTION.values(), ids=ENTRY_RETENTION.keys()
)
def test_journal_and_writes_entries_are_pruned_with_their_parent(
    run: Run, checkpoints: list[Checkpoint], attempts: list[Attempt], pruned: list[str]
) -> None:
    assert retention.prunable(run, checkpoints, attempts) == pruned


# ---- Run.status.usage: the sum of its Attempts' -----------------------------------------------------------


def with_usage(attempt: Attempt, **usage: int) -> Attempt:
    return attempt.model_copy(
        update={"status": attempt.status.model_copy(update={"usage": Usage.model_validate(usage)})}
    )


FAILED = make_attempt(1, phase="Failed", failure=failures.failure(FailureClass.TRANSIENT, "503"))
SUCCEEDED = make_attempt(2, phase="Succeeded")
SUMS: dict[str, tuple[list[Attempt], dict[str, int] | None, dict[str, int] | None]] = {
    # (attempts, Run.status.usage now) -> the usage the plan writes (None: no write)
    "failed-and-succeeded-attempts-summed": (
        [
            with_usage(FAILED, inputTokens=100, costMicroUSD=7, stepRetries=2),
            with_usage(SUCCEEDED, inputTokens=50, outputTokens=5, modelCalls=1),
        ],
        None,
        {"inputTokens": 150, "outputTokens": 5, "costMicroUSD": 7, "modelCalls": 1, "stepRetries": 2},
    ),
    "already-summed": (
        [with_usage(FAILED, inputTokens=100)],
        {"inputTokens": 100},
        None,
    ),
    "no-usage-reported": ([FAILED, SUCCEEDED], None, None),
    "a-later-flush-grows-it": (
        [with_usage(FAILED, modelCalls=3)],
        {"modelCalls": 2},
        {"inputTokens": 0, "outputTokens": 0, "costMicroUSD": 0, "modelCalls": 3, "stepRetries": 0},
    ),
}


@pytest.mark.parametrize(("attempts", "current", "written"), SUMS.values(), ids=SUMS.keys())
def test_run_usage_sums_every_attempt(
    attempts: list[Attempt], current: dict[str, int] | None, written: dict[str, int] | None
) -> None:
    usage_field: dict[str, Any] = {"usage": current} if current else {}
    status = run_status("Succeeded", current=2, lease_epoch=2, **usage_field)
    plan = decide(make_world(make_run(status), attempts=attempts))
    usage = [a.patch["usage"] for a in of_type(plan, PatchRunStatus) if "usage" in a.patch]
    assert usage == ([written] if written else [])
