"""What a person does in the console is a `kubectl agentrun` command, run in-process.

No second write path: each action builds the command line the person would type, parses it with the
CLI's own parser and runs the CLI's own command with the user's API client, so the same checks (the
request's schema, by the code the operator uses), keys, guarded writes and waiting for the operator's
verdict apply. What the command would print becomes the answer's message.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentrun.cli.cluster import Cluster
from agentrun.cli.context import Context
from agentrun.cli.errors import EXIT_OK, CliError, api_error_from, describe_api_error
from agentrun.cli.output import Output
from agentrun.clock import Clock
from agentrun.kubeapi import KubeApi

VERDICT_SECONDS = 20  # how long an action waits for the operator's verdict before it answers
Parse = Callable[[list[str]], Any]  # agentrun.cli.app.parse


class BadAction(ValueError):
    """The page sent something no command can be made of (a bug or a forged request)."""


@dataclass(frozen=True)
class Outcome:
    ok: bool
    message: str


def _text(body: dict[str, Any], field: str, *, required: bool = True) -> str | None:
    value = body.get(field)
    if value is None or value == "":
        if required:
            raise BadAction(f"{field} is required")
        return None
    if not isinstance(value, str) or len(value) > 4096 or ("\n" in value and field != "reason"):
        raise BadAction(f"{field} must be a short string")
    return value


def _opt(flag: str, value: str | None) -> list[str]:
    return [f"--{flag}={value}"] if value is not None else []


def _resume(body: dict[str, Any], value: Any) -> list[str]:
    return [
        "resume",
        str(_text(body, "run")),
        f"--value={json.dumps(value)}",
        f"--request-id={_text(body, 'requestId')}",
        f"--checkpoint={_text(body, 'checkpointId')}",
        f"--timeout={VERDICT_SECONDS}",
    ]


def command_line(action: str, body: dict[str, Any]) -> list[str]:
    """The `kubectl agentrun` arguments (without flags of the namespace) for an action of the page."""
    reason = _text(body, "reason", required=False)
    if action == "answer":
        if "value" not in body or body["value"] is None:
            raise BadAction("value is required (use {} for an empty answer)")
        return _resume(body, body["value"])
    if action == "approve":
        if not isinstance(body.get("approved"), bool):
            raise BadAction("approved must be true or false")
        return _resume(body, {"approved": body["approved"]})
    if action == "release":
        return _resume(body, {})
    if action == "resolve":
        verdict = body.get("verdict")
        if verdict not in ("confirmed", "failed", "absent"):
            raise BadAction("verdict must be confirmed, failed or absent")
        argv = ["resolve-effect", str(_text(body, "effect")), f"--{verdict}"]
        argv += _opt("reference", _text(body, "reference", required=verdict == "confirmed"))
        argv += _opt("reason", reason)
        return [*argv, *(["--retry"] if body.get("retry") is True else []), f"--timeout={VERDICT_SECONDS}"]
    if action == "cancel":
        return ["cancel", str(_text(body, "run")), *_opt("reason", reason)]
    if action == "retry":
        run = str(_text(body, "run"))
        checkpoint = _text(body, "fromCheckpoint", required=False)
        options = [*_opt("from-checkpoint", checkpoint), *_opt("reason", reason)]
        return ["retry", run, *options, f"--timeout={VERDICT_SECONDS}"]
    if action == "compensate":
        return ["compensate", str(_text(body, "run")), f"--timeout={VERDICT_SECONDS}"]
    if action == "pause":
        return ["pause", str(_text(body, "run")), *_opt("reason", reason), f"--timeout={VERDICT_SECONDS}"]
    raise BadAction(f"unknown action {action!r}")


ACTIONS = ("answer", "approve", "release", "resolve", "cancel", "retry", "compensate", "pause")


async def perform(
    api: KubeApi,
    parse: Parse,
    namespace: str,
    kubeconfig: str | None,
    argv: list[str],
    *,
    clock: Clock | None = None,
) -> Outcome:
    """Runs the CLI command `argv` in `namespace` as the user; its printed lines are the message."""
    args = parse(argv)
    out, err = io.StringIO(), io.StringIO()
    ctx = Context(Cluster(api, namespace, clock), Output("table", out, err), kubeconfig=kubeconfig)
    try:
        code = await args.command(ctx, args)
    except CliError as exc:
        return Outcome(False, exc.message)
    except Exception as exc:  # as the CLI's main() reports it: the API server's words, else the error
        refusal = api_error_from(exc)
        return Outcome(False, describe_api_error(refusal) if refusal else f"{type(exc).__name__}: {exc}")
    said = "\n".join(part for part in (out.getvalue().strip(), err.getvalue().strip()) if part)
    return Outcome(code == EXIT_OK, said)
