"""Operator settings that matter at scale, chosen on purpose (see README: Operator settings)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import kopf


@dataclass(frozen=True)
class OperatorSettings:
    # Reconcile concurrency: Runs are independent, writes are preconditioned; 8 keeps a 2-core API
    # server busy without queueing requests behind each other.
    workers: int = 8
    # kopf's per-object watch-event workers: unbounded by default; a cap protects memory with many Runs.
    event_workers: int = 200
    # Re-list periodically even if the watch stream looks healthy (guards against silent stalls).
    watch_timeout_seconds: int = 300
    # kopf posts Kubernetes Events for its own handler outcomes; we post our own meaningful ones.
    post_kopf_events: bool = False
    # One active replica; standbys take over when its peering heartbeat stops (needs the peering CRDs).
    peering: str | None = None
    priority: int = 0

    @classmethod
    def from_env(cls) -> OperatorSettings:
        env = os.environ.get
        return cls(
            workers=int(env("AGENTRUN_WORKERS", cls.workers)),
            event_workers=int(env("AGENTRUN_EVENT_WORKERS", cls.event_workers)),
            watch_timeout_seconds=int(env("AGENTRUN_WATCH_TIMEOUT_SECONDS", cls.watch_timeout_seconds)),
            peering=env("AGENTRUN_PEERING") or None,
            priority=int(env("AGENTRUN_PRIORITY", cls.priority)),
        )


def apply_settings(settings: kopf.OperatorSettings, config: OperatorSettings) -> None:
    settings.batching.worker_limit = config.event_workers
    settings.watching.server_timeout = config.watch_timeout_seconds
    settings.watching.client_timeout = config.watch_timeout_seconds + 30
    if not config.post_kopf_events:
        settings.posting.level = logging.CRITICAL
    settings.peering.standalone = config.peering is None
    if config.peering:
        settings.peering.name = config.peering
        settings.peering.priority = config.priority
        settings.peering.mandatory = True
