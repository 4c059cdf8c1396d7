"""`kubectl agentrun console`: the web inbox, served on this machine with the user's own kubeconfig, or
in a cluster behind an authenticating proxy, acting with each person's own token."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from aiohttp import web

from agentrun.cli import config
from agentrun.cli.console import access
from agentrun.cli.console.actions import Parse
from agentrun.cli.console.seats import ProxySeats
from agentrun.cli.console.server import AccessLogger, Console, application
from agentrun.cli.console.sessions import Sessions
from agentrun.cli.console.watchcache import WatchCache
from agentrun.cli.context import Context
from agentrun.cli.errors import EXIT_USAGE, CliError
from agentrun.kubeauth import load_configuration

LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
SWEEP_SECONDS = 60.0  # how often idle people's watches are looked for (behind a proxy)


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--namespaces",
        metavar="NS[,NS...]",
        help="the namespaces to show (default: those you may list Runs in, else the context's)",
    )
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free one)")
    parser.add_argument(
        "--address", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)"
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="another Host header to answer to (a name this machine has; the loopback ones always work)",
    )
    parser.add_argument(
        "--session-hours", type=float, default=8.0, help="how long a browser session lasts (default 8)"
    )
    parser.add_argument(
        "--proxy-token-header",
        metavar="HEADER",
        help="serve behind an authenticating (OIDC) proxy: every request acts with the person's bearer "
        "token the proxy puts in HEADER (e.g. Authorization or X-Forwarded-Access-Token), never with "
        "this console's credentials, which only say where the API server is; a request without a token "
        "is refused. No login URL. Needs --allow-host (the names people reach the console by)",
    )


def _namespaces(text: str | None) -> list[str] | None:
    if not text:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise CliError("--namespaces needs at least one namespace", EXIT_USAGE)
    return names


async def serve(ctx: Context, args: argparse.Namespace) -> int:
    """Serves until interrupted; prints where, and the one-time login URL. args.parse is the CLI's
    parser (agentrun.cli.app.parse): each action in the page runs a command it parses."""
    parse: Parse = args.parse
    if args.session_hours <= 0:
        raise CliError("--session-hours must be positive", EXIT_USAGE)
    logging.basicConfig(level=logging.INFO if args.debug else logging.WARNING, stream=sys.stderr)
    if args.proxy_token_header:
        return await _serve_proxied(ctx, args, parse)
    api = ctx.cluster.api
    scopes = await access.scopes(api, _namespaces(args.namespaces), ctx.namespace)
    user = await ctx.cluster.whoami()
    cache = WatchCache(api, scopes)
    sessions = Sessions(args.session_hours * 3600, ctx.clock)
    console = Console(api, cache, sessions, set(), user, parse, kubeconfig=ctx.kubeconfig, clock=ctx.clock)
    runner = web.AppRunner(
        application(console), access_log_class=AccessLogger, access_log=logging.getLogger("aiohttp.access")
    )
    await runner.setup()
    site = web.TCPSite(runner, args.address, args.port)
    cache.start()
    try:
        await site.start()
        port = runner.addresses[0][1]
        console.hosts = {f"{h}:{port}" for h in (*LOOPBACK, *args.allow_host)} | set(args.allow_host)
        base = f"http://127.0.0.1:{port}"
        where = ", ".join("all namespaces" if s is None else s for s in scopes)
        ctx.out.text(f"agentrun console for {user or 'you (the API server did not say who)'}: {where}")
        ctx.out.text(f"Open (works once; signs this browser in): {base}/login?token={sessions.login_token}")
        ctx.out.text(f"Then: {base}/   Stop with Ctrl-C.")
        await asyncio.Event().wait()
    finally:
        await cache.stop()
        await runner.cleanup()
    return 0


async def _serve_proxied(ctx: Context, args: argparse.Namespace, parse: Parse) -> int:
    """Behind a proxy: a seat per person's token, opened at their first request."""
    if not args.allow_host:
        raise CliError(
            "--proxy-token-header needs --allow-host: the names people reach the console by (the proxy's "
            "Host header), so that a page of another site cannot reach it under its own name",
            EXIT_USAGE,
        )
    # Where the API server is and its CA; its credentials never act (seats.as_bearer drops them).
    base = load_configuration(config.kubeconfig_path(args.kubeconfig), args.context)
    proxy = ProxySeats(base, _namespaces(args.namespaces), ctx.namespace, clock=ctx.clock)
    console = Console(
        None,
        None,
        Sessions(args.session_hours * 3600, ctx.clock),
        set(),
        None,
        parse,
        clock=ctx.clock,
        proxy=proxy,
        token_header=args.proxy_token_header,
    )
    runner = web.AppRunner(
        application(console), access_log_class=AccessLogger, access_log=logging.getLogger("aiohttp.access")
    )
    await runner.setup()
    site = web.TCPSite(runner, args.address, args.port)
    try:
        await site.start()
        port = runner.addresses[0][1]
        console.hosts = set(args.allow_host) | {f"{h}:{port}" for h in args.allow_host if ":" not in h}
        ctx.out.text(
            f"agentrun console on {args.address}:{port} behind a proxy: each request acts with the token in "
            f"its {args.proxy_token_header} header; hosts: {', '.join(sorted(console.hosts))}"
        )
        while True:
            await ctx.clock.sleep(SWEEP_SECONDS)
            await proxy.sweep()
    finally:
        await proxy.close()
        await runner.cleanup()
