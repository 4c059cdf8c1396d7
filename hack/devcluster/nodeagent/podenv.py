"""A container's environment, resolved the way the kubelet resolves it.

Supports literal values with $(VAR) expansion, fieldRef (the downward API), secretKeyRef,
configMapKeyRef and envFrom, and the variables of the Services in the Pod's namespace
(service_environment). Anything else is a configuration error reported on the container, as the kubelet
reports CreateContainerConfigError.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Awaitable, Callable
from typing import Any

Pod = dict[str, Any]
# (kind "secret" | "configmap", namespace, name) -> the object's data, or None when it does not exist
DataLookup = Callable[[str, str, str], Awaitable[dict[str, str] | None]]

_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_MAP_FIELD = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


class ConfigError(Exception):
    """The container cannot start because its configuration cannot be resolved."""


def expand(value: str, env: dict[str, str]) -> str:
    """$(VAR) becomes VAR's value when defined earlier; $$ escapes a dollar; unknown refs stay as written."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _VAR_REF.sub(replace, value)


def pod_ip(pod: Pod) -> str:
    """The Pod's own loopback address, 127.x.y.z derived from its uid: Pods of this node share the host's
    network, so a Pod that listens binds its own address (the chart's listenAddress=$(POD_IP)) and two
    replicas on one port do not clash, as Pods with IPs of their own do not on a real node."""
    uid = str(pod.get("metadata", {}).get("uid") or "")
    if not uid:
        return "127.0.0.1"
    n = int(hashlib.sha256(uid.encode()).hexdigest()[:6], 16)
    return f"127.{1 + n % 254}.{(n >> 8) % 256}.{1 + (n >> 16) % 254}"


def field_value(pod: Pod, path: str) -> str:
    meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    if m := _MAP_FIELD.match(path):
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.hostIP": status.get("hostIP", "127.0.0.1"),
        "status.podIP": status.get("podIP") or pod_ip(pod),
    }
    if path not in simple:
        raise ConfigError(f"fieldRef {path!r} is not supported by the process node agent")
    return str(simple[path] or "")


async def _key_ref(ref: dict[str, Any], kind: str, namespace: str, lookup: DataLookup) -> str | None:
    data = await lookup(kind, namespace, ref["name"])
    optional = bool(ref.get("optional", False))
    if data is None:
        if optional:
            return None
        raise ConfigError(f'{kind} "{ref["name"]}" not found')
    if ref["key"] not in data:
        if optional:
            return None
        raise ConfigError(f"couldn't find key {ref['key']} in {kind} {namespace}/{ref['name']}")
    return data[ref["key"]]


async def resolve_env(pod: Pod, container: dict[str, Any], lookup: DataLookup) -> dict[str, str]:
    namespace = pod["metadata"]["namespace"]
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        kind, ref = (
            ("configmap", source.get("configMapRef"))
            if "configMapRef" in source
            else (
                "secret",
                source.get("secretRef"),
            )
        )
        if not ref:
            continue
        data = await lookup(kind, namespace, ref["name"])
        if data is None:
            if ref.get("optional"):
                continue
            raise ConfigError(f'{kind} "{ref["name"]}" not found')
        env.update({prefix + k: v for k, v in data.items()})
    for var in container.get("env") or []:
        name = var["name"]
        if "valueFrom" not in var:
            env[name] = expand(var.get("value", ""), env)
            continue
        source = var["valueFrom"]
        value: str | None
        if "fieldRef" in source:
            value = field_value(pod, source["fieldRef"]["fieldPath"])
        elif "secretKeyRef" in source:
            value = await _key_ref(source["secretKeyRef"], "secret", namespace, lookup)
        elif "configMapKeyRef" in source:
            value = await _key_ref(source["configMapKeyRef"], "configmap", namespace, lookup)
        else:
            raise ConfigError(
                f"env {name}: valueFrom {sorted(source)} is not supported by the process node agent"
            )
        if value is not None:
            env[name] = value
    return env


def service_environment(services: list[dict[str, Any]]) -> dict[str, str]:
    """<NAME>_SERVICE_HOST and <NAME>_SERVICE_PORT (and _PORT_<PORT NAME>) of each Service with a selector
    and a cluster IP, as the kubelet sets them for the Services of a Pod's namespace. There is no kube-proxy
    here and every Pod shares this machine's network, so they name 127.0.0.1 and the port the backing Pod
    listens on (targetPort, when a number), where a real node names the cluster IP and the Service's port.
    The API server's own Service is left out: Pods reach it through their kubeconfig."""
    env: dict[str, str] = {}
    for service in services:
        meta, spec = service.get("metadata", {}), service.get("spec", {})
        if (meta.get("namespace"), meta.get("name")) == ("default", "kubernetes"):
            continue
        if not spec.get("selector") or spec.get("clusterIP") in (None, "", "None"):
            continue
        ports = [(p.get("name"), p.get("targetPort", p.get("port"))) for p in spec.get("ports") or []]
        ports = [(name, target) for name, target in ports if isinstance(target, int)]
        if not ports:
            continue
        prefix = str(meta["name"]).upper().replace("-", "_")
        env[f"{prefix}_SERVICE_HOST"] = "127.0.0.1"
        env[f"{prefix}_SERVICE_PORT"] = str(ports[0][1])
        for name, target in ports:
            if name:
                env[f"{prefix}_SERVICE_PORT_{str(name).upper().replace('-', '_')}"] = str(target)
    return env


def decode_secret(data: dict[str, str] | None) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in (data or {}).items()}


def command_line(container: dict[str, Any], env: dict[str, str]) -> list[str]:
    """command + args with $(VAR) expansion. There are no images, so there is no image entrypoint."""
    command = container.get("command") or []
    if not command:
        raise ConfigError(
            f"container {container['name']!r} has no command: the process node agent runs no images, "
            "so every container must say what to run"
        )
    return [expand(part, env) for part in [*command, *(container.get("args") or [])]]
