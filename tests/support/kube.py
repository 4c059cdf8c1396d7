"""Test-side access to the local control plane: kubectl, API clients and polling."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client, config

T = TypeVar("T")


class Timeout(AssertionError):
    pass


def wait_for(
    probe: Callable[[], T | None], timeout: float = 120.0, interval: float = 0.1, what: str = ""
) -> T:
    """Polls probe until it returns something truthy; fails the test with `what` after timeout seconds.

    The timeout is an upper bound for a heavily loaded machine (Pods started as processes, an operator
    and a control plane sharing two CPUs), never the thing a test measures: callers pass at least the
    default when they wait on the cluster or the operator."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise Timeout(f"timed out after {timeout}s waiting for {what or probe!r}; last value: {last!r}")


# A person the tests stand in for: the API server checks that a field naming a person names the user who
# writes it, so a test that writes "alice" writes as alice (impersonated by the cluster's admin).
PERSON = "alice"
# What an impersonated person may do: everything, as the admin (RBAC is not what those tests are about).
ADMINS = ("system:masters",)


@dataclass
class Kube:
    kubeconfig: Path
    kubectl_path: Path
    user: str | None = None  # impersonated (with the groups in ADMINS), None: the kubeconfig's own

    def __post_init__(self) -> None:
        self.api_client = config.new_client_from_config(config_file=str(self.kubeconfig))
        if self.user is not None:
            self.api_client.set_default_header("Impersonate-User", self.user)
            self.api_client.set_default_header("Impersonate-Group", ADMINS[0])
        self.core = client.CoreV1Api(self.api_client)
        self.apps = client.AppsV1Api(self.api_client)
        self.coordination = client.CoordinationV1Api(self.api_client)
        self.rbac = client.RbacAuthorizationV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)
        self.extensions = client.ApiextensionsV1Api(self.api_client)

    def impersonating(self, user: str = PERSON) -> Kube:
        """The same cluster as the person `user` (with the admin's permissions), as `kubectl --as`."""
        return Kube(self.kubeconfig, self.kubectl_path, user)

    def with_token(self, token: str) -> Kube:
        """The same cluster as another identity: a kubeconfig with `token` and no client certificate."""
        config_doc = yaml.safe_load(self.kubeconfig.read_text())
        config_doc["users"][0]["user"] = {"token": token}
        path = self.kubeconfig.with_name(f"token-{abs(hash(token))}.kubeconfig")
        path.write_text(yaml.safe_dump(config_doc))
        return Kube(path, self.kubectl_path)

    def account_kubeconfig(self, namespace: str, account: str) -> Path:
        """A kubeconfig that authenticates as the ServiceAccount `account` of `namespace` (a token for 10
        minutes), with `namespace` as its context's namespace."""
        token = self.core.create_namespaced_service_account_token(
            account, namespace, {"spec": {"expirationSeconds": 600}}
        ).status.token
        config_doc = yaml.safe_load(self.kubeconfig.read_text())
        config_doc["users"] = [{"name": account, "user": {"token": token}}]
        config_doc["contexts"][0]["context"].update(user=account, namespace=namespace)
        path = self.kubeconfig.parent / f"{account}-{namespace}.kubeconfig"
        path.write_text(yaml.safe_dump(config_doc))
        return path

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, namespace: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        argv = [str(self.kubectl_path), f"--kubeconfig={self.kubeconfig}"]
        if self.user is not None:
            argv += [f"--as={self.user}", *(f"--as-group={group}" for group in ADMINS)]
        if namespace:
            argv.append(f"--namespace={namespace}")
        result = subprocess.run([*argv, *args], input=input, capture_output=True, text=True, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        result = self.kubectl("get", kind, name, "-o", "json", namespace=namespace, check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr:
                return None
            raise AssertionError(result.stderr)
        obj: dict[str, Any] = json.loads(result.stdout)
        return obj

    def apply(self, manifest: str, namespace: str) -> None:
        self.kubectl("apply", "-f", "-", input=manifest, namespace=namespace)

    def pod(self, name: str, namespace: str) -> dict[str, Any] | None:
        return self.get("pod", name, namespace)

    def wait_pod_phase(
        self, name: str, namespace: str, phases: tuple[str, ...], timeout: float = 120
    ) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            pod = self.pod(name, namespace)
            return pod if pod and pod.get("status", {}).get("phase") in phases else None

        return wait_for(probe, timeout, what=f"pod {namespace}/{name} in {phases}")
