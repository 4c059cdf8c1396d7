"""python -m devcluster {up,down,status,demo}: the local control plane for people (tests use the fixture)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .cluster import REPO_ROOT, ClusterError, LocalCluster
from .processes import pid_alive

DEFAULT_STATE_DIR = REPO_ROOT / ".devcluster"


def up(state_dir: Path) -> int:
    if (state_dir / "state.json").exists():
        existing = LocalCluster.attach(state_dir)
        if existing.running():
            print(f"already running: export KUBECONFIG={existing.kubeconfig}")
            return 0
    cluster = LocalCluster(state_dir=state_dir)
    began = time.monotonic()
    try:
        cluster.start(detached=True)
    except ClusterError as exc:
        cluster.stop()
        print(f"local control plane failed to start: {exc}", file=sys.stderr)
        return 1
    print(f"local control plane healthy in {time.monotonic() - began:.1f}s (node {cluster.node_name} Ready)")
    print(f"  export KUBECONFIG={cluster.kubeconfig}")
    if cluster.object_store is not None:
        print(f"  state store: {cluster.state_store_url}")
        print(f"    its URL and credentials for a shell: source {cluster.state_store_env_file}")
        print(
            "    an operator takes AGENTRUN_STATE_STORE_URL; each agent namespace needs the Secret its Pods "
            "read the credentials from:"
        )
        print(
            "      kubectl create secret generic agentrun-state-store -n <namespace> "
            f"--from-literal=AWS_ACCESS_KEY_ID=... --from-literal=AWS_SECRET_ACCESS_KEY=... "
            f"(the values: {cluster.state_store_env_file})"
        )
    print(f"  logs: {state_dir / 'logs'}    stop: make cluster-down")
    return 0


def down(state_dir: Path) -> int:
    if not (state_dir / "state.json").exists():
        print("no local control plane recorded in", state_dir)
        return 0
    LocalCluster.attach(state_dir).stop()
    print("local control plane stopped")
    return 0


def status(state_dir: Path) -> int:
    if not (state_dir / "state.json").exists():
        print("not running")
        return 1
    cluster = LocalCluster.attach(state_dir)
    for c in cluster.components:
        print(f"  {c.name:24} pid {c.pid:<8} {'running' if pid_alive(c.pid) else 'EXITED'}   log {c.log}")
    return 0 if cluster.running() else 1


def demo(state_dir: Path) -> int:
    from .demo import main as run_demo  # noqa: PLC0415 - only the demo needs the agentrun package

    return run_demo(state_dir / "demo")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m devcluster", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "status", "demo"])
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    args = parser.parse_args()
    return {"up": up, "down": down, "status": status, "demo": demo}[args.command](args.state_dir)


if __name__ == "__main__":
    sys.exit(main())
