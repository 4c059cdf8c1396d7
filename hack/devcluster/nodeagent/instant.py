"""The node agent's instant mode: Pods without OS processes, for benchmarks at scale.

`python -m devcluster.nodeagent --instant` (or `LocalCluster(instant=True)`) keeps everything a PodRunner
does (sandbox, service-account token and kubeconfig, env resolution with the downward API, Pod status,
exit codes and termination messages, deletion with a grace period) and replaces only the start of a
container's process:

- A container whose command is `python -m agentrun.examples.<agent>` runs its Attempt inside the node
  agent's process, as an asyncio task: the agent function is imported from the module, the worker SDK's
  Identity is built from the container's resolved env, and the SDK talks to the real API server with the
  Pod's own service-account kubeconfig (so RBAC applies as to a process). The task runs exactly what
  `worker.main` runs in a Pod's process (`attempt_exit_code`): read the Run and Attempt, renew the Lease,
  watch for a cancel, run the agent, commit fenced, write the termination message, give the exit code.
  Pod deletion (SIGTERM) cancels the Attempt as the SDK's signal handler would; SIGKILL (the end of the
  grace period, a force-deletion) cancels the task, reported as exit code 137.
- Any other container (e.g. the Pods of Kubernetes Jobs) completes at once with exit code 0: the same
  instant mode for the Job pods, so the two can be compared without process start-up in either.

Not for agents that end their own process (os._exit, os.kill(os.getpid(), ...)): in-process, that would
end the node agent. Process start-up (~0.3 s of Python imports per Pod) is what the instant mode leaves
out; everything between the Pod and the API server stays real.
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import logging
import signal
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from .runner import ContainerRun, PodRunner

log = logging.getLogger("nodeagent.instant")

AGENT_MODULE_PREFIX = "agentrun.examples."
SDK_THREADS = 4  # the SDK's request threads per in-process Attempt (a process gets 16)
_ids = itertools.count(1)


def agent_module(argv: list[str]) -> str | None:
    """The module of `python -m agentrun.examples.<agent>` (python, python3, /path/to/python3.11 ...)."""
    if len(argv) != 3 or argv[1] != "-m" or not argv[2].startswith(AGENT_MODULE_PREFIX):
        return None
    return argv[2] if Path(argv[0]).name.startswith("python") else None


class InstantContainer:
    """A started container that is a task of the node agent's loop (see ContainerProcess)."""

    def __init__(self, work: Coroutine[Any, Any, int], what: str) -> None:
        self.id = next(_ids)
        self.what = what
        self.killed = False
        self.task: asyncio.Task[int] = asyncio.create_task(work, name=f"instant {self.id}")
        self.on_term: Callable[[], None] | None = None

    @property
    def container_id(self) -> str:
        return f"instant://{self.id}"

    @property
    def label(self) -> str:
        return f"instant mode: {self.what}"

    @property
    def running(self) -> bool:
        return not self.task.done()

    async def wait(self) -> int:
        try:
            code = await asyncio.shield(self.task)
        except asyncio.CancelledError:
            if not self.task.done():
                raise  # the waiter was cancelled, not the container
            code = 0
        return 128 + signal.SIGKILL if self.killed else code

    def signal(self, sig: signal.Signals) -> None:
        if not self.running:
            return
        if sig == signal.SIGTERM and self.on_term is not None:
            self.on_term()
            return
        if sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
            self.killed = True
            self.task.cancel()


async def _completed() -> int:
    return 0


class InstantRunner(PodRunner):
    """A PodRunner whose containers start as InstantContainers; everything else is the PodRunner's."""

    async def _spawn(
        self, c: ContainerRun, argv: list[str], env: dict[str, str], log_path: Path
    ) -> InstantContainer:
        module = agent_module(argv)
        if module is None:
            with log_path.open("a") as out:
                out.write(f"instant mode: completed without running {argv!r}\n")
            return InstantContainer(_completed(), "completed at once")
        return await _attempt(module, env)


async def _attempt(module: str, env: dict[str, str]) -> InstantContainer:
    # Imported here: the node agent itself never needs agentrun, only the instant mode does.
    from agentrun.kubeapi import KubeApi, load_configuration  # noqa: PLC0415
    from agentrun.worker.blobs import open_state_store  # noqa: PLC0415
    from agentrun.worker.identity import Identity  # noqa: PLC0415
    from agentrun.worker.main import attempt_exit_code  # noqa: PLC0415
    from agentrun.worker.session import Session  # noqa: PLC0415

    kubeconfig = env.get("KUBECONFIG")
    try:
        loaded = importlib.import_module(module)
        agent = loaded.agent
        # What the module's `worker.main(agent, compensations=..., lookups=...)` would register.
        registered = {
            "compensations": getattr(loaded, "COMPENSATIONS", None),
            "lookups": getattr(loaded, "LOOKUPS", None),
        }
        if not kubeconfig:
            raise ValueError("the Pod has no service-account kubeconfig (automountServiceAccountToken)")
        me = Identity.from_env(env)
        state_store = open_state_store(env)  # with the container's own credentials, not the node's
        api = KubeApi(load_configuration(kubeconfig), threads=SDK_THREADS)
    except Exception as exc:  # reported as the kubelet reports a container that cannot start
        raise OSError(f"instant mode: cannot start {module}: {exc}") from exc
    session = Session(api, me, state_store=state_store)

    async def work() -> int:
        try:
            return await attempt_exit_code(agent, session, stop_on_sigterm=False, **registered)
        finally:
            api.close()

    container = InstantContainer(work(), f"{module} in the node agent's process")
    container.on_term = session.terminating.set  # what the SDK's SIGTERM handler does in a process
    return container
