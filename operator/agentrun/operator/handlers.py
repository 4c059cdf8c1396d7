"""kopf handlers: thin. Watch events update the cache and queue the Run; the Reconciler does the rest."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any
from wsgiref.simple_server import WSGIServer

import kopf

from agentrun.api import AGENT_LABEL, GROUP, RUN_LABEL, VERSION
from agentrun.core.lease import lease_view
from agentrun.core.pods import pod_view
from agentrun.kubeapi import KubeApi
from agentrun.operator import metrics, sync
from agentrun.operator.cache import AgentAccounts, OwnedObjects
from agentrun.operator.reconciler import Reconciler
from agentrun.operator.settings import OperatorSettings, apply_settings, own_account
from agentrun.tracing import Tracing

log = logging.getLogger("agentrun.operator")
JsonDict = dict[str, Any]


class _State:
    namespaces: tuple[str, ...] = ()  # watched namespaces (none: the whole cluster), set before kopf starts
    reconciler: Reconciler | None = None
    task: asyncio.Task[None] | None = None
    metrics_server: WSGIServer | None = None
    tracing: Tracing | None = None


state = _State()
cache = OwnedObjects(on_put=metrics.METRICS.cached)
accounts = AgentAccounts()


def _reconciler() -> Reconciler:
    assert state.reconciler is not None, "the startup handler has not run"
    return state.reconciler


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    config = OperatorSettings.from_env()
    apply_settings(settings, config)
    api = KubeApi()
    state.tracing = Tracing("agentrun-operator")  # spans over OTLP with OTEL_EXPORTER_OTLP_ENDPOINT
    state.reconciler = Reconciler(
        api,
        cache,
        workers=config.workers,
        metrics=metrics.METRICS,
        accounts=accounts,
        operator_account=own_account(),
        tracing=state.tracing,
    )
    started = time.monotonic()
    counts = await sync.fill(api, cache, state.namespaces, accounts)
    log.info("cache filled in %.1fs: %s", time.monotonic() - started, counts)
    state.task = asyncio.create_task(state.reconciler.run(), name="reconciler")
    state.metrics_server = metrics.serve(config.metrics_port)
    log.info("agentrun operator started: %s; its own ServiceAccount: %s", config, own_account())


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    if state.task:
        state.task.cancel()
    if state.metrics_server:
        await asyncio.to_thread(state.metrics_server.shutdown)
        state.metrics_server.server_close()
    if state.tracing:
        await asyncio.to_thread(state.tracing.shutdown)


@kopf.on.event(GROUP, VERSION, "runs")
async def run_event(event: kopf.RawEvent, namespace: str | None, name: str, **_: Any) -> None:
    key = (str(namespace), name)
    if event["type"] == "DELETED":
        _reconciler().forget(key)
        return
    _reconciler().queue.add(key)


def _cached(kind: str, obj: JsonDict) -> JsonDict | None:
    key = cache.run_key(obj)
    name = obj["metadata"]["name"]
    return next((o for o in cache.of(kind, key) if o["metadata"]["name"] == name), None) if key else None


def news_for_decide(kind: str, previous: JsonDict | None, obj: JsonDict) -> bool:
    """Whether a new version of an owned object can change what `decide` sees. A Lease renewal (only
    renewTime moved) cannot: the cache notes the sighting, and the wake-up already planned for the
    Lease's expiry judges it again then. Nor can a Pod status update that leaves its PodView as it was
    (conditions, IPs, publishes of an unchanged state). Skipping those saves a reconcile, and its read
    of the Run, per renewal and per such update."""
    if previous is None:
        return True
    if kind == "leases":
        return _lease_terms(previous) != _lease_terms(obj)
    if kind == "pods":
        return pod_view(previous) != pod_view(obj)
    return True


def _lease_terms(lease: JsonDict) -> tuple[Any, ...]:
    view = lease_view(lease)
    return view.holder, view.epoch


def _owned_event(kind: str) -> Any:
    async def handler(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        obj = dict(body)
        if event["type"] == "DELETED":
            key = cache.remove(kind, obj)
        else:
            previous = _cached(kind, obj)
            key = cache.put(kind, obj)
            if not news_for_decide(kind, previous, obj):
                return
        if key is not None:
            _reconciler().queue.add(key)

    handler.__name__ = f"{kind}_event"
    return handler


for _kind, (_group, _version, _plural) in sync.OWNED.items():
    kopf.on.event(_group, _version, _plural, labels={RUN_LABEL: kopf.PRESENT}, id=f"{_kind}-event")(
        _owned_event(_kind)
    )


@kopf.on.event(*sync.AGENT_ACCOUNTS, labels={AGENT_LABEL: "true"}, id="serviceaccounts-event")
async def agent_account_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
    # An account that loses the label leaves the selection: the watch reports it DELETED.
    if event["type"] == "DELETED":
        accounts.remove(dict(body))
    else:
        accounts.put(dict(body))
