"""What every command gets: the cluster namespace it works in, the output, the clock."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from agentrun.cli.cluster import Cluster
from agentrun.cli.output import Output


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Context:
    cluster: Cluster
    out: Output
    kubeconfig: str | None = None
    now: Callable[[], datetime] = field(default=utc_now)

    @property
    def namespace(self) -> str:
        return self.cluster.namespace
