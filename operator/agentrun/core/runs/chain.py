"""A chain of named rules, evaluated in order: the first rule that returns a Plan decides.

In the style of cert-manager's certificate trigger policies: every rule is a pure function of one input
(the World), so the chain reads as the table of the state machine, one line per rule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agentrun.core.plan import Plan
from agentrun.core.runs.world import World

Policy = Callable[[World], Plan | None]


@dataclass(frozen=True)
class Rule:
    """One line of the table: `when` returns the rule's Plan when the rule applies, else None.

    Unless `upkeep` is False, the writes every reconcile makes anyway (core.runs.upkeep) go first."""

    name: str
    when: Policy
    upkeep: bool = True


@dataclass(frozen=True)
class Chain:
    rules: tuple[Rule, ...]
    upkeep: Callable[[World], Plan]

    def first(self, world: World) -> tuple[Rule, Plan]:
        """The first rule that applies, and its Plan (the upkeep's writes first, when it has them)."""
        for rule in self.rules:
            plan = rule.when(world)
            if plan is None:
                continue
            if rule.upkeep:
                kept = self.upkeep(world)
                plan = Plan([*kept.actions, *plan.actions], plan.requeue_after, plan.lease_expires_in)
            return rule, plan
        raise LookupError("no rule applies: the table's last rule must apply to every World")

    def evaluate(self, world: World) -> Plan:
        return self.first(world)[1]

    @property
    def names(self) -> list[str]:
        return [rule.name for rule in self.rules]
