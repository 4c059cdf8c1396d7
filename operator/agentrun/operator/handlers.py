"""kopf handlers: thin. Watch events update the cache and queue the Run; the Reconciler does the rest."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from agentrun.api import GROUP, RUN_LABEL, VERSION
from agentrun.kubeapi import KubeApi
from agentrun.operator.cache import OwnedObjects
from agentrun.operator.reconciler import Reconciler
from agentrun.operator.settings import OperatorSettings, apply_settings

log = logging.getLogger("agentrun.operator")

OWNED = {
    "attempts": (GROUP, VERSION, "attempts"),
    "checkpoints": (GROUP, VERSION, "checkpoints"),
    "sideeffects": (GROUP, VERSION, "sideeffects"),
    "pods": ("", "v1", "pods"),
    "leases": ("coordination.k8s.io", "v1", "leases"),
}


class _State:
    reconciler: Reconciler | None = None
    task: asyncio.Task[None] | None = None


state = _State()
cache = OwnedObjects()


def _reconciler() -> Reconciler:
    assert state.reconciler is not None, "the startup handler has not run"
    return state.reconciler


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    config = OperatorSettings.from_env()
    apply_settings(settings, config)
    state.reconciler = Reconciler(KubeApi(), cache, workers=config.workers)
    state.task = asyncio.create_task(state.reconciler.run(), name="reconciler")
    log.info("agentrun operator started: %s", config)


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    if state.task:
        state.task.cancel()


@kopf.on.event(GROUP, VERSION, "runs")
async def run_event(event: kopf.RawEvent, namespace: str | None, name: str, **_: Any) -> None:
    key = (str(namespace), name)
    if event["type"] == "DELETED":
        cache.forget_run(key)
        _reconciler().queue.forget(key)
        return
    _reconciler().queue.add(key)


def _owned_event(kind: str) -> Any:
    async def handler(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        obj = dict(body)
        key = cache.remove(kind, obj) if event["type"] == "DELETED" else cache.put(kind, obj)
        if key is not None:
            _reconciler().queue.add(key)

    handler.__name__ = f"{kind}_event"
    return handler


for _kind, (_group, _version, _plural) in OWNED.items():
    kopf.on.event(_group, _version, _plural, labels={RUN_LABEL: kopf.PRESENT}, id=f"{_kind}-event")(
        _owned_event(_kind)
    )
