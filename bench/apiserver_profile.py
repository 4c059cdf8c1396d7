"""Where kube-apiserver's CPU goes for a batch of Runs and for a batch of Jobs: its own pprof CPU profile.

    PYTHONPATH=hack:tests:bench .venv/bin/python bench/apiserver_profile.py --n 600 --out /tmp/apiprof

One instant control plane with profiling on and kube-controller-manager unthrottled (as the Job side of
`make bench`); a batch of N echo Runs, then N Jobs, each profiled from its first create for `--seconds`
(long enough to cover the batch). Writes `<out>/<kind>.pprof` and `<out>/<kind>.top.txt` (`go tool
pprof -top -cum`), so the two can be compared function by function, e.g. with `-focus`.
"""

from __future__ import annotations

import argparse
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import throughput
from harness import Bench, cpu_seconds, load1, log
from run_all import UNTHROTTLED


class Profile(threading.Thread):
    """One /debug/pprof/profile request of `seconds`, written to `path`."""

    def __init__(self, bench: Bench, seconds: int, path: Path) -> None:
        super().__init__(daemon=True)
        self.url = f"{bench.cluster.server}/debug/pprof/profile?seconds={seconds}"
        self.context = bench.cluster.admin_tls()
        self.seconds, self.path = seconds, path

    def run(self) -> None:
        with urllib.request.urlopen(self.url, timeout=self.seconds + 60, context=self.context) as response:
            self.path.write_bytes(response.read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--n", type=int, default=600)
    parser.add_argument(
        "--seconds",
        default="runs=100,jobs=60",
        help="how long to profile each kind from its first create: long enough to cover the batch",
    )
    parser.add_argument("--out", type=Path, default=Path("/tmp/agentrun-apiserver-profile"))
    parser.add_argument("--kinds", default="runs,jobs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    bench = Bench(
        args.out / "state",
        instant=True,
        controller_manager_flags=UNTHROTTLED,
        apiserver_flags=["--profiling=true"],
    )
    try:
        bench.start()
        apiserver = bench.pid("kube-apiserver")
        seconds = {k: int(v) for k, v in (item.split("=") for item in args.seconds.split(","))}
        for kind in args.kinds.split(","):
            ns = bench.namespace(f"prof-{kind}")
            profile = Profile(bench, seconds[kind], args.out / f"{kind}.pprof")
            cpu0, load = cpu_seconds(apiserver), load1()
            profile.start()
            batch = throughput.batch(bench, kind, ns, args.n, timeout=1200)
            profile.join()
            cpu = (cpu_seconds(apiserver) - cpu0) / args.n * 1000
            log(f"{kind}: {batch.summary()} kube-apiserver {cpu:.1f} ms/item, load {load:.1f}")
            time.sleep(5)
    finally:
        bench.stop()
    for kind in args.kinds.split(","):
        path = args.out / f"{kind}.pprof"
        top = subprocess.run(
            ["go", "tool", "pprof", "-top", "-cum", "-nodecount=80", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        (args.out / f"{kind}.top.txt").write_text(top.stdout + top.stderr)
        log(f"{kind}: {args.out / f'{kind}.top.txt'}")


if __name__ == "__main__":
    main()
