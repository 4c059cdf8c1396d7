"""Which agent namespaces get their principals on the bundled object store, and which lose them.

With the bundled server (versitygw), the operator administers a principal per agent namespace
(agentrun.statestore.principals): `agentrun.<namespace>` gets and puts under the namespace's prefix (the
Secret attempt Pods read), `agentrun.<namespace>.read` only gets (the Secret people read with). A namespace
opts in by labelling its agents' ServiceAccount (agentrun.dev/agent=true); it is taken back when the
namespace is gone (deleted, or being deleted: a Terminating namespace takes no new object and comes
back only as a new namespace). Not when its last labelled ServiceAccount goes: the Secrets and the
principals then still serve the Pods already running and the people reading the namespace's data, and
relabelling must not make new credentials; the namespace is what the principal is limited to, and its
Secrets go with it.

Level-based: each sweep compares what the server holds (its users, and the principals the namespace
buckets' policies name) with the namespaces that exist and the ServiceAccounts opted in, so an operator
that was down while a namespace was deleted takes its principals back at its next sweep.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

PRINCIPAL_PREFIX: Final = "agentrun."
READ_SUFFIX: Final = ".read"


def principal_name(namespace: str, *, read: bool = False) -> str:
    """The access key of a namespace's principal (fixed by namespace and access: a rerun finds it)."""
    return PRINCIPAL_PREFIX + namespace + (READ_SUFFIX if read else "")


def principals_of(namespace: str) -> frozenset[str]:
    return frozenset({principal_name(namespace), principal_name(namespace, read=True)})


def principal_namespace(name: str) -> str | None:
    """The namespace whose principal `name` is, None when it is none of ours (the server's root, an
    administrator's user). A namespace's name is a DNS label (no dot), so the two forms cannot collide."""
    if not name.startswith(PRINCIPAL_PREFIX):
        return None
    rest = name.removeprefix(PRINCIPAL_PREFIX)
    rest = rest.removesuffix(READ_SUFFIX)
    if not rest or "." in rest:
        return None
    return rest


@dataclass(frozen=True)
class ServerPrincipals:
    """What the server holds: its users, the principals granted by statements of their own namespace
    bucket's policy (a statement outlives its user when a take-back was interrupted, and the reverse),
    and `stale` ones a statement still names elsewhere (the one-bucket layout's shared policy): a
    namespace they name is judged (taken back once gone), but they never count as granted."""

    users: frozenset[str]
    granted: frozenset[str]
    stale: frozenset[str] = frozenset()

    def namespaces(self) -> frozenset[str]:
        found = (principal_namespace(name) for name in self.users | self.granted | self.stale)
        return frozenset(n for n in found if n is not None)

    def complete(self, namespace: str) -> bool:
        """Both principals of the namespace are users and granted."""
        wanted = principals_of(namespace)
        return wanted <= self.users and wanted <= self.granted


@dataclass(frozen=True)
class PrincipalPlan:
    """Namespaces whose principals and Secrets are to be made (idempotently), and namespaces whose
    principals are to be taken back (statements out of the policy, then the users deleted)."""

    provision: frozenset[str]
    revoke: frozenset[str]


def plan_principals(
    server: ServerPrincipals,
    *,
    namespaces: Iterable[str],
    opted_in: Iterable[str],
    provisioned: Iterable[str],
    watched: Iterable[str] | None = None,
) -> PrincipalPlan:
    """namespaces: those that exist and are not being deleted (of the watched ones, when the operator
    watches some only); opted_in: those with a ServiceAccount labelled for attempt Pods; provisioned:
    those this replica made since it became active (their Secrets are known there); watched: the
    namespaces this operator watches (None: the cluster). A namespace outside them is never judged: it
    may be another operator's.

    - provision: opted in, existing, and not yet made by this replica or no longer complete on the server
      (a restart makes every opted-in namespace once: a Secret lost meanwhile is made again);
    - revoke: named on the server, within the watched namespaces, and no longer existing."""
    scope = frozenset(watched) if watched is not None else None
    existing = frozenset(namespaces)
    if scope is not None:
        existing &= scope
    made = frozenset(provisioned)
    provision = frozenset(
        n for n in frozenset(opted_in) & existing if n not in made or not server.complete(n)
    )
    judged = server.namespaces() if scope is None else server.namespaces() & scope
    return PrincipalPlan(provision=provision, revoke=judged - existing)
