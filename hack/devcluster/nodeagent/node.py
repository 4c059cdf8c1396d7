"""Registering the Node and keeping it Ready: a heartbeat Lease and periodic status, as the kubelet does."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from kubernetes.client.rest import ApiException

from .kube import Kube, now_micro, now_rfc3339

log = logging.getLogger("nodeagent.node")

LEASE_NAMESPACE = "kube-node-lease"


@dataclass
class NodeSettings:
    name: str
    cpu: str = "32"
    memory: str = "128Gi"
    pods: str = "2000"
    lease_duration_seconds: int = 40
    renew_interval_seconds: float = 10.0
    status_interval_seconds: float = 60.0
    kubelet_port: int = 0  # where the containerLogs endpoint listens (0: not served)


def _conditions(ready: bool) -> list[dict[str, Any]]:
    now = now_rfc3339()
    pressure = [
        {
            "type": kind,
            "status": "False",
            "reason": f"KubeletHasNo{kind}" if kind != "PIDPressure" else "KubeletHasSufficientPID",
            "message": "process node agent does not track resource pressure",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        for kind in ("MemoryPressure", "DiskPressure", "PIDPressure")
    ]
    return [
        *pressure,
        {
            "type": "Ready",
            "status": "True" if ready else "False",
            "reason": "KubeletReady" if ready else "KubeletNotReady",
            "message": "process node agent is posting ready status",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        },
    ]


class NodeHeartbeat:
    def __init__(self, kube: Kube, settings: NodeSettings, version: str) -> None:
        self.kube = kube
        self.settings = settings
        self.version = version
        self.uid = ""

    def _status(self) -> dict[str, Any]:
        s = self.settings
        resources = {"cpu": s.cpu, "memory": s.memory, "pods": s.pods, "ephemeral-storage": "100Gi"}
        return {
            "capacity": resources,
            "allocatable": resources,
            "conditions": _conditions(ready=True),
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": s.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": s.kubelet_port}},
            "nodeInfo": {
                "machineID": s.name,
                "systemUUID": s.name,
                "bootID": s.name,
                "kernelVersion": "",
                "osImage": "agentrun process node",
                "containerRuntimeVersion": "process://devcluster",
                "kubeletVersion": self.version,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    async def register(self) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.settings.name,
                "labels": {
                    "kubernetes.io/hostname": self.settings.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "agentrun.dev/process-node": "true",
                },
            },
        }
        try:
            node = await self.kube.call_dict(self.kube.core.create_node, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            node = await self.kube.call_dict(self.kube.core.read_node, self.settings.name)
        self.uid = node["metadata"]["uid"]
        await self.post_status()
        await self.renew_lease()

    async def post_status(self) -> None:
        await self.kube.call(
            self.kube.core.patch_node_status,
            self.settings.name,
            {"status": self._status()},
        )

    async def renew_lease(self) -> None:
        s = self.settings
        spec = {
            "holderIdentity": s.name,
            "leaseDurationSeconds": s.lease_duration_seconds,
            "renewTime": now_micro(),
        }
        try:
            await self.kube.call(
                self.kube.coordination.patch_namespaced_lease,
                s.name,
                LEASE_NAMESPACE,
                {"spec": spec},
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            owner = {"apiVersion": "v1", "kind": "Node", "name": s.name, "uid": self.uid}
            body = {
                "metadata": {"name": s.name, "namespace": LEASE_NAMESPACE, "ownerReferences": [owner]},
                "spec": spec,
            }
            await self.kube.call(self.kube.coordination.create_namespaced_lease, LEASE_NAMESPACE, body)

    async def run(self) -> None:
        since_status = 0.0
        while True:
            await asyncio.sleep(self.settings.renew_interval_seconds)
            since_status += self.settings.renew_interval_seconds
            try:
                await self.renew_lease()
                if since_status >= self.settings.status_interval_seconds:
                    since_status = 0.0
                    await self.post_status()
            except Exception as exc:  # keep beating: the API server may be restarting
                log.warning("heartbeat failed: %s", exc)
