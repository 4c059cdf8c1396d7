"""python -m devcluster.nodeagent --kubeconfig K --node-name N --state-dir D [--instant]"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from pathlib import Path

from .agent import NodeAgent
from .kube import Kube
from .node import NodeSettings
from .runner import Restarts


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m devcluster.nodeagent", description=__doc__)
    parser.add_argument("--kubeconfig", required=True, help="credentials of system:node:<name>")
    parser.add_argument("--node-name", required=True)
    parser.add_argument("--state-dir", required=True, type=Path, help="pod sandboxes, logs, tokens")
    parser.add_argument(
        "--instant",
        action="store_true",
        help="instant mode: agentrun example agents run in this process through the real SDK protocol, "
        "other containers complete at once (see devcluster/nodeagent/instant.py)",
    )
    parser.add_argument("--serving-cert", type=Path, help="the containerLogs endpoint's certificate")
    parser.add_argument("--serving-key", type=Path)
    parser.add_argument("--client-ca", type=Path, help="the CA of the API server's kubelet client cert")
    args = parser.parse_args()
    log_tls = (args.serving_cert, args.serving_key, args.client_ca) if args.serving_cert else None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    agent = NodeAgent(
        Kube(args.kubeconfig),
        NodeSettings(name=args.node_name),
        args.state_dir,
        Restarts(),
        instant=args.instant,
        log_tls=log_tls,
    )

    async def run() -> None:
        task = asyncio.create_task(agent.run())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(run())


if __name__ == "__main__":
    main()
