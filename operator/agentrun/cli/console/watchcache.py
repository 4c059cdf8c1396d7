"""The Runs and SideEffects the user can see, kept current by list-then-watch (kubewatch.reflect).

One watch per kind and namespace (or one per kind over all namespaces, when the user may list them
cluster-wide). Each change bumps `version` and wakes whoever waits for a newer one (the event streams of
the open pages). A watch the API server refuses (forbidden) stops, and says so on the page.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from agentrun.api import GROUP, VERSION
from agentrun.cli.console import inbox
from agentrun.kubeapi import ApiError, KubeApi
from agentrun.kubewatch import Listed, reflect

JsonDict = dict[str, Any]
KINDS = ("runs", "sideeffects")
ALL_NAMESPACES = None


def collection(api: KubeApi, plural: str, namespace: str | None) -> str:
    if namespace is ALL_NAMESPACES:
        return f"/apis/{GROUP}/{VERSION}/{plural}"
    return api.custom_path(plural, namespace)


def _key(obj: JsonDict) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class WatchCache:
    def __init__(self, api: KubeApi, scopes: list[str | None]) -> None:
        """scopes: the namespaces to watch, or [ALL_NAMESPACES]."""
        self.api = api
        self.scopes = scopes
        self.objects: dict[str, dict[tuple[str, str], JsonDict]] = {kind: {} for kind in KINDS}
        self.problems: dict[str, str] = {}  # "<kind> in <scope>" -> why it cannot be watched
        self.version = 0
        self._changed = asyncio.Condition()
        self._listed: set[tuple[str, str | None]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._inbox: tuple[int, list[JsonDict]] = (-1, [])

    @property
    def ready(self) -> bool:
        """Every watch has listed once (or was refused): the inbox is complete."""
        return len(self._listed) == len(KINDS) * len(self.scopes)

    def start(self) -> None:
        for scope in self.scopes:
            for kind in KINDS:
                self._tasks.append(asyncio.create_task(self._follow(kind, scope)))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _bump(self) -> None:
        async with self._changed:
            self.version += 1
            self._changed.notify_all()

    async def wait_newer(self, version: int) -> int:
        """Returns once the cache is ready and past `version`: the version now."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.ready and self.version > version)
            return self.version

    async def _follow(self, kind: str, scope: str | None) -> None:
        objects = self.objects[kind]
        where = "all namespaces" if scope is ALL_NAMESPACES else f"namespace {scope}"
        stream = reflect(self.api, collection(self.api, kind, scope), raise_refusals=True)
        try:
            async for item in stream:
                if isinstance(item, Listed):
                    for key in [k for k in objects if scope is ALL_NAMESPACES or k[0] == scope]:
                        del objects[key]
                    objects.update((_key(o), o) for o in item.items)
                    self._listed.add((kind, scope))
                    self.problems.pop(f"{kind} in {where}", None)
                elif item.type == "DELETED":
                    objects.pop(_key(item.object), None)
                else:
                    objects[_key(item.object)] = item.object
                await self._bump()
        except ApiError as exc:
            self.problems[f"{kind} in {where}"] = f"the API server refuses to list {kind}: {exc.message}"
            self._listed.add((kind, scope))
            await self._bump()
        finally:
            await stream.aclose()

    def inbox(self) -> list[JsonDict]:
        """The inbox of the current version (computed once per version)."""
        if self._inbox[0] != self.version:
            self._inbox = (
                self.version,
                inbox.items(self.objects["runs"].values(), self.objects["sideeffects"].values()),
            )
        return self._inbox[1]

    def run(self, namespace: str, name: str) -> JsonDict | None:
        return self.objects["runs"].get((namespace, name))

    def namespaces(self) -> list[str]:
        seen = {ns for objects in self.objects.values() for ns, _ in objects}
        return sorted(seen | {s for s in self.scopes if s is not None})
