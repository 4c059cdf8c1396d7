"""List-then-watch with reconnect, as client-go's reflector does: one helper for the operator's caches,
the SDK's cancel watch and the CLI's watch.

`reflect` yields a `Listed` (every object the selection holds now, and the list's resourceVersion),
then the watch events after it. The stream never ends on its own: a watch the server closes (its
timeout) is resumed from the last resourceVersion seen (bookmarks keep that recent on a quiet
selection); a connection that fails is resumed after a pause; a resourceVersion the server no longer
has (410 Gone) is followed by a new `Listed`, which replaces what the consumer holds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Final

from agentrun.clock import Clock, SystemClock
from agentrun.kubeapi import ApiError, KubeApi

log = logging.getLogger("agentrun.kubewatch")
JsonDict = dict[str, Any]
# What a consumer keeps of each listed object (e.g. a cache's trimmed copy), applied page by page.
Keep = Callable[[JsonDict], JsonDict]
PAGE: Final = 500
RETRY_SECONDS: Final = 1.0
MAX_RETRY_SECONDS: Final = 30.0


@dataclass(frozen=True)
class Listed:
    """The whole selection as of `resource_version`: it replaces what an earlier Listed and the events
    since gave (objects missing from it are gone)."""

    items: list[JsonDict]
    resource_version: str


@dataclass(frozen=True)
class Event:
    type: str  # ADDED, MODIFIED or DELETED
    object: JsonDict


class Gone(Exception):
    """The resourceVersion to watch from is too old for the API server (410): list again."""


async def list_all(
    api: KubeApi,
    collection: str,
    *,
    name: str | None = None,
    label_selector: str | None = None,
    page: int = PAGE,
    keep: Keep | None = None,
) -> Listed:
    """Every object of the selection, a page at a time, and the resourceVersion of the first page (the
    snapshot the continue tokens read from). With `keep`, each page's objects are replaced by what keep
    returns as the page arrives: only one page of full objects is alive at a time, not the whole list
    (thousands of Pods, each ten times its trimmed copy)."""
    query: dict[str, str] = {"limit": str(page)}
    if label_selector:
        query["labelSelector"] = label_selector
    if name is not None:
        query["fieldSelector"] = f"metadata.name={name}"
    items: list[JsonDict] = []
    version = ""
    while True:
        found = await api.request("GET", collection, query=query)
        page_items = found.get("items") or []
        items.extend(page_items if keep is None else map(keep, page_items))
        metadata = found.get("metadata") or {}
        version = version or str(metadata.get("resourceVersion") or "")
        token = metadata.get("continue")
        if not token:
            return Listed(items, version)
        query["continue"] = token


async def watch_from(
    api: KubeApi,
    collection: str,
    resource_version: str,
    *,
    name: str | None = None,
    label_selector: str | None = None,
    timeout_seconds: int = 300,
) -> AsyncIterator[Event | str]:
    """One watch request from `resource_version`: its events, and (as a str) each newer resourceVersion
    a bookmark reports. Raises Gone when the server no longer has that version."""
    async for raw in api.watch(
        collection,
        name,
        label_selector=label_selector,
        timeout_seconds=timeout_seconds,
        resource_version=resource_version,
        bookmarks=True,
    ):
        kind, obj = raw.get("type"), raw.get("object") or {}
        if kind == "BOOKMARK":
            yield str((obj.get("metadata") or {}).get("resourceVersion") or resource_version)
        elif kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone(str(obj.get("message") or "resourceVersion too old"))
            raise ApiError(int(obj.get("code") or 500), str(obj.get("reason") or ""), str(obj.get("message")))
        elif kind in ("ADDED", "MODIFIED", "DELETED"):
            yield Event(str(kind), obj)


async def reflect(
    api: KubeApi,
    collection: str,
    *,
    name: str | None = None,
    label_selector: str | None = None,
    timeout_seconds: int = 300,
    page: int = PAGE,
    raise_refusals: bool = False,
    list_first: bool = True,
    keep: Keep | None = None,
    clock: Clock | None = None,
) -> AsyncGenerator[Listed | Event, None]:
    """A Listed, then every change after it, for good (see the module docstring). The caller ends it by
    leaving the loop (or cancelling its task). raise_refusals: a permanent ApiError (ApiError.permanent:
    forbidden, not found) is raised instead of tried again, for a person waiting at a prompt.

    With list_first=False no list is made (a request saved, e.g. for the one object a worker watches):
    a watch without a resourceVersion starts with an ADDED event per object that exists now, and a 410
    starts such a watch again; no Listed comes, so objects deleted meanwhile are not reported gone.
    keep: applied to the listed objects (list_all); watch events come whole."""
    version: str | None = None
    pause = RETRY_SECONDS
    while True:
        try:
            if version is None and list_first:
                listed = await list_all(
                    api, collection, name=name, label_selector=label_selector, page=page, keep=keep
                )
                version = listed.resource_version
                yield listed
                # The consumer has it now: held here, a whole listing would stay alive as long as the
                # watch after it (for good, on a quiet selection).
                del listed
            async for item in watch_from(
                api,
                collection,
                version or "",
                name=name,
                label_selector=label_selector,
                timeout_seconds=timeout_seconds,
            ):
                if isinstance(item, str):
                    version = item
                    continue
                version = str(item.object.get("metadata", {}).get("resourceVersion") or version)
                yield item
            pause = RETRY_SECONDS  # the server ended a healthy stream: resume at once
        except Gone:
            log.debug("%s: resourceVersion %s expired; listing again", collection, version)
            version = None
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as exc:  # a refusal or no answer: the API server may be restarting
            if isinstance(exc, ApiError) and exc.status == 410:
                version = None
                continue
            if raise_refusals and isinstance(exc, ApiError) and exc.permanent:
                raise
            log.warning("watching %s: %s; again in %.0fs", collection, exc, pause)
            await (clock or SystemClock()).sleep(pause)
            pause = min(pause * 2, MAX_RETRY_SECONDS)
