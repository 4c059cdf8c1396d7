"""One Pod's processes, from start to final deletion, as the kubelet would run its containers."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .kube import in_background, now_rfc3339
from .podenv import ConfigError, command_line, pod_ip, resolve_env

log = logging.getLogger("nodeagent.pod")

MAX_TERMINATION_MESSAGE = 4096
FALLBACK_LOG_BYTES = 2048
DEFAULT_GRACE_SECONDS = 30
_PR_SET_PDEATHSIG = 1


class ContainerProcess(Protocol):
    """A started container, as the runner supervises it: an OS process group here, an asyncio task in the
    instant mode (instant.py). Status reporting never needs to know which."""

    @property
    def container_id(self) -> str: ...
    @property
    def label(self) -> str: ...  # for the Started event, e.g. "pid 1234"
    @property
    def running(self) -> bool: ...
    async def wait(self) -> int: ...  # the exit code as the kubelet reports it (128 + signal)
    def signal(self, sig: signal.Signals) -> None: ...


class ProcessGroup:
    """A container run as a local process, in a process group of its own."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @property
    def container_id(self) -> str:
        return f"process://{self.process.pid}"

    @property
    def label(self) -> str:
        return f"pid {self.process.pid}"

    @property
    def running(self) -> bool:
        return self.process.returncode is None

    async def wait(self) -> int:
        return _exit_code(await self.process.wait())

    def signal(self, sig: signal.Signals) -> None:
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)


class PodHost(Protocol):
    """What a runner needs from the agent: API calls scoped to this node."""

    async def lookup(self, kind: str, namespace: str, name: str) -> dict[str, str] | None: ...
    async def publish_status(self, pod: dict[str, Any], status: dict[str, Any]) -> None: ...
    async def finish_deletion(self, pod: dict[str, Any]) -> None: ...
    async def service_account_kubeconfig(self, pod: dict[str, Any], sandbox: Path) -> Path | None: ...
    async def service_environment(self, pod: dict[str, Any]) -> dict[str, str]: ...
    async def event(self, pod: dict[str, Any], reason: str, message: str, warning: bool = False) -> None: ...


@dataclass
class Restarts:
    """CrashLoopBackOff timing. The real kubelet starts at 10 s; a dev node restarts sooner."""

    initial_seconds: float = 1.0
    max_seconds: float = 30.0
    reset_after_seconds: float = 300.0


@dataclass
class ContainerRun:
    spec: dict[str, Any]
    init: bool = False
    state: dict[str, Any] = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: dict[str, Any] = field(default_factory=dict)
    restart_count: int = 0
    process: ContainerProcess | None = None
    done: bool = False

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    def status(self) -> dict[str, Any]:
        running = "running" in self.state
        return {
            "name": self.name,
            "state": self.state,
            "lastState": self.last_state,
            "ready": running and not self.init,
            "started": running,
            "restartCount": self.restart_count,
            "image": self.spec.get("image") or "process",
            "imageID": "process://devcluster",
            "containerID": self.process.container_id if self.process else "",
        }


