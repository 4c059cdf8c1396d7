"""The commands the plugin suggests: each names the namespace (and the context or kubeconfig when they
are not the defaults), so pasting it acts on the same Run, never on a namesake elsewhere."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

# Words a hint may leave for the reader to fill in (an answer, a reference): printed as they are.
PLACEHOLDERS = re.compile(r"^[A-Z][A-Z_]*$")


@dataclass(frozen=True)
class Target:
    """Where a command acted: the namespace, and the context and kubeconfig only when the user chose
    them (a context other than the kubeconfig's current one, a kubeconfig other than the default)."""

    namespace: str
    context: str | None = None
    kubeconfig: str | None = None

    def flags(self) -> list[str]:
        flags = ["-n", self.namespace]
        if self.context:
            flags += ["--context", self.context]
        if self.kubeconfig:
            flags += ["--kubeconfig", self.kubeconfig]
        return flags

    def command(self, *words: str) -> str:
        """`kubectl agentrun WORDS -n NS [--context C] [--kubeconfig K]`, quoted for a POSIX shell."""
        quoted = [w if PLACEHOLDERS.match(w) else shlex.quote(w) for w in (*words, *self.flags())]
        return " ".join(["kubectl", "agentrun", *quoted])


def target_of(namespace: str | None, context: str | None = None, kubeconfig: str | None = None) -> Target:
    return Target(namespace or "default", context, kubeconfig)


__all__ = ["Target", "target_of"]
