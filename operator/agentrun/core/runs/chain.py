"""A chain of named rules, evaluated in order: the first rule that returns a Transition decides.

In the style of cert-manager's certificate trigger policies: every rule is a pure function of one input
(the World), so the chain reads as the table of the state machine, one line per rule. After the rule,
the chain's rewrites (each a named row too) may change the transition it chose, in the open: the
compensation a Run's policy asks for before it ends is one.

The chain holds each rule to what it declares: a rule is evaluated only in the phases it applies in (its
body never tests the phase), and a move of the Run's phase that neither the rule nor the rewrite that made
it declares is refused: nothing of that transition is written, the Run keeps its phase, and an Event and
a count (core.plan.RefuseMove) name the rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from agentrun.api import RunPhase
from agentrun.core.plan import Action, Plan, RefuseMove
from agentrun.core.runs.transition import Transition, event, render
from agentrun.core.runs.world import World

Policy = Callable[[World], Transition | None]
# The phases of a Run; None: a Run not seen yet (no phase written).
Phases = frozenset[RunPhase | None]
ANY_PHASE: Phases = frozenset([None, *RunPhase])
Upkeep = Callable[[World], tuple[Action, ...]]


@dataclass(frozen=True)
class Rule:
    """One line of the table: `when` returns the rule's Transition when the rule applies, else None.

    Unless `upkeep` is False, the writes every reconcile makes anyway (core.runs.upkeep) go first."""

    name: str
    when: Policy
    upkeep: bool = True
    # The named rows the rule decides by (the Running and Compensating phases), for the documentation.
    table: SubTable | None = None
    # The phases the rule applies in, and those it moves the Run to (a phase change to the same phase,
    # e.g. a grant while Running, is no move): the diagram of docs/state-machine.md, checked against
    # the decisions of the table's tests.
    applies_in: Phases = ANY_PHASE
    moves_to: frozenset[RunPhase] = field(default_factory=frozenset)
    # The moves it makes, (from, to), when not every phase it applies in moves to every one of moves_to
    # (a control request: a retry moves Failed to Running, a resume InputRequired to Running, ...).
    only: frozenset[tuple[RunPhase | None, RunPhase]] | None = None

    @property
    def moves(self) -> list[tuple[RunPhase | None, RunPhase]]:
        """(from, to) of every move the rule makes, in the order of the phases."""
        order = [None, *RunPhase]
        pairs = [(a, b) for a in order if a in self.applies_in for b in RunPhase if b in self.moves_to]
        return [(a, b) for a, b in pairs if a != b and (self.only is None or (a, b) in self.only)]


def _undeclared(
    name: str,
    source: RunPhase | None,
    chosen: Transition,
    declared: Sequence[tuple[RunPhase | None, RunPhase]],
) -> Transition | None:
    """The refusal of `chosen` when it moves the Run from `source` to a phase that is not among the
    `declared` moves (a phase written again is no move); None when the move is declared."""
    target = chosen.phase
    if target is None or target == source or (source, target) in declared:
        return None
    was = source.value if source is not None else "(none)"
    message = (
        f"the rule {name} moved the Run from {was} to {target.value}, a move it does not declare: "
        "not written; the Run keeps its phase"
    )
    return Transition(rule=name).then(
        event("Warning", "UndeclaredMove", message), RefuseMove(name, was, target.value)
    )


def pairs(sources: Phases, targets: frozenset[RunPhase]) -> frozenset[tuple[RunPhase | None, RunPhase]]:
    """Every move from one of `sources` to one of `targets`."""
    return frozenset((a, b) for a in sources for b in targets)


@dataclass(frozen=True)
class Rewrite:
    """A line applied to the transition a rule chose: `when` returns it changed, or None to leave it."""

    name: str
    when: Callable[[World, Transition], Transition | None]
    # Which phases it turns into which (for the documentation, like Rule.moves_to).
    turns: tuple[tuple[RunPhase, RunPhase], ...] = ()


@dataclass(frozen=True)
class Chain:
    rules: tuple[Rule, ...]
    upkeep: Upkeep
    rewrites: tuple[Rewrite, ...] = ()

    def transition(self, world: World) -> tuple[Rule, Transition]:
        """The first rule that applies in the Run's phase and returns a Transition, and that Transition
        (the upkeep's writes first, when it has them), named by the rule and the rewrites that changed it;
        a Transition that makes a move nobody declared is replaced by its refusal."""
        phase = world.run.status.phase
        for rule in self.rules:
            if phase not in rule.applies_in:
                continue
            chosen = rule.when(world)
            if chosen is None:
                continue
            chosen = replace(chosen, rule=f"{rule.name}/{chosen.rule}" if chosen.rule else rule.name)
            if (refusal := _undeclared(rule.name, phase, chosen, rule.moves)) is not None:
                return rule, refusal
            for rewrite in self.rewrites:
                if (changed := rewrite.when(world, chosen)) is None:
                    continue
                named = replace(changed, rule=f"{chosen.rule}+{rewrite.name}")
                turns = [(chosen.phase, b) for a, b in rewrite.turns if a == chosen.phase]
                if (refusal := _undeclared(named.rule, chosen.phase or phase, named, turns)) is not None:
                    return rule, refusal
                chosen = named
            if rule.upkeep:
                chosen = chosen.after(self.upkeep(world))
            return rule, chosen
        raise LookupError("no rule applies: the table's last rule must apply to every World")

    def first(self, world: World) -> tuple[Rule, Plan]:
        """The first rule that applies, and its Plan."""
        rule, transition = self.transition(world)
        return rule, render(world, transition)

    def evaluate(self, world: World) -> Plan:
        return self.first(world)[1]

    @property
    def names(self) -> list[str]:
        return [rule.name for rule in self.rules]


@dataclass(frozen=True)
class SubTable:
    """The rows of one phase's rule (Running, Compensating), tried in order: the first that applies gives
    the rule's Transition, named after the row."""

    rows: tuple[Rule, ...]

    def decide(self, world: World) -> Transition:
        """The first row that applies (the last row must apply to every World its rule passes on)."""
        for row in self.rows:
            if (chosen := row.when(world)) is not None:
                return replace(chosen, rule=row.name)
        raise LookupError("no row applies: a sub-table's last row must apply to what its rule passes on")

    @property
    def names(self) -> list[str]:
        return [row.name for row in self.rows]
