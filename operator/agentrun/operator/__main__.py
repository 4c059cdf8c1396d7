"""python -m agentrun.operator [--namespace NS ...]: run the operator (cluster-wide by default)."""

from __future__ import annotations

import argparse
import asyncio
import logging

import kopf

import agentrun.operator.handlers  # noqa: F401  (importing registers the handlers with kopf)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m agentrun.operator", description=__doc__)
    parser.add_argument("--namespace", "-n", action="append", default=[], help="watch only these namespaces")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    asyncio.run(
        kopf.operator(
            clusterwide=not args.namespace,
            namespaces=list(args.namespace),
        )
    )


if __name__ == "__main__":
    main()
