"""The agentrun operator as a real process against the test cluster, restartable at will."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .processes import spawn, stop_group


class OperatorProcess:
    def __init__(
        self,
        kubeconfig: Path,
        log_path: Path,
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
        *,
        verbose: bool = True,
        tie_to_parent: bool = True,
    ) -> None:
        """env: added to the environment; args: added to the command line (e.g. ["-n", "ns"]);
        verbose: DEBUG logs (every reconcile), as tests want; benchmarks turn them off;
        tie_to_parent: the operator dies with this process (false for `make operator`, which returns)."""
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.env = dict(env or {})
        self.args = list(args or [])
        self.verbose = verbose
        self.tie_to_parent = tie_to_parent
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.started_at_byte = 0  # where this start's output begins in the (appended) log

    def start(self) -> None:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "AGENTRUN_WORKERS": "8", **self.env}
        self.started_at_byte = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.process = spawn(
            [sys.executable, "-m", "agentrun.operator", *(["--verbose"] if self.verbose else []), *self.args],
            self.log_path,
            env=env,
            tie_to_parent=self.tie_to_parent,
        )
        self.starts += 1

    def kill(self) -> None:
        """SIGKILL: no cleanup, as when a node dies under the operator."""
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        """SIGTERM, and the time a loaded machine may need to shut down cleanly (e.g. to leave the
        peering) before SIGKILL; a clean stop is over long before."""
        if self.process:
            stop_group(self.process.pid, grace_seconds=30)
            self.process = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no operator log)"

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until this start (not an earlier one, whose lines the log keeps) says it has started."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise AssertionError(f"operator exited during start-up:\n{self.log_tail()}")
            with self.log_path.open("rb") as log:
                log.seek(self.started_at_byte)
                if b"agentrun operator started" in log.read():
                    return
            time.sleep(0.1)
        raise AssertionError(f"operator not ready in {timeout}s:\n{self.log_tail()}")
