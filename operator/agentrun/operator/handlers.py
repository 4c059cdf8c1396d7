"""kopf's part: the Run watch (and the peering, in settings). The startup handler builds the Runtime into
kopf's memo, which kopf hands to every handler; the Run event handler passes each event on. With peering,
the Runtime follows kopf's pause on its own (agentrun.operator.peering): kopf gets the same `identity`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import kopf

from agentrun.api import GROUP, VERSION
from agentrun.clock import Clock
from agentrun.kubeapi import KubeApi
from agentrun.operator.metrics import OperatorMetrics, new_registry
from agentrun.operator.runtime import Runtime
from agentrun.operator.settings import OperatorSettings, apply_settings, own_account
from agentrun.tracing import Tracing

log = logging.getLogger("agentrun.operator")


def registry(
    namespaces: Sequence[str], config: OperatorSettings, clock: Clock, identity: str
) -> kopf.OperatorRegistry:
    """The handlers of an operator watching `namespaces` (none: the whole cluster), configured by
    `config`, on `clock`: the one clock of the operator, given to every collaborator; `identity`: this
    replica's name among its peers, the one kopf.operator is given."""
    handlers = kopf.OperatorRegistry()
    # kopf's default registry logs in through the kubernetes client by itself; ours says so.
    kopf.on.login(registry=handlers)(kopf.login_via_client)

    @kopf.on.startup(registry=handlers)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        apply_settings(settings, config)
        operator_metrics = OperatorMetrics(new_registry())
        operator_metrics.state_store(config.state_store_mode)
        runtime = Runtime(
            KubeApi(api_values_only=True),  # its bodies are made of what the API server sent
            config,
            namespaces,
            operator_account=own_account(),
            tracing=Tracing("agentrun-operator"),  # spans over OTLP with OTEL_EXPORTER_OTLP_ENDPOINT
            operator_metrics=operator_metrics,
            clock=clock,
            identity=identity,
        )
        runtime.start()
        memo.runtime = runtime
        log.info(
            "agentrun operator started: %s; its own ServiceAccount: %s; among its peers: %s",
            config,
            own_account(),
            identity,
        )

    @kopf.on.cleanup(registry=handlers)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        runtime: Runtime | None = getattr(memo, "runtime", None)
        if runtime is not None:
            await runtime.stop()

    @kopf.on.event(GROUP, VERSION, "runs", registry=handlers)
    async def run_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        runtime: Runtime = memo.runtime
        runtime.run_event(dict(event))

    return handlers
