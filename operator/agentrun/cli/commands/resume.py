"""`resume RUN`: answer the pending request, checked locally against its schema before sending."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrun.api import STOPPED_PHASES, ControlRecord, Run
from agentrun.cli import formats
from agentrun.cli.commands.common import await_outcome, read_run, show_outcome, shown_outcome
from agentrun.cli.commands.watch import follow
from agentrun.cli.context import Context
from agentrun.cli.controls import recorded, resume_key, resume_operations, schema_problem
from agentrun.cli.errors import EXIT_FAILED, EXIT_USAGE, CliError, describe_api_error
from agentrun.cli.hints import Target
from agentrun.kubeapi import ApiError

WRITES = 3  # tries of the resourceVersion-guarded write


@dataclass(frozen=True)
class Answer:
    request_id: str
    checkpoint_id: str
    value: Any
    key: str
    by: str | None = None  # the sender's user name (spec.resume.answeredBy)


class AnswerInFlight(CliError):
    """Another answer waits for the operator's verdict: the Run has one spec.resume, and the API server
    refuses to replace an answer before it is processed."""

    def __init__(self, run: str, key: str, by: str | None, where: Target) -> None:
        sender = f", by {by}" if by else ""
        super().__init__(
            f"another answer (key {key}{sender}) awaits the operator's verdict; nothing sent. "
            f"See: {where.command('describe', run)}"
        )
        self.key, self.by = key, by


@dataclass(frozen=True)
class Control:
    """An outcome recorded before: the same answer was sent and judged already."""

    record: ControlRecord
    body: dict[str, Any]


def read_value(args: argparse.Namespace) -> Any:
    """The answer from --value or --value-file (- for stdin); {} when neither is given."""
    if args.value is not None and args.value_file is not None:
        raise CliError("give --value or --value-file, not both", EXIT_USAGE)
    if args.value_file is not None:
        try:
            text = sys.stdin.read() if args.value_file == "-" else Path(args.value_file).read_text()
        except OSError as exc:
            raise CliError(f"cannot read --value-file: {exc}", EXIT_USAGE) from None
        source = args.value_file
    elif args.value is not None:
        text, source = args.value, "--value"
    else:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise CliError(f"{source} is not valid JSON: {exc}", EXIT_USAGE) from None
    if value is None:
        raise CliError(
            "a resume value cannot be null (a merge patch deletes null fields): use {} instead", EXIT_USAGE
        )
    return value


def plan_answer(run: Run, args: argparse.Namespace, value: Any, by: str | None = None) -> Answer:
    """Fills in what the user left out from the pending request (or, once answered, from spec.resume,
    so that repeating a command finds the key it used before); `by` is who answers."""
    pending, sent = run.status.pending_request, run.spec.resume
    request_id = (
        args.request_id or (pending.request_id if pending else None) or (sent.request_id if sent else None)
    )
    if request_id is None:
        phase = run.status.phase.value if run.status.phase else "Pending"
        raise CliError(f"run {run.metadata.name} is {phase}, not waiting for input: nothing to resume")
    checkpoint = args.checkpoint
    if checkpoint is None and pending is not None and pending.request_id == request_id:
        checkpoint = pending.checkpoint_id
    if checkpoint is None and sent is not None and sent.request_id == request_id:
        checkpoint = sent.checkpoint_id
    checkpoint = checkpoint or run.status.latest_checkpoint
    if checkpoint is None:
        raise CliError(f"run {run.metadata.name} has no checkpoint to continue from: pass --checkpoint")
    key = args.key or resume_key(str(run.metadata.uid), request_id, checkpoint, value, by)
    return Answer(request_id, checkpoint, value, key, by)


def local_refusal(run: Run, answer: Answer, explicit_request: bool) -> str | None:
    """Why sending this answer is pointless (the operator would never take it), or None."""
    pending, phase = run.status.pending_request, run.status.phase
    if phase in STOPPED_PHASES or (pending is None and not explicit_request):
        return f"run {run.metadata.name} is {phase or 'Pending'}, not waiting for input"
    if (
        pending is not None
        and pending.request_id == answer.request_id
        and (problem := schema_problem(answer.value, pending.accepted_schema))
    ):
        return f"the value does not match the schema of request {pending.request_id}: {problem}"
    return None


def check_sendable(run: Run, answer: Answer, args: argparse.Namespace, where: Target) -> None:
    """Raises when the answer should not be sent: a value is missing or wrong, the Run waits for nothing,
    or another answer is already on its way (the Run has one spec.resume: it would be replaced)."""
    pending = run.status.pending_request
    given = args.value is not None or args.value_file is not None
    if not given and pending is not None and pending.accepted_schema:
        raise CliError(
            f"--value JSON (or --value-file F) is required: request {pending.request_id} expects "
            f"{formats.compact_json(pending.accepted_schema)}",
            EXIT_USAGE,
        )
    if refusal := local_refusal(run, answer, bool(args.request_id)):
        raise CliError(f"{refusal}; nothing sent")
    sent = run.spec.resume
    if (
        sent is not None
        and sent.idempotency_key != answer.key
        and recorded(run, sent.idempotency_key) is None
    ):
        raise AnswerInFlight(str(run.metadata.name), sent.idempotency_key, sent.answered_by, where)


async def send(ctx: Context, args: argparse.Namespace, value: Any) -> Answer | Control:
    """Writes spec.resume, guarded by the resourceVersion it was judged on: if the Run changed in the
    meantime (someone else answered?), it is read and judged again. Returns the recorded outcome
    instead when this very answer was processed before."""
    by = await ctx.cluster.whoami()
    for _ in range(WRITES):
        body, run = await read_run(ctx, args.run)
        answer = plan_answer(run, args, value, by)
        if (earlier := recorded(run, answer.key)) is not None:
            return Control(earlier, body)
        check_sendable(run, answer, args, ctx.where)
        version = str(body["metadata"]["resourceVersion"])
        operations = resume_operations(
            version, answer.request_id, answer.checkpoint_id, value, answer.key, answer.by
        )
        try:
            await ctx.cluster.json_patch_run(args.run, operations)
            return answer
        except ApiError as exc:
            moved = (
                exc.status in (409, 422)
                and (await ctx.cluster.run(args.run))["metadata"].get("resourceVersion") != version
            )
            if not moved:  # refused for what it says (e.g. a key reused with another answer)
                raise CliError(describe_api_error(exc, f"cannot resume run {args.run}")) from None
    raise CliError(f"run {args.run} keeps changing while we answer it: try again")


async def resume(ctx: Context, args: argparse.Namespace) -> int:
    try:
        sent = await send(ctx, args, read_value(args))
    except AnswerInFlight as first:
        # Someone answered first: wait for the operator's verdict on their answer and show it.
        _, record = await await_outcome(ctx, args.run, first.key, args.timeout)
        if record is None:
            raise
        who = first.by or "someone else"
        ctx.out.text(
            f"run {args.run}: {who} answered first: {formats.control_line(record)}; yours was not sent"
        )
        return EXIT_FAILED
    if isinstance(sent, Control):
        return show_outcome(ctx, args.run, sent.record, sent.body, again=True)  # the same answer: a no-op
    code = await shown_outcome(ctx, args.run, sent.key, args.timeout)
    if code == EXIT_FAILED or not args.wait:
        return code
    return await follow(ctx, args.run, None)
