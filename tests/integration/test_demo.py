"""`make demo` is the main job: it must keep working end to end, and leave nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devcluster.cluster import REPO_ROOT
from support.kube import wait_for

pytestmark = pytest.mark.cluster


def demo(state_dir: Path) -> subprocess.Popen[str]:
    """The demo, started so that Ctrl-C interrupts it as in a terminal. A test run started in the
    background (`cmd &` in a script) ignores SIGINT, and a child inherits an ignored signal; a caught one
    is reset to the default by exec, so SIGINT is caught here while the demo starts."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "hack")}
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "devcluster", "demo", "--state-dir", str(state_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
    finally:
        signal.signal(signal.SIGINT, previous)


def leftovers(state_dir: Path) -> list[str]:
    """Processes whose command line mentions the demo's state directory (etcd, apiserver, agents...)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (proc / "stat").read_text().split(") ", 1)[1][0]
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            if str(state_dir) in cmdline and state != "Z":
                found.append(f"{proc.name}: {cmdline[:120]}")
    return found


# Upper bounds for a loaded machine: the demo starts a control plane and runs every act (the default test
# timeout, 300 s, would cut it short before its own bound).
@pytest.mark.timeout(960)
def test_demo_keeps_its_promises(tmp_path: Path) -> None:
    process = demo(tmp_path)
    out, _ = process.communicate(timeout=900)
    assert process.returncode == 0, out
    for line in (
        "Resume",
        "Accepted",
        "Rejected UnknownRequest",
        "tickets in the external service: ['T-1 [high] Printer on fire']",
        "Cancelled",
        "tickets the service created for this Run: 1",
        "tickets the service created for the LangGraph Run: 1",
        "the timed-out create was found by lookup; sends: 1",
        "tickets closed by the compensation: 1",
        "each superstep ran to its end once: True",
        "documents in the final state: 12 (480134 bytes)",
        "bytes in the object store, sha256",
        "every document read to its end once: True",
        "Done.",
    ):
        assert line in out, f"{line!r} missing from the demo's narration:\n{out}"
    assert leftovers(tmp_path) == []


def test_ctrl_c_leaves_no_process_behind(tmp_path: Path) -> None:
    process = demo(tmp_path)
    assert process.stdout is not None
    deadline = time.monotonic() + 120
    for line in process.stdout:  # interrupt while the Runs are in flight
        if "1. Interrupt and resume" in line or time.monotonic() > deadline:
            break
    os.killpg(process.pid, signal.SIGINT)
    process.communicate(timeout=180)  # it stops each process it started, each with a grace period
    assert process.returncode == 130
    # The demo has stopped what it started; children tied to it by PR_SET_PDEATHSIG die as the kernel gets
    # to them: wait for that (bounded), not for a fixed half second.
    wait_for(lambda: leftovers(tmp_path) == [], timeout=120, what="no process of the demo left")
