"""A finished Run's archive (docs/state-store.md, "Archives of finished Runs"): what it holds, built from the
objects as observed, and when archives are past retention. The operator writes and deletes them
(statestore.archives); people read them (`kubectl agentrun history`, `describe --archived`).

The archive holds the Run, its Attempts (with their log tails, where recorded), its Checkpoints (their
state references; the Run's status names its checkpoint index once compacted), its SideEffects and
report, and a summary of its story (the facts the operator's Events told, from the objects that record
them: the operator posts Events but does not read them back). Every blob reference in it is listed in
the document's `refs`, so the collector keeps the Run's state while the archive lives.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import date, datetime, timedelta
from typing import Any, Final

from agentrun.api import Attempt, ConditionStatus, Run, RunConditionType
from agentrun.core import report
from agentrun.core.runs.world import World, rfc3339

JsonDict = dict[str, Any]
# The story's entries kept in an archive, the latest ones (a Run's controls and inputs are bounded too).
MAX_STORY: Final = 200


def archive_document(world: World) -> JsonDict:
    """The body of the Run's archive, from the World as observed: every object the Run owns, whole."""
    run = world.run
    effects = sorted(world.side_effects, key=lambda e: str(e.metadata.name))
    stored_report = run.status.report
    return {
        "object": run.to_api(),
        "attempts": [a.to_api() for a in sorted(world.attempts.values(), key=lambda a: a.spec.number)],
        "checkpoints": [c.to_api() for c in sorted(world.checkpoints, key=lambda c: c.spec.sequence)],
        "sideEffects": [e.to_api() for e in effects],
        "report": stored_report.to_api() if stored_report is not None else report.run_report(effects),
        "story": story(run, world.attempts.values()),
    }


def run_summary(world: World, finished: datetime | None) -> JsonDict:
    """What the archive index lists about the Run (`kubectl agentrun history`)."""
    run = world.run
    created = run.metadata.creation_timestamp
    usage = run.status.usage
    return {
        "phase": run.status.phase.value if run.status.phase else "",
        "createdTime": rfc3339(created) if created else None,
        "finishedTime": rfc3339(finished) if finished else None,
        "attempts": run.status.attempts or 0,
        "usage": usage.to_status() if usage is not None else None,
    }


def story(run: Run, attempts: Iterable[Attempt]) -> list[JsonDict]:
    """What happened to the Run, oldest first, as the Events told it: its conditions' last transitions,
    its control requests and answers, each Attempt's start and end."""
    told: list[tuple[datetime, str, str]] = []
    for condition in run.status.conditions or []:
        if condition.type == RunConditionType.SUCCEEDED and condition.status != ConditionStatus.UNKNOWN:
            told.append((condition.last_transition_time, condition.reason or "", condition.message or ""))
    for control in run.status.controls or []:
        who = f" by {control.requested_by}" if control.requested_by else ""
        message = f"{control.op.value} {control.outcome.value}{who}: {control.message or ''}".rstrip(": ")
        told.append((control.time, f"{control.op.value}{control.outcome.value}", message))
    for answer in run.status.inputs or []:
        by = f" by {answer.answered_by}" if answer.answered_by else ""
        told.append((answer.time, "InputAccepted", f"answer to {answer.request_id}{by}"))
    for attempt in attempts:
        status, name = attempt.status, str(attempt.metadata.name)
        if status.start_time:
            told.append((status.start_time, "AttemptStarted", f"{name}: {attempt.spec.reason}"))
        if status.completion_time and status.phase:
            why = f": {status.failure.reason}" if status.failure and status.failure.reason else ""
            told.append((status.completion_time, f"Attempt{status.phase.value}", f"{name}{why}"))
    told.sort(key=lambda entry: entry[0])
    return [{"time": rfc3339(t), "reason": r, "message": m[:1024]} for t, r, m in told[-MAX_STORY:]]


def expired_days(days: Sequence[str], now: datetime, retention_seconds: int) -> list[str]:
    """The index days (YYYY-MM-DD, the UTC day Runs were archived) whose every archive is older than
    the retention: a day goes once its end is `retention_seconds` past. Malformed names are left."""
    expired = []
    for day in days:
        try:
            start = date.fromisoformat(day)
        except ValueError:
            continue
        end = datetime(start.year, start.month, start.day, tzinfo=now.tzinfo) + timedelta(days=1)
        if end + timedelta(seconds=retention_seconds) <= now:
            expired.append(day)
    return expired
