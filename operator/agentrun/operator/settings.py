"""Operator settings that matter at scale, chosen on purpose (see README: Operator settings)."""

from __future__ import annotations

import base64
import json
import logging
import os
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kopf

from agentrun.api import StateStoreMode
from agentrun.clock import Clock
from agentrun.core.identity import Account
from agentrun.core.pods import StateStorePodEnv
from agentrun.core.store_buckets import per_namespace, with_namespace_buckets
from agentrun.rbac import STATE_STORE_SECRET


@dataclass(frozen=True)
class OperatorSettings:
    # Reconcile concurrency: Runs are independent, writes are preconditioned; 8 keeps a 2-core API
    # server busy without queueing requests behind each other.
    workers: int = 8
    # kopf's per-object watch-event workers: unbounded by default; a cap protects memory with many Runs.
    event_workers: int = 200
    # How long such a worker waits for its object's next event before exiting (kopf: 5 s). With the cap,
    # every object seen holds a worker that long, so kopf takes in at most event_workers / this many new
    # objects per second per kind (5 s: 40 Runs/s). A restart's listing arrives faster than that, and
    # kopf holds every listed Run not yet taken in, whole: at 0.5 s, 7,500 of 10,000 Runs (+220 MiB
    # RSS, kept by the allocator). At 0.05 s kopf keeps up with its own listing. (Not 0: kopf's
    # wait_for with no timeout left cancels the get before it runs, so a worker would never see an event
    # already queued.)
    event_worker_idle_seconds: float = 0.05
    # Re-list periodically even if the watch stream looks healthy (guards against silent stalls).
    watch_timeout_seconds: int = 300
    # kopf lists each kind in pages of this many objects (kopf: all at once). A single page of 10,000
    # Runs is ~100 MB of Python objects at once, and the allocator keeps that peak as RSS for good.
    list_chunk_size: int = 500
    # kopf posts Kubernetes Events for its own handler outcomes; we post our own meaningful ones.
    post_kopf_events: bool = False
    # One active replica; standbys take over when its peering heartbeat stops (needs the peering CRDs).
    peering: str | None = None
    priority: int = 0
    # How long a replica's peering heartbeat counts (kopf's default is 60 s): a replica that dies without
    # saying goodbye is replaced by a standby this long after its last heartbeat.
    peering_lifetime: int = 60
    # Prometheus metrics on 0.0.0.0:<port>/metrics; 0 turns them off.
    metrics_port: int = 8000
    # Notifications (CloudEvents) when a Run waits for a person: the sinks a Run may name in
    # spec.notify.sink (any other is refused: no request forgery through the operator), the sink told
    # when a Run names none, the console whose Run pages they link to, and how long a delivery is retried.
    notify_sinks: tuple[str, ...] = ()
    notify_default_sink: str | None = None
    console_url: str | None = None
    notify_retry_seconds: float = 3600.0
    # The agent-state store (docs/state-store.md): its URL (unset: all state stays inline), told to
    # attempt Pods, and the name of the Secret in each agent namespace holding that namespace's own
    # credentials for it (the Pods take them through secretKeyRef).
    state_store_url: str | None = None
    state_store_secret: str = STATE_STORE_SECRET
    # The store is the bundled server (versitygw, as the local control plane and the chart run it) and
    # the operator holds its root credentials: each opted-in namespace gets its principals, its bucket
    # and its Secrets from the operator (operator.store_credentials; the URL gains `buckets=namespace`).
    # Elsewhere an administrator provides the Secrets (and the buckets, with `buckets=namespace`).
    state_store_provision: bool = False
    # No store, on purpose (AGENTRUN_STATE_STORE_INLINE=true: the chart's stateStore.url empty and
    # stateStore.bundled.enabled false): said at start-up as a choice; without it, an operator with no
    # store warns that it has none.
    state_store_inline: bool = False
    # ... and takes them back once their namespace is gone: a sweep of the server's principals against
    # the namespaces every interval (and whenever an opted-in ServiceAccount appears or goes).
    state_store_principal_sweep_seconds: float = 300.0
    # A finished Run's time to live when its spec.ttlSecondsAfterFinished is unset (None: kept), and how
    # long its archive stays in the store after it (None: kept; docs/state-store.md, "Archives of
    # finished Runs").
    ttl_seconds_after_finished: int | None = None
    archive_retention_seconds: int | None = None
    # The one collector (docs/state-store.md, "Collection"): a sweep of the store every interval (0: no
    # collection); a blob must be older than the grace period before it is marked, and stay unreferenced
    # that long again before it is quarantined (far longer than any upload: StoreTimeouts allow about a
    # minute); a quarantined blob is deleted for good after the quarantine period.
    state_store_gc_interval_seconds: float = 600.0
    state_store_gc_grace_seconds: float = 3600.0
    state_store_gc_quarantine_seconds: float = 86400.0

    @property
    def state_store_mode(self) -> StateStoreMode:
        """Where agent state is kept: the bundled server, a store of the deployer's, or inline."""
        if self.state_store_url is None:
            return StateStoreMode.INLINE
        return StateStoreMode.BUNDLED if self.state_store_provision else StateStoreMode.EXTERNAL

    def state_store_said(self) -> tuple[int, str]:
        """The start-up log line that says where agent state is kept, and its level: a warning when there
        is no store and nobody said that is meant."""
        mode = self.state_store_mode
        if mode == StateStoreMode.BUNDLED:
            return logging.INFO, (
                f"state store: {mode.value}, the bundled server at {self.state_store_url}: each opted-in "
                f"namespace gets its bucket and its Secrets {self.state_store_secret} and "
                f"{self.state_store_secret}-read from this operator"
            )
        if mode == StateStoreMode.EXTERNAL:
            return logging.INFO, (
                f"state store: {mode.value}, {self.state_store_url}: each agent namespace needs the Secret "
                f"{self.state_store_secret} (its own credentials), which an administrator provides"
            )
        if self.state_store_inline:
            return logging.INFO, (
                f"state store: {mode.value}, as configured (AGENTRUN_STATE_STORE_INLINE=true): agent state "
                "stays in the cluster within its byte budgets, finished Runs are never archived"
            )
        return logging.WARNING, (
            f"state store: {mode.value}: no AGENTRUN_STATE_STORE_URL, so agent state stays in the cluster "
            "within its byte budgets and finished Runs are never archived; configure a store (the chart "
            "installs its bundled one unless stateStore.bundled.enabled=false), or set "
            "AGENTRUN_STATE_STORE_INLINE=true to say that this is meant"
        )

    def state_store_pod_env(self) -> StateStorePodEnv | None:
        """What attempt Pods are told about the state store; None when none is configured."""
        if not self.state_store_url:
            return None
        return StateStorePodEnv(self.state_store_url, self.state_store_secret)

    def __post_init__(self) -> None:
        if self.state_store_inline and self.state_store_url:
            raise ValueError(
                "AGENTRUN_STATE_STORE_INLINE=true says there is no state store, but AGENTRUN_STATE_STORE_URL "
                "names one: set one of them"
            )
        if self.state_store_provision and self.state_store_url and not per_namespace(self.state_store_url):
            # The bundled server keeps a bucket per namespace (agentrun.core.store_buckets): its URL says so.
            object.__setattr__(self, "state_store_url", with_namespace_buckets(self.state_store_url))
        if self.event_worker_idle_seconds <= 0:
            raise ValueError("event_worker_idle_seconds must be above 0 (see its comment)")
        if self.state_store_principal_sweep_seconds <= 0:
            raise ValueError("state_store_principal_sweep_seconds must be above 0")
        if self.state_store_gc_interval_seconds < 0:
            raise ValueError("AGENTRUN_STATE_STORE_GC_INTERVAL_SECONDS must be 0 (no collection) or more")
        if self.state_store_gc_grace_seconds <= 0 or self.state_store_gc_quarantine_seconds <= 0:
            raise ValueError("the state store collector's grace and quarantine periods must be above 0 s")

    @classmethod
    def from_env(cls, auto_priority: int) -> OperatorSettings:
        """The settings the environment gives; `auto_priority` is the priority AGENTRUN_PRIORITY=auto
        stands for (settings.auto_priority, computed once at start-up)."""
        env = os.environ.get
        return cls(
            workers=int(env("AGENTRUN_WORKERS", cls.workers)),
            event_workers=int(env("AGENTRUN_EVENT_WORKERS", cls.event_workers)),
            event_worker_idle_seconds=float(
                env("AGENTRUN_EVENT_WORKER_IDLE_SECONDS", cls.event_worker_idle_seconds)
            ),
            watch_timeout_seconds=int(env("AGENTRUN_WATCH_TIMEOUT_SECONDS", cls.watch_timeout_seconds)),
            list_chunk_size=int(env("AGENTRUN_LIST_CHUNK_SIZE", cls.list_chunk_size)),
            peering=env("AGENTRUN_PEERING") or None,
            priority=_priority(env("AGENTRUN_PRIORITY", str(cls.priority)), auto_priority),
            peering_lifetime=int(env("AGENTRUN_PEERING_LIFETIME", cls.peering_lifetime)),
            metrics_port=int(env("AGENTRUN_METRICS_PORT", cls.metrics_port)),
            notify_sinks=tuple(_sinks(env("AGENTRUN_NOTIFY_SINKS", ""))),
            notify_default_sink=_sink(env("AGENTRUN_NOTIFY_DEFAULT_SINK", "")) or None,
            console_url=env("AGENTRUN_CONSOLE_URL") or None,
            notify_retry_seconds=float(env("AGENTRUN_NOTIFY_RETRY_SECONDS", cls.notify_retry_seconds)),
            state_store_url=_store_url(env("AGENTRUN_STATE_STORE_URL", "")),
            state_store_secret=env("AGENTRUN_STATE_STORE_SECRET", "").strip() or cls.state_store_secret,
            state_store_provision=_provision(env("AGENTRUN_STATE_STORE_PROVISION", "")),
            state_store_inline=_flag("AGENTRUN_STATE_STORE_INLINE", env("AGENTRUN_STATE_STORE_INLINE", "")),
            state_store_principal_sweep_seconds=float(
                env("AGENTRUN_STATE_STORE_PRINCIPAL_SWEEP_SECONDS", cls.state_store_principal_sweep_seconds)
            ),
            ttl_seconds_after_finished=_seconds(env("AGENTRUN_TTL_SECONDS_AFTER_FINISHED", ""), minimum=-1),
            archive_retention_seconds=_seconds(env("AGENTRUN_ARCHIVE_RETENTION_SECONDS", ""), minimum=0),
            state_store_gc_interval_seconds=float(
                env("AGENTRUN_STATE_STORE_GC_INTERVAL_SECONDS", cls.state_store_gc_interval_seconds)
            ),
            state_store_gc_grace_seconds=float(
                env("AGENTRUN_STATE_STORE_GC_GRACE_SECONDS", cls.state_store_gc_grace_seconds)
            ),
            state_store_gc_quarantine_seconds=float(
                env("AGENTRUN_STATE_STORE_GC_QUARANTINE_SECONDS", cls.state_store_gc_quarantine_seconds)
            ),
        )


