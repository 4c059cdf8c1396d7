"""python -m agentrun.deploy.selftest: what `helm test` checks in an installed release.

1. The API server serves the four agentrun.dev kinds with their status subresources (the CRDs are
   installed and established).
2. This Pod's ServiceAccount (the operator's) can list Runs in every namespace given (its RBAC works).
3. With --peering: a replica of the operator is alive (a fresh heartbeat in the peering object).

Each check is retried until --timeout; the exit code is the number of failed checks.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import sys
from collections.abc import Awaitable, Callable, Sequence
from urllib.parse import quote

from agentrun.api import GROUP, VERSION
from agentrun.api.peering import AGENTRUN_PLURALS, PEERING_GROUP, PEERING_VERSION
from agentrun.clock import Clock, SystemClock
from agentrun.kubeapi import ApiError, KubeApi, served_resources

Check = Callable[[], Awaitable[str | None]]  # None when it holds, else what is wrong


def crds_served(api: KubeApi) -> Check:
    wanted = {*AGENTRUN_PLURALS, *(f"{plural}/status" for plural in AGENTRUN_PLURALS)}

    async def check() -> str | None:
        missing = wanted - await served_resources(api, f"{GROUP}/{VERSION}")
        return f"{GROUP}/{VERSION} does not serve {sorted(missing)}" if missing else None

    return check


def runs_listable(api: KubeApi, namespace: str) -> Check:
    async def check() -> str | None:
        try:
            await api.request("GET", api.custom_path("runs", namespace), query={"limit": "1"})
        except ApiError as exc:
            return f"cannot list Runs in {namespace}: {exc}"
        return None

    return check


def live_peer(api: KubeApi, name: str, namespace: str | None, clock: Clock) -> Check:
    base = f"/apis/{PEERING_GROUP}/{PEERING_VERSION}"
    path = (
        f"{base}/namespaces/{quote(namespace)}/kopfpeerings/{quote(name)}"
        if namespace
        else f"{base}/clusterkopfpeerings/{quote(name)}"
    )

    async def check() -> str | None:
        try:
            peering = await api.get(path)
        except ApiError as exc:
            return f"cannot read the peering object {path}: {exc}"
        if peering is None:
            return f"no peering object {path}: has the operator started?"
        now = clock.now()
        for peer in (peering.get("status") or {}).values():
            if not isinstance(peer, dict) or "lastseen" not in peer:
                continue
            seen = datetime.datetime.fromisoformat(str(peer["lastseen"]))
            if seen + datetime.timedelta(seconds=int(peer.get("lifetime", 60))) > now:
                return None
        return f"no live operator replica in {path}"

    return check


async def run_checks(
    checks: Sequence[tuple[str, Check]], seconds: float, clock: Clock, interval: float = 1.0
) -> int:
    """Runs each check until it holds or the seconds (for all checks together) are over."""
    failed = 0
    deadline = clock.monotonic() + seconds
    for title, check in checks:
        problem = await check()
        while problem and clock.monotonic() < deadline:
            await clock.sleep(interval)
            problem = await check()
        print(f"{'FAIL' if problem else 'ok'}: {title}" + (f": {problem}" if problem else ""), flush=True)
        failed += bool(problem)
    return failed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agentrun.deploy.selftest", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--namespace", action="append", default=[], help="a namespace the operator serves")
    parser.add_argument("--peering", help="the peering object's name (checks that an operator is alive)")
    parser.add_argument("--cluster-peering", action="store_true", help="the peering object is cluster-wide")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for all checks")
    args = parser.parse_args(argv)

    async def run() -> int:
        api, clock = KubeApi(threads=2), SystemClock()
        checks: list[tuple[str, Check]] = [(f"the {GROUP} CRDs are served", crds_served(api))]
        checks += [(f"Runs can be listed in {ns}", runs_listable(api, ns)) for ns in args.namespace]
        if args.peering:
            where: list[str | None] = [None] if args.cluster_peering else list(args.namespace)
            checks += [
                (
                    f"an operator replica is alive ({ns or 'cluster-wide'})",
                    live_peer(api, args.peering, ns, clock),
                )
                for ns in where
            ]
        return await run_checks(checks, args.timeout, clock)

    return asyncio.run(run())


if __name__ == "__main__":
    sys.exit(main())
