"""kopf's peering objects (kopf.dev/v1) as agentrun installs them, and the plurals of agentrun's own kinds.

With several operator replicas, one active, kopf coordinates through a KopfPeering (namespace-scoped
mode: one in each watched namespace) or ClusterKopfPeering object; kopf never installs their CRDs. They
are declared here, beside the models, so that the chart generator (agentrun.deploy) installs and checks
them without importing the operator runtime, and the operator's start-up (agentrun.operator.bootstrap)
waits for them to be served.
"""

from __future__ import annotations

from typing import Any, Final

from agentrun.api.attempt import Attempt
from agentrun.api.checkpoint import Checkpoint
from agentrun.api.run import Run
from agentrun.api.sideeffect import SideEffect

PEERING_GROUP: Final = "kopf.dev"
PEERING_VERSION: Final = "v1"
# What the API server must serve before the operator starts (and what `helm test` checks is served).
AGENTRUN_PLURALS: Final = tuple(kind.plural for kind in (Run, Attempt, Checkpoint, SideEffect))


def _peering_crd(kind: str, plural: str, scope: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{PEERING_GROUP}"},
        "spec": {
            "group": PEERING_GROUP,
            "scope": scope,
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": PEERING_VERSION,
                    "served": True,
                    "storage": True,
                    # kopf writes its heartbeats to .status through the main resource: no status
                    # subresource, and the status is free-form (one entry per operator replica).
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                            "properties": {
                                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                            },
                        }
                    },
                }
            ],
        },
    }


def peering_crds() -> list[dict[str, Any]]:
    """The CRDs of kopf's peering objects (kopf.dev/v1), as kopf's documentation defines them."""
    return [
        _peering_crd("ClusterKopfPeering", "clusterkopfpeerings", "Cluster"),
        _peering_crd("KopfPeering", "kopfpeerings", "Namespaced"),
    ]