def auto_priority(clock: Clock, chance: random.Random) -> int:
    """kopf pauses every replica that sees a live peer of the same priority, so the replicas of one
    Deployment (which share their environment) need distinct priorities: AGENTRUN_PRIORITY=auto derives
    one from this process's start time (`clock` read once, at start-up), so the longest-running replica
    stays active and newer ones stand by. The values are negative: a replica started with an explicit
    priority (0 and up) always takes precedence. (Milliseconds with a random tie-breaker: distinct, and
    exact as a JSON number in any client.)"""
    milliseconds = int(clock.now().timestamp() * 1000)
    return -(milliseconds * 1000 + chance.randrange(1000))


def _sinks(value: str) -> list[str]:
    """AGENTRUN_NOTIFY_SINKS: URLs separated by commas or white space."""
    return [sink for part in value.replace(",", " ").split() if (sink := _sink(part))]


def _sink(value: str) -> str:
    value = value.strip()
    if not value:
        return value
    if not value.startswith(("http://", "https://")):
        raise ValueError(f"a notification sink is an http(s) URL, not {value!r}")
    if "@" in value.split("/", 3)[2]:
        raise ValueError("a notification sink URL carries no credentials (they would show in logs)")
    return value


def _provision(value: str) -> bool:
    """AGENTRUN_STATE_STORE_PROVISION: `versitygw` (the bundled server) or unset."""
    value = value.strip()
    if value not in ("", "versitygw"):
        raise ValueError(f"AGENTRUN_STATE_STORE_PROVISION is `versitygw` (the bundled server), not {value!r}")
    return value == "versitygw"


