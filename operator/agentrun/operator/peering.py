"""When this replica may act: kopf's pause state, followed from kopf's peering object(s).

With peering, kopf stops delivering Run events on a replica that sees a live peer of higher (or equal)
priority, but the runtime's own informers, work queue, timers and notifier are agentrun's: they must
pause with it. kopf has no hook that tells its pause state, so this follows the peering object(s) kopf
reads (one per watched namespace, or the cluster's) and judges them as kopf does (core.peering), at
each change and when a blocking peer's heartbeat runs out, and tells the runtime each new standing
(whether it may act, and why). Like kopf, a replica stands by until it has read every peering object.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import os
import random
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final
from urllib.parse import quote

from agentrun.api.peering import PEERING_GROUP, PEERING_VERSION
from agentrun.clock import Clock
from agentrun.core.peering import MalformedPeering, Standing, combined, standing
from agentrun.kubeapi import KubeApi
from agentrun.kubewatch import Listed, reflect

log = logging.getLogger("agentrun.operator")
JsonDict = dict[str, Any]
# The standing is judged again this long after a blocking peer's heartbeat runs out: it has, then.
RECHECK_SLACK: Final = 0.05
CLUSTER: Final = "the cluster"


def replica_identity(env: Mapping[str, str], clock: Clock, chance: random.Random) -> str:
    """This replica's name in the peering object, given to kopf too (so both mean the same replica):
    the Pod's name when the chart sets POD_ID (kopf's own convention), else user@host/start/random."""
    if env.get("POD_ID"):
        return env["POD_ID"]
    suffix = "".join(chance.choices("abcdefghijklmnopqrstuvwxyz0123456789", k=4))
    return f"{getpass.getuser()}@{socket.gethostname()}/{clock.now():%Y%m%d%H%M%S}/{os.getpid()}-{suffix}"


def peering_collections(namespaces: Sequence[str]) -> list[tuple[str, str]]:
    """(where, collection) of each peering object kopf uses: one per watched namespace, or the cluster's."""
    base = f"/apis/{PEERING_GROUP}/{PEERING_VERSION}"
    if not namespaces:
        return [(CLUSTER, f"{base}/clusterkopfpeerings")]
    return [(ns, f"{base}/namespaces/{quote(ns)}/kopfpeerings") for ns in namespaces]


Flip = Callable[[Standing], Awaitable[None]]


class PeeringStanding:
    """Follows the peering object(s) named `name` and calls `flip` with each standing that differs from
    the last one told (whether it may act, or why not; the first is told whatever it is)."""

    def __init__(
        self,
        api: KubeApi,
        *,
        name: str,
        namespaces: Sequence[str],
        identity: str,
        priority: int,
        clock: Clock,
        flip: Flip,
        timeout_seconds: int = 300,
    ) -> None:
        self.api, self.name, self.identity, self.priority = api, name, identity, priority
        self.clock, self.flip, self.timeout_seconds = clock, flip, timeout_seconds
        self._collections = peering_collections(namespaces)
        self._bodies: dict[str, JsonDict | None] = {where: None for where, _ in self._collections}
        self._standings: dict[str, Standing | None] = dict.fromkeys(self._bodies)
        self._news = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.told: Standing | None = None

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._follow(where, collection), name=f"peering {where}")
            for where, collection in self._collections
        ]
        self._tasks.append(asyncio.create_task(self.judging(), name="peering standing"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def seen(self, where: str, body: JsonDict) -> None:
        """A version of the peering object of `where` (a listing's, or a watch event's: a deleted
        object's last version counts, as it does for kopf)."""
        self._bodies[where] = body
        self._news.set()

    def judge(self) -> Standing:
        """The standing now, over every peering object. One kopf could not read keeps its last standing."""
        now = self.clock.now()
        for where, body in self._bodies.items():
            if body is None:
                continue
            try:
                self._standings[where] = standing(
                    body.get("status"), identity=self.identity, priority=self.priority, now=now
                )
            except MalformedPeering as exc:
                log.warning("peering %s in %s not judged (the standing stays): %s", self.name, where, exc)
        return combined(self._standings)

    async def _follow(self, where: str, collection: str) -> None:
        async for item in reflect(
            self.api, collection, name=self.name, timeout_seconds=self.timeout_seconds, clock=self.clock
        ):
            if isinstance(item, Listed):
                if item.items:  # none: not created yet (kopf keeps its standing too)
                    self.seen(where, item.items[0])
            else:
                self.seen(where, item.object)

    async def judging(self) -> None:
        """Judges the standing at each change of the peering, and when a blocking peer's heartbeat runs
        out on the clock; tells `flip` each new standing. Runs until cancelled (start() runs it)."""
        while True:
            self._news.clear()
            found = self.judge()
            if self.told is None or (found.active, found.reason) != (self.told.active, self.told.reason):
                self.told = found
                try:
                    await self.flip(found)
                except Exception:  # the standing is followed for as long as the replica runs
                    log.exception("the runtime did not take the standing %s", found)
            wait = None if found.recheck_in is None else found.recheck_in + RECHECK_SLACK
            await self._next_news(wait)

    async def _next_news(self, seconds: float | None) -> None:
        """Until the peering changes, or `seconds` of the clock have passed (None: no limit)."""
        if seconds is None:
            await self._news.wait()
            return
        news = asyncio.create_task(self._news.wait())
        timer = asyncio.create_task(self.clock.sleep(seconds))
        try:
            await asyncio.wait({news, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (news, timer):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
