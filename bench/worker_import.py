"""How long an attempt Pod's `import agentrun.worker` takes, and what it loads.

    .venv/bin/python bench/worker_import.py [--runs 15] [--module agentrun.worker]

Each run is a fresh interpreter (`python -X importtime -c 'import agentrun.worker'`), as every Attempt,
every resume after a hold and every retry starts one. agentrun's own modules are byte-compiled first,
as an installed wheel has them (pip compiles on install; a source tree under PYTHONDONTWRITEBYTECODE
would otherwise compile them at every start). Reported: the import's cumulative time as -X importtime
measures it and the interpreter's whole wall time (start-up included), min and median over the runs (the
minimum is the idle machine's figure: load only ever adds), the same import's CPU time, and the heaviest
top-level packages it loaded. Not part of the tests: a time depends on the machine.
"""

from __future__ import annotations

import argparse
import compileall
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "operator" / "agentrun"
LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")
CPU = "import time; c = time.process_time(); import {m}; print(time.process_time() - c)"


def one_run(module: str) -> tuple[float, float, float, Counter[str]]:
    """(import ms by -X importtime, wall ms of the whole interpreter, import CPU ms, self µs by package)."""
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = (time.perf_counter() - start) * 1000
    cumulative, by_package = 0.0, Counter[str]()
    for line in out.stderr.splitlines():
        if match := LINE.match(line):
            own, total, _, name = match.groups()
            by_package[name.split(".")[0]] += int(own)
            if name == module:
                cumulative = int(total) / 1000
    cpu = subprocess.run(
        [sys.executable, "-c", CPU.format(m=module)], capture_output=True, text=True, check=True
    )
    return cumulative, wall, float(cpu.stdout) * 1000, by_package


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--module", default="agentrun.worker")
    args = parser.parse_args()
    compileall.compile_dir(str(PACKAGE), quiet=1)
    runs = [one_run(args.module) for _ in range(args.runs)]
    for label, values in (
        (f"import {args.module} (-X importtime)", [r[0] for r in runs]),
        ("python -c 'import ...' wall time", [r[1] for r in runs]),
        ("the import's CPU time", [r[2] for r in runs]),
    ):
        print(f"{label:45} min {min(values):7.1f} ms   median {statistics.median(values):7.1f} ms")
    fastest = min(runs, key=lambda r: r[0])[3]
    total = sum(fastest.values())
    print("heaviest packages (own import time, fastest run):")
    for package, micros in fastest.most_common(12):
        print(f"  {package:28} {micros / 1000:6.1f} ms  {100 * micros / total:4.1f} %")


if __name__ == "__main__":
    main()
