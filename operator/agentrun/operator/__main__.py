"""python -m agentrun.operator [--namespace NS ...]: run the operator (cluster-wide by default)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

import kopf

import agentrun.operator.handlers  # noqa: F401  (importing registers the handlers with kopf)
from agentrun.kubeapi import KubeApi
from agentrun.operator import bootstrap
from agentrun.operator.settings import OperatorSettings


async def run(namespaces: list[str], liveness: str | None) -> None:
    await bootstrap.prepare(KubeApi(threads=2), namespaces, OperatorSettings.from_env().peering)
    settings = kopf.OperatorSettings()
    # Namespace-scoped mode runs without cluster-wide permissions: kopf need not (and cannot) list
    # namespaces or watch CRDs; the API was found served above.
    settings.scanning.disabled = bool(namespaces)
    await kopf.operator(
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=liveness,
        settings=settings,
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m agentrun.operator", description=__doc__)
    parser.add_argument("--namespace", "-n", action="append", default=[], help="watch only these namespaces")
    parser.add_argument(
        "--liveness",
        metavar="URL",
        default=os.environ.get("AGENTRUN_LIVENESS_ENDPOINT") or None,
        help="serve kopf's health endpoint for probes, e.g. http://0.0.0.0:8080/healthz "
        "(default: $AGENTRUN_LIVENESS_ENDPOINT, else none)",
    )
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("kubernetes").setLevel(logging.INFO)  # its DEBUG logs every response body
    asyncio.run(run(list(args.namespace), args.liveness))


if __name__ == "__main__":
    main()
