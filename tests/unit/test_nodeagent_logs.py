"""The node agent's containerLogs endpoint: what the kubelet sends for tailLines and limitBytes."""

from __future__ import annotations

from pathlib import Path

from devcluster.nodeagent.logserver import last_lines, selected


def log_file(tmp_path: Path, lines: int, *, last_newline: bool = True) -> Path:
    path = tmp_path / "agent.log"
    text = "".join(f"line {n}\n" for n in range(1, lines + 1))
    path.write_text(text if last_newline else text.rstrip("\n"))
    return path


def test_tail_lines_are_the_last_ones(tmp_path: Path) -> None:
    path = log_file(tmp_path, 5000)

    assert last_lines(path, 2) == b"line 4999\nline 5000\n"
    assert last_lines(path, 0) == b""
    assert last_lines(path, 10_000) == path.read_bytes()


def test_a_last_line_without_its_newline_counts(tmp_path: Path) -> None:
    assert last_lines(log_file(tmp_path, 3, last_newline=False), 1) == b"line 3"


def test_limit_bytes_counts_from_the_start_of_what_is_selected(tmp_path: Path) -> None:
    path = log_file(tmp_path, 10)

    assert selected(path, 2, 6) == b"line 9"
    assert selected(path, None, 7) == b"line 1\n"
    assert selected(tmp_path / "missing.log", 10, None) == b""
