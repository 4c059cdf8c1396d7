"""`kubectl agentrun`: the command line, and how its outcomes become exit codes and stderr lines."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import NoReturn

from agentrun.cli import config
from agentrun.cli.cluster import Cluster
from agentrun.cli.commands import (
    cancel,
    compensate,
    effects,
    finished,
    fork,
    history,
    inspect,
    pause,
    resume,
    retry,
    state,
    watch,
)
from agentrun.cli.console import command as console
from agentrun.cli.context import Context
from agentrun.cli.controls import identifier_problem
from agentrun.cli.errors import EXIT_FAILED, CliError, api_error_from, describe_api_error
from agentrun.cli.hints import Target
from agentrun.cli.output import FORMATS, Output
from agentrun.cli.store import store_used

Command = Callable[[Context, argparse.Namespace], Awaitable[int]]
PROG = "kubectl agentrun"
GLOBAL_DEFAULTS = {
    "kubeconfig": None,
    "context": None,
    "namespace": None,
    "output": "table",
    "show_managed_fields": False,
    "debug": False,
}


def identifier(what: str) -> Callable[[str], str]:
    """An argparse type: a key or id the API server would accept (else a usage error, nothing sent)."""

    def check(value: str) -> str:
        if problem := identifier_problem(value):
            raise argparse.ArgumentTypeError(f"{value!r} is not a valid {what}: {problem}")
        return value

    return check


KEY = identifier("idempotency key")


def _global_flags(suppress: bool) -> argparse.ArgumentParser:
    """The flags every command takes, before or after its name (as kubectl allows)."""
    parser = argparse.ArgumentParser(add_help=False)
    default = argparse.SUPPRESS if suppress else None
    group = parser.add_argument_group("global flags")
    group.add_argument(
        "--kubeconfig", default=default, help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)"
    )
    group.add_argument("--context", default=default, help="kubeconfig context (default: the current one)")
    group.add_argument(
        "-n", "--namespace", default=default, help="namespace (default: the kubeconfig context's)"
    )
    group.add_argument(
        "-o",
        "--output",
        choices=FORMATS,
        default=argparse.SUPPRESS if suppress else "table",
        help="output format",
    )
    group.add_argument(
        "--show-managed-fields",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="with -o json|yaml: keep metadata.managedFields (hidden by default, as kubectl does)",
    )
    group.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help=argparse.SUPPRESS,
    )
    return parser


def _add(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, command: Command, help_text: str
) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        name, help=help_text, description=help_text, parents=[_global_flags(suppress=True)]
    )
    parser.set_defaults(command=command)
    return parser


def _timeout(parser: argparse.ArgumentParser, default: float, what: str) -> None:
    parser.add_argument(
        "--timeout", type=float, default=default, metavar="SECONDS", help=f"{what} (default {default:g})"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Drive agentrun Runs: inspect them, answer and pause them, retry and cancel them, and "
        "reconcile their side effects.",
        parents=[_global_flags(suppress=False)],
    )
    sub = parser.add_subparsers(dest="command_name", metavar="COMMAND", required=True)

    p = _add(sub, "get", inspect.get, "list Runs, or show one")
    p.add_argument("run", nargs="?", metavar="RUN")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="Runs of every namespace")

    p = _add(
        sub,
        "describe",
        inspect.describe,
        "a Run's timeline: attempts, checkpoints, inputs, side effects, controls",
    )
    p.add_argument("run", metavar="RUN")
    p.add_argument(
        "--archived",
        action="store_true",
        help="a Run archived and deleted after its time to live, read from the state store and verified",
    )
    p.add_argument("--uid", metavar="UID", help="with --archived: the Run of that name with this uid")

    p = _add(sub, "history", history.history, "archived Runs, from the state store's archive index")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="archived Runs of every namespace")

    p = _add(sub, "cancel", cancel.cancel, "cancel a Run (compare-and-swap on spec.cancelEpoch)")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--wait", action="store_true", help="wait until the Run is Cancelled")
    p.add_argument("--reason", metavar="TEXT", help="why: recorded in status.controls (op Cancel)")
    p.add_argument(
        "--idempotency-key",
        metavar="KEY",
        type=KEY,
        help="the cancel's spec.cancelRequest key (default: derived from the Run, the epoch and the reason)",
    )
    _timeout(p, 60, "how long --wait waits")

    p = _add(sub, "resume", resume.resume, "answer the Run's pending request")
    p.add_argument("run", metavar="RUN")
    p.add_argument(
        "--value", metavar="JSON", help="the answer, as JSON (validated against the request's schema)"
    )
    p.add_argument("--value-file", metavar="FILE", help="read the answer's JSON from FILE (- for stdin)")
    p.add_argument(
        "--request-id",
        metavar="ID",
        type=identifier("request id"),
        help="the request answered (default: the pending one)",
    )
    p.add_argument(
        "--checkpoint", metavar="ID", help="the checkpoint it applies to (default: the pending one's)"
    )
    p.add_argument(
        "--key",
        metavar="KEY",
        type=KEY,
        help="idempotency key (default: derived from run, request and value)",
    )
    p.add_argument(
        "--wait", action="store_true", help="once accepted, follow the Run until it stops or waits"
    )
    _timeout(p, 30, "how long to wait for the operator's verdict")

    p = _add(sub, "retry", retry.retry, "one more Attempt of a Failed or NeedsReconciliation Run")
    p.add_argument("run", metavar="RUN")
    p.add_argument(
        "--from-checkpoint", metavar="ID", help="continue from this checkpoint (default: the latest)"
    )
    p.add_argument("--reason", metavar="TEXT", help="why, e.g. what was fixed (recorded with the Attempt)")
    p.add_argument(
        "--key", metavar="KEY", type=KEY, help="idempotency key (default: one per failure of the Run)"
    )
    p.add_argument(
        "--wait", action="store_true", help="once accepted, follow the Run until it stops or waits"
    )
    _timeout(p, 30, "how long to wait for the operator's verdict")

    p = _add(sub, "compensate", compensate.compensate, "run the compensations of a terminal Run's effects")
    p.add_argument("run", metavar="RUN")
    p.add_argument(
        "--effect",
        action="append",
        metavar="KEY",
        type=KEY,
        help="the idempotency key of an effect to compensate (repeat for more; default: all of them)",
    )
    p.add_argument(
        "--key", metavar="KEY", type=KEY, help="idempotency key of the request (default: a fresh one)"
    )
    p.add_argument(
        "--wait", action="store_true", help="once accepted, follow the Run until it is back in its phase"
    )
    _timeout(p, 30, "how long to wait for the operator's verdict")

    p = _add(sub, "pause", pause.pause, "ask the agent to pause at its next step boundary")
    p.add_argument("run", metavar="RUN")
    p.add_argument(
        "--request-id",
        metavar="ID",
        type=identifier("pause request id"),
        help="id of the pause (default: derived from the Run's progress)",
    )
    p.add_argument("--reason", metavar="TEXT", help="why, shown to whoever resumes it")
    _timeout(p, 10, "how long to wait for the agent to reach its step boundary")

    p = _add(sub, "fork", fork.fork, "a new Run that continues from a checkpoint of this one (spec.forkFrom)")
    p.add_argument("run", metavar="RUN", help="the source Run")
    p.add_argument("--name", required=True, metavar="NEW", help="the new Run's name")
    p.add_argument("--checkpoint", metavar="ID", help="the source's State checkpoint (default: its latest)")
    p.add_argument("--input", metavar="JSON", help="the fork's spec.input (default: the source's)")
    p.add_argument("--wait", action="store_true", help="follow the fork until it stops or waits")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="with --wait: give up")

    p = _add(sub, "effects", effects.effects, "a Run's side effects")
    p.add_argument("run", metavar="RUN")

    p = _add(sub, "resolve-effect", effects.resolve_effect, "settle a side effect whose outcome is unknown")
    p.add_argument("name", metavar="NAME", help="the SideEffect's name (see: kubectl agentrun effects RUN)")
    verdict = p.add_mutually_exclusive_group(required=True)
    verdict.add_argument("--confirmed", action="store_true", help="it happened (needs --reference)")
    verdict.add_argument("--failed", action="store_true", help="it failed for good: never sent again")
    verdict.add_argument(
        "--absent",
        action="store_true",
        help="it did not happen: state Failed, and a later Attempt may send it again with the same key",
    )
    p.add_argument("--reference", metavar="REF", help="the external system's id of what was done")
    p.add_argument("--reason", metavar="TEXT", help="why you resolve it so (recorded as resolutionMessage)")
    p.add_argument(
        "--retry",
        action="store_true",
        help="then retry the Run, once no outcome of it is unknown any more (as `kubectl agentrun retry`)",
    )
    _timeout(p, 30, "with --retry: how long to wait for the operator's verdict")
    p.add_argument("--result", metavar="JSON", help="what the action returned, as JSON")

    p = _add(
        sub,
        "state",
        state.state,
        "a Run's latest saved state (or its result); one in the state store is fetched and verified",
    )
    p.add_argument("run", metavar="RUN")
    p.add_argument("--checkpoint", metavar="ID", help="this checkpoint's state instead of the latest")
    p.add_argument("--result", action="store_true", help="the Run's committed result instead of a state")

    p = _add(
        sub,
        "logs",
        finished.logs,
        "an Attempt's log: its Pod's while it is there, else the tail kept when it was deleted (spec.podGC)",
    )
    p.add_argument("run", metavar="RUN")
    p.add_argument("--attempt", type=int, metavar="N", help="Attempt N (default: the Run's current one)")

    p = _add(sub, "report", inspect.report, "what a Run did: happened, compensated, cannot be undone")
    p.add_argument("run", metavar="RUN")

    p = _add(sub, "watch", watch.watch, "follow a Run until it stops or waits (exit 1 if it failed)")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="give up after this long")

    p = _add(sub, "console", console.serve, "a web inbox in your browser: answer, approve, reconcile, as you")
    console.add_flags(p)
    p.set_defaults(parse=parse)  # the page's actions are these very commands
    return parser


def parse(argv: Sequence[str]) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    for name, default in GLOBAL_DEFAULTS.items():
        if getattr(args, name, None) is None:
            setattr(args, name, default)
    return args


def target(args: argparse.Namespace) -> Target:
    """Where the command acts, as the commands it prints must say it."""
    namespace = args.namespace or config.default_namespace(args.kubeconfig, args.context)
    return Target(namespace, config.other_context(args.kubeconfig, args.context), args.kubeconfig)


async def _run(args: argparse.Namespace) -> int:
    where = target(args)
    api = config.connect(args.kubeconfig, args.context)
    try:
        out = Output(args.output, managed_fields=args.show_managed_fields)
        ctx = Context(
            Cluster(api, where.namespace), out, kubeconfig=args.kubeconfig, context=args.context, target=where
        )
        command: Command = args.command
        return await command(ctx, args)
    finally:
        await api.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    code = _main(argv)
    if argv is None and store_used():
        _leave(code)
    return code


def _leave(code: int) -> NoReturn:
    """Ends a program that used the state store without finalizing the interpreter: obstore's Tokio
    threads may still be winding down then, and abort the process (SIGABRT) after the command did its
    work. Its output is flushed first."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BrokenPipeError, ValueError):
            stream.flush()
    os._exit(code)


def _main(argv: Sequence[str] | None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        return asyncio.run(_run(args))
    except CliError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (| head): say nothing more, as other CLIs do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED
    except Exception as exc:
        if args.debug:
            raise
        refusal = api_error_from(exc)
        message = describe_api_error(refusal) if refusal else f"{type(exc).__name__}: {exc}"
        print(f"error: {message}", file=sys.stderr)
        return EXIT_FAILED


__all__ = ["build_parser", "main", "parse"]