def _flag(name: str, value: str) -> bool:
    """A true/false setting; empty: false."""
    value = value.strip().lower()
    if value not in ("", "true", "false"):
        raise ValueError(f"{name} is true or false, not {value!r}")
    return value == "true"


def _store_url(value: str) -> str | None:
    """AGENTRUN_STATE_STORE_URL, checked at start-up: malformed, unknown or with credentials: refused."""
    from agentrun.statestore import parse_store_url  # noqa: PLC0415 (only when a store is configured)

    value = value.strip()
    if not value:
        return None
    parse_store_url(value)
    return value


def _seconds(value: str, *, minimum: int) -> int | None:
    """A number of seconds from the environment; empty: None (unset)."""
    value = value.strip()
    if not value:
        return None
    seconds = int(value)
    if seconds < minimum:
        raise ValueError(f"a number of seconds of at least {minimum} was expected, not {value!r}")
    return seconds


def _priority(value: str, auto: int) -> int:
    return auto if value.strip().lower() == "auto" else int(value)


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf's diff base, off: only on.event handlers exist, which get no diff, so the deep copy of every
    Run body that kopf's default storage makes per event (and the annotation it would write) buys
    nothing."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


class NoProgress(kopf.ProgressStorage):
    """kopf's handler progress, off: event handlers are not retried by kopf (errors are the work
    queue's), so there is no progress to keep."""

    def fetch(self, *, key: Any, body: kopf.Body) -> kopf.ProgressRecord | None:
        return None

    def store(self, *, key: Any, record: kopf.ProgressRecord, body: kopf.Body, patch: kopf.Patch) -> None:
        return None

    def purge(self, *, key: Any, body: kopf.Body, patch: kopf.Patch) -> None:
        return None

    def touch(self, *, body: kopf.Body, patch: kopf.Patch, value: str | None) -> None:
        return None

    def clear(self, *, essence: kopf.BodyEssence) -> kopf.BodyEssence:
        return essence