def _pdeathsig_kill() -> None:
    # Pod processes die with the agent: a node agent that is gone leaves nothing running behind it.
    ctypes.CDLL("libc.so.6").prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class PodRunner:
    def __init__(self, pod: dict[str, Any], host: PodHost, sandbox: Path, restarts: Restarts) -> None:
        self.pod = pod
        self.host = host
        self.sandbox = sandbox
        self.restarts = restarts
        spec = pod["spec"]
        self.policy: str = spec.get("restartPolicy", "Always")
        self.init_containers = [ContainerRun(c, init=True) for c in spec.get("initContainers") or []]
        self.containers = [ContainerRun(c) for c in spec.get("containers") or []]
        self.start_time = now_rfc3339()
        self.phase = "Pending"
        self.deleting = asyncio.Event()
        self._conditions: dict[str, tuple[str, str]] = {}
        self._changed = asyncio.Event()
        self._finished = False
        self._base_env: dict[str, str] = {}
        self.task: asyncio.Task[None] | None = None

    # ---- entry points used by the agent -------------------------------------------------------------

    def start(self, previous_restarts: int = 0) -> None:
        for c in self.containers:
            c.restart_count = previous_restarts
        self.task = asyncio.create_task(self._run(), name=f"pod {self.key}")

    @property
    def key(self) -> str:
        return f"{self.pod['metadata']['namespace']}/{self.pod['metadata']['name']}"

    def update(self, pod: dict[str, Any]) -> None:
        """A newer version of the Pod. Finished runners stay registered until the Pod is deleted, so a
        late event carrying an older phase can never start the Pod's processes again."""
        self.pod = pod
        if not pod["metadata"].get("deletionTimestamp") or self.deleting.is_set():
            return
        if self.task and self.task.done():
            self.deleting.set()
            # A grace period of 0 (a finished Pod's deletion is one: the API server makes it so) is
            # completed by the API server itself; its DELETED event ends this runner. Deleting it again
            # would only be a 404.
            if pod["metadata"].get("deletionGracePeriodSeconds") != 0:
                in_background(self.host.finish_deletion(pod), f"delete {self.key}")
            return
        grace = pod["metadata"].get("deletionGracePeriodSeconds")
        if grace is None:
            grace = pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
        self.deleting.set()
        in_background(self._stop_processes(float(grace)), f"stop {self.key}")

    def kill_now(self) -> None:
        """The Pod is gone from the API (force-deleted): nothing to report, stop at once."""
        self.deleting.set()
        for c in self._all():
            self._signal(c, signal.SIGKILL)

    # ---- lifecycle -----------------------------------------------------------------------------------

    async def _run(self) -> None:
        publisher = asyncio.create_task(self._publish_loop())
        try:
            if await self._prepare():
                self._set_condition("PodReadyToStartContainers", "True")
                if await self._run_init_containers():
                    self._set_condition("Initialized", "True")
                    await asyncio.gather(*(self._supervise(c) for c in self.containers))
            self.phase = self._terminal_phase()
            self._refresh_readiness()
        except Exception:
            log.exception("pod %s: runner failed", self.key)
            self.phase = "Failed"
        finally:
            # Never cancel a publish in flight: its request would still land, possibly after the final
            # status, and turn a finished Pod back to Running. Let the one publisher drain instead.
            self._finished = True
            self._mark_changed()
            await publisher
        if self.deleting.is_set():
            await self.host.finish_deletion(self.pod)

    async def _prepare(self) -> bool:
        """Sandbox, service-account kubeconfig and the environment every container shares."""
        self.sandbox.mkdir(parents=True, exist_ok=True)
        self._mark_changed()
        delay = 0.05
        while not self.deleting.is_set():
            try:
                kubeconfig = await self.host.service_account_kubeconfig(self.pod, self.sandbox)
                services = await self.host.service_environment(self.pod)
                break
            except Exception as exc:
                # Retried like the kubelet, with a backoff: the API server may be restarting, or its node
                # authorizer may not have seen the Pod's binding yet ("a pod scheduled on a different
                # node"), which a fast node agent meets often and which passes within milliseconds.
                log.warning("pod %s: token request failed: %s", self.key, exc)
                await self._sleep_unless_deleted(delay)
                delay = min(delay * 2, 1.0)
        else:
            return False
        python_bin = str(Path(sys.executable).parent)
        self._base_env = {
            **services,
            "PATH": os.pathsep.join([python_bin, os.environ.get("PATH", "/usr/bin:/bin")]),
            "HOME": str(self.sandbox),
            "HOSTNAME": self.pod["metadata"]["name"],
            "LANG": "C.UTF-8",
        }
        if kubeconfig:
            self._base_env["KUBECONFIG"] = str(kubeconfig)
        return True

    async def _run_init_containers(self) -> bool:
        for c in self.init_containers:
            await self._supervise(c, until_success=True)
            if c.state.get("terminated", {}).get("exitCode") != 0:
                return False
        return True

    async def _supervise(self, c: ContainerRun, until_success: bool = False) -> None:
        backoff = self.restarts.initial_seconds
        while not self.deleting.is_set():
            started = time.monotonic()
            exit_code = await self._run_once(c)
            if exit_code is None or self.deleting.is_set():
                break
            wants_restart = self.policy == "Always" and not until_success
            wants_restart |= self.policy != "Never" and exit_code != 0
            if not wants_restart:
                break
            if time.monotonic() - started > self.restarts.reset_after_seconds:
                backoff = self.restarts.initial_seconds
            c.last_state, c.restart_count = c.state, c.restart_count + 1
            c.state = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off {backoff:g}s restarting failed container={c.name} pod={self.key}",
                }
            }
            self._refresh_readiness()
            await self.host.event(
                self.pod, "BackOff", f"Back-off restarting container {c.name}", warning=True
            )
            await self._sleep_unless_deleted(backoff)
            backoff = min(backoff * 2, self.restarts.max_seconds)
        c.done = True

    async def _run_once(self, c: ContainerRun) -> int | None:
        """Runs the container's process to its end; None when it could not be started."""
        termination_path = self.sandbox / f"{c.name}.termination-log"
        termination_path.write_text("")
        while True:
            try:
                env = {**self._base_env, **await resolve_env(self.pod, c.spec, self.host.lookup)}
                env["TERMINATION_MESSAGE_PATH"] = str(termination_path)
                argv = command_line(c.spec, env)
                break
            except ConfigError as exc:  # retried, like the kubelet, until fixed or deleted
                c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
                self._mark_changed()
                await self.host.event(self.pod, "Failed", f"Error: {exc}", warning=True)
                await self._sleep_unless_deleted(2.0)
                if self.deleting.is_set():
                    return None
        log_path = self.sandbox / f"{c.name}.log"
        try:
            c.process = await self._spawn(c, argv, env, log_path)
        except OSError as exc:
            c.state = {"terminated": _terminated(128, "StartError", str(exc), now_rfc3339(), now_rfc3339())}
            self._mark_changed()
            return 128
        started_at = now_rfc3339()
        c.state = {"running": {"startedAt": started_at}}
        if not c.init:
            self.phase = "Running"  # as the kubelet reports it: once a container has started
        self._refresh_readiness()
        await self.host.event(self.pod, "Started", f"Started container {c.name} ({c.process.label})")
        exit_code = await c.process.wait()
        message = _termination_message(termination_path, log_path, c.spec, exit_code)
        reason = "Completed" if exit_code == 0 else "Error"
        c.state = {"terminated": _terminated(exit_code, reason, message, started_at, now_rfc3339(), c=c)}
        self._refresh_readiness()
        return exit_code

    async def _spawn(
        self, c: ContainerRun, argv: list[str], env: dict[str, str], log_path: Path
    ) -> ContainerProcess:
        """Starts the container's command (OSError: it could not be started)."""
        with log_path.open("ab") as out:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                cwd=c.spec.get("workingDir") or str(self.sandbox),
                start_new_session=True,
                preexec_fn=_pdeathsig_kill,
            )
        return ProcessGroup(process)

    async def _stop_processes(self, grace_seconds: float) -> None:
        running = [c for c in self._all() if c.process and c.process.running]
        for c in running:
            await self.host.event(self.pod, "Killing", f"Stopping container {c.name}")
            self._signal(c, signal.SIGTERM)
        exits = [asyncio.ensure_future(c.process.wait()) for c in running if c.process]
        if exits:
            await asyncio.wait(exits, timeout=grace_seconds)
        for c in running:
            self._signal(c, signal.SIGKILL)

    # ---- status --------------------------------------------------------------------------------------

    def _terminal_phase(self) -> str:
        codes = [c.state.get("terminated", {}).get("exitCode") for c in self.containers]
        init_failed = any(
            c.state.get("terminated", {}).get("exitCode") not in (0, None) for c in self.init_containers
        )
        if not init_failed and codes and all(code == 0 for code in codes):
            return "Succeeded"
        return "Failed"

    def _refresh_readiness(self) -> None:
        ready = bool(self.containers) and all("running" in c.state for c in self.containers)
        self._set_condition("ContainersReady", "True" if ready else "False")
        self._set_condition("Ready", "True" if ready else "False")
        self._mark_changed()

    def _set_condition(self, kind: str, value: str) -> None:
        if self._conditions.get(kind, ("", ""))[0] != value:
            self._conditions[kind] = (value, now_rfc3339())
        self._mark_changed()

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "phase": self.phase,
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": pod_ip(self.pod),
            "podIPs": [{"ip": pod_ip(self.pod)}],
            "startTime": self.start_time,
            "conditions": [
                {"type": kind, "status": value, "lastTransitionTime": since}
                for kind, (value, since) in self._conditions.items()
            ],
            "containerStatuses": [c.status() for c in self.containers],
        }
        if self.init_containers:
            status["initContainerStatuses"] = [c.status() for c in self.init_containers]
        return status

    def _mark_changed(self) -> None:
        self._changed.set()

    async def _publish_loop(self) -> None:
        """The only sender of this Pod's status, so updates reach the API server in order."""
        while not (self._finished and not self._changed.is_set()):
            await self._changed.wait()
            await self._publish()

    async def _publish(self) -> None:
        """Sends the latest status; a coalescing loop, so a burst of changes becomes few requests."""
        self._changed.clear()
        for _ in range(20):
            try:
                await self.host.publish_status(self.pod, self.status())
                return
            except Exception as exc:
                if getattr(exc, "status", None) == 404:
                    return  # the Pod is gone
                log.warning("pod %s: status update failed: %s", self.key, exc)
                await asyncio.sleep(0.5)

    # ---- helpers -------------------------------------------------------------------------------------

    def _all(self) -> list[ContainerRun]:
        return [*self.init_containers, *self.containers]

    @staticmethod
    def _signal(c: ContainerRun, sig: signal.Signals) -> None:
        if c.process:
            c.process.signal(sig)

    async def _sleep_unless_deleted(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.deleting.wait(), timeout=seconds)


def _terminated(
    exit_code: int,
    reason: str,
    message: str,
    started_at: str,
    finished_at: str,
    *,
    c: ContainerRun | None = None,
) -> dict[str, Any]:
    state: dict[str, Any] = {
        "exitCode": exit_code,
        "reason": reason,
        "startedAt": started_at,
        "finishedAt": finished_at,
    }
    if exit_code > 128:
        state["signal"] = exit_code - 128
    if message:
        state["message"] = message
    if c and c.process:
        state["containerID"] = c.process.container_id
    return state


def _termination_message(path: Path, log_path: Path, spec: dict[str, Any], exit_code: int) -> str:
    try:
        message = path.read_bytes()[:MAX_TERMINATION_MESSAGE].decode(errors="replace")
    except FileNotFoundError:
        message = ""
    fallback = spec.get("terminationMessagePolicy") == "FallbackToLogsOnError"
    if not message.strip() and fallback and exit_code != 0:
        with contextlib.suppress(FileNotFoundError):
            message = log_path.read_bytes()[-FALLBACK_LOG_BYTES:].decode(errors="replace")
    return message
