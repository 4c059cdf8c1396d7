"""docs/state-machine.md is generated from the Run's table: it cannot disagree with the rules."""

from __future__ import annotations

from pathlib import Path

from agentrun.core.runs import TABLE
from agentrun.core.runs.document import PATH, markdown

REPO = Path(__file__).resolve().parents[2]


def test_the_committed_state_machine_doc_matches_the_rules() -> None:
    committed = (REPO / PATH).read_text()
    assert committed == markdown(TABLE), f"out of date (run `make docs`): {PATH}"


def test_every_row_of_a_sub_table_says_its_transition() -> None:
    """Like the table's rules: each row's docstring says `condition -> what happens`."""
    tables = [rule.table for rule in TABLE.rules if rule.table is not None]
    assert [rule.name for rule in TABLE.rules if rule.table] == ["Compensating", "Running"]
    for table in tables:
        assert len(set(table.names)) == len(table.names)
        for row in table.rows:
            assert row.when.__doc__ is not None and " -> " in row.when.__doc__, row.name


def test_the_diagram_draws_the_declared_moves_and_the_rewrites() -> None:
    doc = markdown(TABLE)

    assert "    [*] --> Running: ForkStart, FirstAttempt" in doc
    assert "        CompensateFirst: a move to Cancelled or Failed comes here first" in doc
    assert "    Running --> RetryBackoff: Running" in doc
