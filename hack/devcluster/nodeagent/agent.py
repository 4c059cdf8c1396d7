"""The node agent's loop: watch the Pods bound to this Node and give each one a PodRunner."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from ..kubeconfig import write_kubeconfig
from .instant import InstantRunner
from .kube import Kube, in_background, now_rfc3339
from .logserver import ContainerLogServer
from .node import NodeHeartbeat, NodeSettings
from .podenv import decode_secret, service_environment
from .runner import PodRunner, Restarts

log = logging.getLogger("nodeagent")

TOKEN_SECONDS = 24 * 3600
TERMINAL = ("Succeeded", "Failed")


class _Gone(Exception):
    """The watch's resourceVersion is too old (410): list again."""


class NodeAgent:
    def __init__(
        self,
        kube: Kube,
        settings: NodeSettings,
        state_dir: Path,
        restarts: Restarts,
        *,
        instant: bool = False,
        log_tls: tuple[Path, Path, Path] | None = None,
    ) -> None:
        """instant: run Pods in the instant mode (instant.py) instead of as local processes; log_tls: the
        serving certificate, its key and the client CA of the containerLogs endpoint (logserver.py)."""
        self.kube = kube
        self.runner_class: type[PodRunner] = InstantRunner if instant else PodRunner
        self.settings = settings
        self.state_dir = state_dir
        self.restarts = restarts
        self.runners: dict[str, PodRunner] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self._stopping = threading.Event()
        self.logs = ContainerLogServer(self.container_log, *log_tls) if log_tls else None

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        version = (
            await self.kube.call_dict(
                self.kube.api_client.call_api,
                "/version",
                "GET",
                response_type="object",
                _return_http_data_only=True,
            )
        ).get("gitVersion", "v0.0.0")
        if self.logs is not None:  # before the Node says where its kubelet endpoint is
            self.settings.kubelet_port = await self.logs.start()
            log.info("serving container logs on port %d", self.settings.kubelet_port)
        heartbeat = NodeHeartbeat(self.kube, self.settings, version)
        await heartbeat.register()
        log.info("node %s registered and Ready (kubelet version %s)", self.settings.name, version)
        threading.Thread(target=self._watch_pods, name="pod-watch", daemon=True).start()
        beat = asyncio.create_task(heartbeat.run())
        try:
            while True:
                kind, pod = await self._events.get()
                self._dispatch(kind, pod)
        finally:
            beat.cancel()
            self._stopping.set()
            for runner in self.runners.values():
                runner.kill_now()

    # ---- watch ---------------------------------------------------------------------------------------

    def _watch_pods(self) -> None:
        """Blocking list+watch in a thread (the client is synchronous); events go to the loop as plain
        JSON, never through the client's models (see Kube). A broken stream resumes after its last event."""
        selector = f"spec.nodeName={self.settings.name}"
        resource_version = ""
        while not self._stopping.is_set():
            try:
                if not resource_version:
                    listing = self.kube.get_json(
                        self.kube.core.list_pod_for_all_namespaces, field_selector=selector
                    )
                    resource_version = listing["metadata"]["resourceVersion"]
                    self._emit("SYNC", {"items": listing["items"]})
                for kind, obj in self._events_from(selector, resource_version):
                    resource_version = obj["metadata"]["resourceVersion"]
                    if kind != "BOOKMARK":
                        self._emit(kind, obj)
            except _Gone:
                resource_version = ""  # too old: list again
            except ApiException as exc:
                log.warning("pod watch failed: %s", exc)
                self._stopping.wait(1.0)
            except Exception as exc:
                log.warning("pod watch interrupted: %s", exc)
                self._stopping.wait(1.0)

    def _events_from(self, selector: str, resource_version: str) -> Iterator[tuple[str, dict[str, Any]]]:
        """The events of one watch request from `resource_version` (the server ends it within 300 s)."""
        response = self.kube.core.list_pod_for_all_namespaces(
            field_selector=selector,
            resource_version=resource_version,
            watch=True,
            timeout_seconds=300,
            allow_watch_bookmarks=True,
            _preload_content=False,
        )
        try:
            for line in iter_resp_lines(response):
                event = json.loads(line)
                if event["type"] == "ERROR":
                    status = event["object"]
                    if status.get("code") == 410:
                        raise _Gone
                    raise ApiException(status=status.get("code"), reason=status.get("message"))
                yield event["type"], event["object"]
        finally:
            response.close()  # a stream left half read must not go back to the pool as it is
            response.release_conn()

    def _emit(self, kind: str, obj: dict[str, Any]) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._events.put_nowait, (kind, obj))

    def _dispatch(self, kind: str, pod: dict[str, Any]) -> None:
        if kind == "SYNC":
            seen = {p["metadata"]["uid"] for p in pod["items"]}
            for uid in [u for u in self.runners if u not in seen]:
                self.runners.pop(uid).kill_now()
            for item in pod["items"]:
                self._dispatch("MODIFIED", item)
            return
        uid = pod["metadata"]["uid"]
        if kind == "DELETED":
            if runner := self.runners.pop(uid, None):
                runner.kill_now()
            shutil.rmtree(self._sandbox(pod), ignore_errors=True)
            return
        if runner := self.runners.get(uid):
            runner.update(pod)
            return
        phase = pod.get("status", {}).get("phase")
        if phase in TERMINAL:
            return
        if pod["metadata"].get("deletionTimestamp"):
            # Nothing of ours runs for it (e.g. created while we were down): finish the deletion.
            in_background(self.finish_deletion(pod), f"delete {uid}")
            return
        runner = self.runner_class(pod, self, self._sandbox(pod), self.restarts)
        self.runners[uid] = runner
        # A Pod that already ran under an earlier agent lost its processes with that agent.
        previous = max(
            (c.get("restartCount", 0) for c in pod.get("status", {}).get("containerStatuses") or []),
            default=-1,
        )
        if phase == "Running" and pod["spec"].get("restartPolicy", "Always") == "Never":
            in_background(self._fail_lost_pod(runner), f"lost {uid}")
            return
        runner.start(previous_restarts=previous + 1 if phase == "Running" else 0)

    async def _fail_lost_pod(self, runner: PodRunner) -> None:
        for c in runner.containers:
            c.state = {
                "terminated": {
                    "exitCode": 137,
                    "reason": "ContainerLost",
                    "message": "the node agent restarted and this container's process ended with it",
                    "startedAt": runner.start_time,
                    "finishedAt": now_rfc3339(),
                }
            }
        runner.phase = "Failed"
        await self.publish_status(runner.pod, runner.status())

    def container_log(
        self, namespace: str, name: str, container: str
    ) -> tuple[Path, Callable[[], bool]] | None:
        """A container's log file on this node and whether it may still grow; None if there is no such
        container here (a Pod deleted takes its sandbox, and its logs, with it)."""
        for runner in self.runners.values():
            if runner.key != f"{namespace}/{name}":
                continue
            for c in [*runner.init_containers, *runner.containers]:
                if c.name == container:
                    return runner.sandbox / f"{c.name}.log", lambda c=c: not c.done
        return None

    def _sandbox(self, pod: dict[str, Any]) -> Path:
        return self.state_dir / "pods" / str(pod["metadata"]["uid"])

    # ---- PodHost: what runners ask of the API ------------------------------------------------------

    async def lookup(self, kind: str, namespace: str, name: str) -> dict[str, str] | None:
        try:
            if kind == "secret":
                secret = await self.kube.call_dict(self.kube.core.read_namespaced_secret, name, namespace)
                return decode_secret(secret.get("data")) | dict(secret.get("stringData") or {})
            config_map = await self.kube.call_dict(self.kube.core.read_namespaced_config_map, name, namespace)
            return dict(config_map.get("data") or {})
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def service_environment(self, pod: dict[str, Any]) -> dict[str, str]:
        if pod.get("spec", {}).get("enableServiceLinks") is False:
            return {}
        listed = await self.kube.call_dict(
            self.kube.core.list_namespaced_service, pod["metadata"]["namespace"]
        )
        return service_environment(listed.get("items") or [])

    async def publish_status(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        meta = pod["metadata"]
        await self.kube.call(
            self.kube.core.patch_namespaced_pod_status,
            meta["name"],
            meta["namespace"],
            {"metadata": {"uid": meta["uid"]}, "status": status},
        )

    async def finish_deletion(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
        try:
            await self.kube.call(
                self.kube.core.delete_namespaced_pod, meta["name"], meta["namespace"], body=body
            )
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    async def service_account_kubeconfig(self, pod: dict[str, Any], sandbox: Path) -> Path | None:
        """A kubeconfig for the Pod's service account, from a TokenRequest bound to this Pod."""
        spec, meta = pod["spec"], pod["metadata"]
        if spec.get("automountServiceAccountToken") is False:
            return None
        account = spec.get("serviceAccountName") or "default"
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": TOKEN_SECONDS,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            },
        }
        response = await self.kube.call_dict(
            self.kube.core.create_namespaced_service_account_token, account, meta["namespace"], request
        )
        token_file = sandbox / "serviceaccount" / "token"
        token_file.parent.mkdir(parents=True, exist_ok=True)
        token_file.write_text(response["status"]["token"])
        token_file.chmod(0o600)
        return write_kubeconfig(
            sandbox / "serviceaccount" / "kubeconfig",
            self.kube.server,
            Path(self.kube.ca_file),
            f"system:serviceaccount:{meta['namespace']}:{account}",
            token_file=token_file,
            namespace=meta["namespace"],
        )

    async def event(self, pod: dict[str, Any], reason: str, message: str, warning: bool = False) -> None:
        meta = pod["metadata"]
        body = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "reason": reason,
            "message": message,
            "type": "Warning" if warning else "Normal",
            "source": {"component": "kubelet", "host": self.settings.name},
            "firstTimestamp": now_rfc3339(),
            "lastTimestamp": now_rfc3339(),
            "count": 1,
        }
        try:
            await self.kube.call(self.kube.core.create_namespaced_event, meta["namespace"], body)
        except ApiException as exc:  # events are best effort, as in the kubelet
            log.debug("event not recorded: %s", exc)
