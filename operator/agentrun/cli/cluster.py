"""Everything the plugin reads and writes, through KubeApi: Runs, what they own, and waiting on them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from agentrun.api import GROUP, RUN_LABEL, VERSION
from agentrun.cli.errors import CliError, not_found
from agentrun.clock import Clock, SystemClock
from agentrun.kubeapi import ApiError, KubeApi
from agentrun.kubewatch import Listed, reflect

JsonDict = dict[str, Any]
SELF_SUBJECT_REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
# POSTed to SELF_SUBJECT_REVIEWS, it asks the API server who is asking (what `kubectl auth whoami` shows).
SELF_SUBJECT_REVIEW = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}


def reviewed_user(answer: JsonDict) -> str | None:
    """The user name in the API server's answer to a SelfSubjectReview, None when it names nobody."""
    name = ((answer.get("status") or {}).get("userInfo") or {}).get("username")
    return str(name) if name else None


class Cluster:
    """One namespace of one cluster, as the plugin sees it."""

    def __init__(self, api: KubeApi, namespace: str, clock: Clock | None = None) -> None:
        self.api = api
        self.namespace = namespace
        self.clock = clock or SystemClock()

    def path(self, plural: str, name: str | None = None, subresource: str | None = None) -> str:
        return self.api.custom_path(plural, self.namespace, name, subresource)

    # ---- reads ---------------------------------------------------------------------------------------

    async def find_run(self, name: str) -> JsonDict | None:
        return await self.api.get(self.path("runs", name))

    async def run(self, name: str) -> JsonDict:
        body = await self.find_run(name)
        if body is None:
            raise not_found("run", name, self.namespace)
        return body

    async def runs(self, all_namespaces: bool = False) -> list[JsonDict]:
        path = f"/apis/{GROUP}/{VERSION}/runs" if all_namespaces else self.path("runs")
        return list((await self.api.request("GET", path)).get("items", []))

    async def owned(self, plural: str, run: str) -> list[JsonDict]:
        """The Attempts, Checkpoints or SideEffects of a Run (by the agentrun.dev/run label)."""
        found = await self.api.request(
            "GET", self.path(plural), query={"labelSelector": f"{RUN_LABEL}={run}"}
        )
        return list(found.get("items", []))

    async def side_effect(self, name: str) -> JsonDict:
        body = await self.api.get(self.path("sideeffects", name))
        if body is None:
            raise not_found("side effect", name, self.namespace)
        return body

    async def whoami(self) -> str | None:
        """The user name the API server knows us by (SelfSubjectReview), None when it will not say."""
        try:
            answer = await self.api.create(SELF_SUBJECT_REVIEWS, SELF_SUBJECT_REVIEW)
        except ApiError:
            return None
        return reviewed_user(answer)

    # ---- writes --------------------------------------------------------------------------------------

    async def merge_patch_run(self, name: str, patch: JsonDict) -> JsonDict:
        return await self.api.merge_patch(self.path("runs", name), patch)

    async def json_patch_run(self, name: str, operations: list[JsonDict]) -> JsonDict:
        return await self.api.json_patch(self.path("runs", name), operations)

    async def patch_side_effect_status(self, name: str, patch: JsonDict) -> JsonDict:
        return await self.api.merge_patch(self.path("sideeffects", name, "status"), patch)

    # ---- waiting -------------------------------------------------------------------------------------

    async def follow(self, name: str, within: float | None) -> AsyncIterator[JsonDict]:
        """The Run now, then each new version of it, until `within` seconds have passed (None: forever).

        kubewatch's list-then-watch (resumed whenever the server ends it or the connection drops); the
        list also tells a missing Run apart; a refusal (e.g. forbidden) ends it with that error.
        """
        deadline = None if within is None else self.clock.monotonic() + within
        stream = reflect(self.api, self.path("runs"), name=name, raise_refusals=True, clock=self.clock)
        seen: object = None
        try:
            while True:
                left = None if deadline is None else deadline - self.clock.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError
                async with asyncio.timeout(left):
                    item = await anext(stream)
                if isinstance(item, Listed):
                    if not item.items and seen is None:
                        raise not_found("run", name, self.namespace)
                    run = item.items[0] if item.items else None
                else:
                    run = None if item.type == "DELETED" else item.object
                if run is None:
                    raise CliError(f'run "{name}" was deleted')
                version = run.get("metadata", {}).get("resourceVersion")
                if version != seen:
                    seen = version
                    yield run
        finally:
            await stream.aclose()


async def wait_for_run(
    cluster: Cluster, name: str, done: Callable[[JsonDict], bool], within: float
) -> tuple[JsonDict, bool]:
    """Follows the Run until `done(run)` is true; returns the last version seen and whether it was."""
    last: JsonDict = {}
    try:
        async with asyncio.timeout(within):
            async for run in cluster.follow(name, within):
                last = run
                if done(run):
                    return run, True
    except TimeoutError:
        pass
    return last or await cluster.run(name), False
