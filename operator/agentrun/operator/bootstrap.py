"""What the operator makes sure of before kopf starts: its API is served, and its peering object exists.

A Helm install creates the CRDs and the Deployment together, so the operator may start before the API
server serves agentrun.dev; in namespace-scoped mode kopf scans the API only once at start-up, so it
must not start early. With peering (several replicas, one active), kopf needs the KopfPeering
(namespace-scoped mode: one in each watched namespace) or ClusterKopfPeering object to exist: kopf never
creates it, and without it every replica would stay paused. The CRDs of those objects are defined here,
the single source for the Helm chart and the plain manifests.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final
from urllib.parse import quote

from agentrun.api import GROUP, VERSION
from agentrun.api.peering import AGENTRUN_PLURALS, PEERING_GROUP, PEERING_VERSION
from agentrun.clock import Clock
from agentrun.kubeapi import ApiError, KubeApi, served_resources

log = logging.getLogger("agentrun.operator")

LOG_EVERY_SECONDS: Final = 10.0


async def wait_until_served(
    api: KubeApi, group_version: str, plurals: Sequence[str], clock: Clock, interval: float = 1.0
) -> None:
    """Waits (forever, logging every 10 s) until the API server serves every plural of group_version."""
    last_log = clock.monotonic()
    while True:
        missing = set(plurals) - await served_resources(api, group_version)
        if not missing:
            return
        if clock.monotonic() - last_log >= LOG_EVERY_SECONDS:
            log.warning(
                "waiting for the API server to serve %s %s: are the CRDs installed?",
                group_version,
                ", ".join(sorted(missing)),
            )
            last_log = clock.monotonic()
        await clock.sleep(interval)


def peering_object(name: str, namespace: str | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/part-of": "agentrun"}}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": f"{PEERING_GROUP}/{PEERING_VERSION}",
        "kind": "KopfPeering" if namespace else "ClusterKopfPeering",
        "metadata": metadata,
    }


async def ensure_peering(api: KubeApi, name: str, namespaces: Sequence[str]) -> None:
    """Creates the peering object kopf will use (in every watched namespace, or cluster-wide)."""
    base = f"/apis/{PEERING_GROUP}/{PEERING_VERSION}"
    targets: list[tuple[str, str | None]] = [
        (f"{base}/namespaces/{quote(namespace)}/kopfpeerings", namespace) for namespace in namespaces
    ]
    targets = targets or [(f"{base}/clusterkopfpeerings", None)]
    for collection, namespace in targets:
        try:
            await api.create(collection, peering_object(name, namespace))
            log.info("created the peering object %s in %s", name, namespace or "the cluster")
        except ApiError as exc:
            if not exc.conflict:
                raise


async def prepare(api: KubeApi, namespaces: Sequence[str], peering: str | None, clock: Clock) -> None:
    """Everything that must hold before kopf starts (see the module docstring)."""
    await wait_until_served(api, f"{GROUP}/{VERSION}", AGENTRUN_PLURALS, clock)
    if peering:
        plural = "kopfpeerings" if namespaces else "clusterkopfpeerings"
        await wait_until_served(api, f"{PEERING_GROUP}/{PEERING_VERSION}", [plural], clock)
        await ensure_peering(api, peering, namespaces)
