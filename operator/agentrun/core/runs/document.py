"""docs/state-machine.md, generated from the Run's table (core.runs.table): its rules in order with what
each says, the rows of the Running and Compensating sub-tables, the rewrites, and a diagram of the moves
the rules declare (checked against the table's decisions by its tests). Writing the file is the dev
tooling's (`make docs`); a drift test holds it in step with the rules."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from agentrun.api import RunPhase
from agentrun.core.runs.chain import ANY_PHASE, Chain, Phases, Rule, SubTable

PATH = "docs/state-machine.md"
NEW = "(new)"


def _doc(function: Callable[..., Any]) -> str:
    """A rule's docstring on one line."""
    return " ".join((function.__doc__ or "").split()).replace("|", "\\|")


def _phases(phases: Phases) -> str:
    if phases == ANY_PHASE:
        return "any"
    listed = [NEW if phase is None else phase.value for phase in [None, *RunPhase] if phase in phases]
    return ", ".join(listed)


def _rules(table: Chain) -> list[str]:
    lines = [
        "| # | Rule | In phases | Moves to | What it says (`condition -> what happens`) |",
        "|---|------|-----------|----------|---------------------------------------------|",
    ]
    for number, rule in enumerate(table.rules, 1):
        moves = ", ".join(phase.value for phase in RunPhase if phase in rule.moves_to) or "-"
        name = f"[{rule.name}](#{rule.name.lower()})" if rule.table else rule.name
        lines.append(f"| {number} | {name} | {_phases(rule.applies_in)} | {moves} | {_doc(rule.when)} |")
    return lines


def _rows(rule: Rule, rows: SubTable) -> list[str]:
    lines = [
        f"### {rule.name}",
        "",
        f"The rows of the {rule.name} rule, tried in order: the first that applies decides (its Transition",
        f"is named `{rule.name}/<row>`).",
        "",
    ]
    # The rows it shares with another sub-table are the methods of one object (core.runs.following),
    # which says what this phase makes of them.
    shared = next(
        (following for row in rows.rows if (following := getattr(row.when, "__self__", None))), None
    )
    if shared is not None:
        shared_rows = ", ".join(
            row.name for row in rows.rows if getattr(row.when, "__self__", None) is shared
        )
        said = _doc(type(shared))
        lines += [f"Rows shared with the other sub-table (core.runs.following): {shared_rows}. {said}", ""]
    lines += ["| # | Row | What it says |", "|---|-----|--------------|"]
    for number, row in enumerate(rows.rows, 1):
        lines.append(f"| {number} | {row.name} | {_doc(row.when)} |")
    return [*lines, ""]


def _state(phase: RunPhase | None) -> str:
    return "[*]" if phase is None else phase.value


def _diagram(table: Chain) -> list[str]:
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for rule in table.rules:
        for source, target in rule.moves:
            edges[(_state(source), _state(target))].append(rule.name)
    lines = ["```mermaid", "stateDiagram-v2"]
    lines += [f"    {a} --> {b}: {', '.join(names)}" for (a, b), names in edges.items()]
    for rewrite in table.rewrites:
        # A rewrite turns the target of any move: drawn as a note on the phase it turns to.
        for target in dict.fromkeys(to for _, to in rewrite.turns):
            turned = " or ".join(a.value for a, to in rewrite.turns if to == target)
            lines += [
                f"    note right of {target.value}",
                f"        {rewrite.name}: a move to {turned} comes here first",
                "    end note",
            ]
    return [*lines, "```"]


def markdown(table: Chain) -> str:
    """The content of docs/state-machine.md for `table`."""
    lines = [
        "<!-- Generated from operator/agentrun/core/runs/table.py by `make docs`: do not edit. -->",
        "",
        "# The Run state machine",
        "",
        "Every reconcile evaluates the rules below in order on what the operator observes now (the World);",
        "the first that applies returns a Transition: the Run's phase change with its reason and message,",
        "what happens to the Attempt, and the other writes, as data. The rewrites then apply to it, and",
        "`render` turns it into the Plan the operator writes, with the consistency the writes need. The",
        "writes every reconcile makes anyway (the upkeep) go first, except for the first two rules.",
        "",
        "## Rules",
        "",
        *_rules(table),
        "",
        "## Rewrites",
        "",
        "Applied to the transition the rule chose (it is then named `<rule>+<rewrite>`):",
        "",
        *[f"- **{rewrite.name}**: {_doc(rewrite.when)}" for rewrite in table.rewrites],
        "",
        "## Sub-tables",
        "",
    ]
    for rule in table.rules:
        if rule.table is not None:
            lines += _rows(rule, rule.table)
    lines += [
        "## Diagram",
        "",
        "The moves the rules declare (`[*]`: a Run not seen yet). A move to the phase a Run is already in",
        "(a grant while Running, another compensation Attempt) is not drawn.",
        "",
        *_diagram(table),
    ]
    return "\n".join(lines) + "\n"
