"""The chaos run (`make chaos`, bench/chaos.py) in its small profile: its own control plane, ticket service
and operator, about 30 faults of every kind against 20 ticket-agent Runs, and every invariant at 0; an
Unknown outcome among them resolved by the harness as a person (the path `make chaos` depends on)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from devcluster.processes import spawn

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]


# Upper bounds for a loaded machine (the harness's own waits end as soon as the Runs got there).
@pytest.mark.timeout(1560)
def test_small_chaos_profile_breaks_no_promise(tmp_path: Path) -> None:
    report_path, log_path = tmp_path / "report.json", tmp_path / "chaos.log"
    paths = [
        str(REPO / "hack"),
        str(REPO / "tests"),
        *filter(None, os.environ.get("PYTHONPATH", "").split(":")),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    argv = [sys.executable, str(REPO / "bench" / "chaos.py"), "--profile", "small", "--seed", "7"]
    argv += ["--state-dir", str(tmp_path / "state"), "--report", str(report_path)]
    # Its own process group, tied to this one: an interrupted test session leaves no control plane behind.
    process = spawn(argv, log_path, env=env, tie_to_parent=True)
    try:
        code = process.wait(timeout=1500)
    except subprocess.TimeoutExpired:
        process.terminate()  # the harness stops what it started on SIGTERM
        process.wait(timeout=60)
        raise
    finally:
        out = log_path.read_text(errors="replace")
    assert report_path.exists(), f"the chaos run did not finish (exit {code}):\n{out}"
    report = json.loads(report_path.read_text())
    assert report["invariants"] == dict.fromkeys(report["invariants"], 0), out
    assert code == 0, out
    # The faults really happened: the small profile's minimum (Profile.min_faults, min_kinds), which the
    # harness keeps its window open and a Run to come for, however slow the machine.
    assert report["faultsTotal"] >= 15, out
    assert len(report["faults"]) >= 6, out
    assert {"restart-apiserver", "restart-operator", "kill-during-create-lookups-down"} <= set(
        report["faults"]
    ), out
    # The resolve path ran: the lookups-down kill's Run stopped unable to tell, and the harness resolved
    # its Unknown SideEffect as the person it is (its own user name, which admission checks): accepted.
    assert report["resolutions"]["by"], out
    assert report["resolutions"]["accepted"] >= 1, out