def apply_settings(settings: kopf.OperatorSettings, config: OperatorSettings) -> None:
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.persistence.progress_storage = NoProgress()
    settings.queueing.worker_limit = config.event_workers
    settings.queueing.idle_timeout = config.event_worker_idle_seconds
    settings.watching.server_timeout = config.watch_timeout_seconds
    settings.watching.client_timeout = config.watch_timeout_seconds + 30
    settings.watching.chunk_size = config.list_chunk_size or None
    if not config.post_kopf_events:
        settings.posting.level = logging.CRITICAL
    settings.peering.standalone = config.peering is None
    if config.peering:
        settings.peering.name = config.peering
        settings.peering.priority = config.priority
        settings.peering.lifetime = config.peering_lifetime
        settings.peering.mandatory = True


SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def own_account(
    env: Mapping[str, str] | None = None, token_dir: Path = SERVICE_ACCOUNT_DIR
) -> Account | None:
    """The operator's own ServiceAccount, which attempt Pods must never run as: AGENTRUN_SERVICE_ACCOUNT
    (the chart sets it from the downward API) in AGENTRUN_SERVICE_ACCOUNT_NAMESPACE or the token's
    namespace; else the subject of the mounted token; None when the operator runs with another identity
    (a user's kubeconfig, as in the tests)."""
    env = os.environ if env is None else env
    name, namespace = env.get("AGENTRUN_SERVICE_ACCOUNT"), env.get("AGENTRUN_SERVICE_ACCOUNT_NAMESPACE")
    if name:
        namespace = namespace or _read(token_dir / "namespace")
        if not namespace:
            raise ValueError("AGENTRUN_SERVICE_ACCOUNT is set but its namespace is not known")
        return Account(namespace, name)
    token = _read(token_dir / "token")
    if not token or token.count(".") != 2:
        return None
    # The claims are only read here (the API server verified the token); sub names the account.
    payload = token.split(".")[1]
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except ValueError:
        return None
    parts = str(claims.get("sub", "")).split(":")
    if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"]:
        return Account(parts[2], parts[3])
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None
