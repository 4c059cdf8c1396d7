"""Writes docs/state-machine.md from the Run's table (agentrun.core.runs.document); `--check` writes
nothing and exits 1 when the file is out of date."""

from __future__ import annotations

import sys
from pathlib import Path

from agentrun.core.runs import TABLE
from agentrun.core.runs.document import PATH, markdown


def main(argv: list[str]) -> int:
    target = Path(__file__).resolve().parent.parent / PATH
    content = markdown(TABLE)
    current = target.read_text() if target.is_file() else None
    if "--check" in argv:
        if current != content:
            print(f"out of date: {PATH} (run `make docs`)", file=sys.stderr)
            return 1
        return 0
    if current != content:
        target.write_text(content)
        print(f"wrote {PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
