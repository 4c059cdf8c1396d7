"""What every command gets: the cluster namespace it works in, where printed commands act, the output,
the clock."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from agentrun.cli.cluster import Cluster
from agentrun.cli.hints import Target
from agentrun.cli.output import Output
from agentrun.clock import Clock


@dataclass
class Context:
    cluster: Cluster
    out: Output
    kubeconfig: str | None = None
    context: str | None = None
    target: Target | None = None  # None: the cluster's namespace, the current context

    @property
    def clock(self) -> Clock:
        """The command's one clock: the cluster's (its waits are measured on it too)."""
        return self.cluster.clock

    def now(self) -> datetime:
        return self.clock.now()

    @property
    def namespace(self) -> str:
        return self.cluster.namespace

    @property
    def where(self) -> Target:
        """Where printed commands must act: this command's namespace (and context, kubeconfig)."""
        return self.target or Target(self.namespace)

    def command(self, *words: str) -> str:
        """A command to print, e.g. ctx.command("report", name): it carries -n and, when chosen, the
        context and kubeconfig."""
        return self.where.command(*words)
