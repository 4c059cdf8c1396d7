"""python -m devcluster {up,down,status,install,demo}: the local control plane for people (tests use the
fixture). The state directory is .devcluster in the checkout, or $AGENTRUN_DEVCLUSTER_DIR."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

from . import security
from .cluster import REPO_ROOT, ClusterError, LocalCluster
from .install import OPERATOR_STORE_ENV, install, stop_operator
from .processes import pid_alive

DEFAULT_STATE_DIR = Path(os.environ.get("AGENTRUN_DEVCLUSTER_DIR") or REPO_ROOT / ".devcluster")


def up(state_dir: Path) -> int:
    if (state_dir / "state.json").exists():
        existing = LocalCluster.attach(state_dir)
        if existing.running():
            print(f"already running: source {write_env(existing)}")
            return 0
    cluster = LocalCluster(state_dir=state_dir)
    began = time.monotonic()
    try:
        cluster.start(detached=True)
    except ClusterError as exc:
        cluster.stop()
        print(f"local control plane failed to start: {exc}", file=sys.stderr)
        return 1
    env_file = write_env(cluster)
    print(f"local control plane healthy in {time.monotonic() - began:.1f}s (node {cluster.node_name} Ready)")
    print(f"  source {env_file}    (KUBECONFIG, and kubectl, helm and kubectl-agentrun on PATH)")
    if cluster.object_store is not None:
        for line in store_lines(cluster, write_operator_env(cluster), write_chart_values(cluster)):
            print(line)
    print(f"  logs: {state_dir / 'logs'}    stop: make cluster-down")
    return 0


def store_lines(cluster: LocalCluster, operator_env: Path, chart_values: Path) -> list[str]:
    """What `make cluster` says of its object store: how an operator uses it (`make operator` does)."""
    return [
        f"  state store: {cluster.state_store_url}",
        "    `make operator` runs the operator with it: a namespace that opts its agents' ServiceAccount in "
        "(labelled agentrun.dev/agent=true and bound to the attempt role, as examples/agents.yaml does) "
        "gets its bucket and its Secrets from the operator",
        f"    an operator started by hand takes the same: source {operator_env}   (the URL, "
        "AGENTRUN_STATE_STORE_PROVISION=versitygw and the store's root credentials)",
        f"    the chart takes it with: helm install ... -f {chart_values}   (its root credentials: the "
        f"Secret {CHART_ROOT_SECRET} in {security.OPERATOR_NAMESPACE})",
        "    people read a namespace's archives and state with kubectl agentrun history, describe --archived "
        "and state, which read the namespace's read-only Secret",
    ]


def write_operator_env(cluster: LocalCluster) -> Path:
    """<state dir>/operator-store.env (mode 0600): the state-store configuration `make operator` gives the
    operator (security.local_store_operator_env), for `source` before starting one by hand."""
    path = cluster.state_dir / OPERATOR_STORE_ENV
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    env = security.local_store_operator_env(cluster, provision=True)
    path.write_text("".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items()))
    return path


# The Secret, in the chart's namespace, holding the store's root credentials for the chart's operator.
CHART_ROOT_SECRET = "agentrun-store-root"


def write_chart_values(cluster: LocalCluster) -> Path:
    """<state dir>/store-values.yaml: the chart's values for this cluster's object store (the bundled server
    kind, run here rather than by the chart: stateStore.bundled.install=false), and the Secret of its root
    credentials they name, made in the chart's namespace."""
    kubectl = security.Kubectl(cluster.binary("kubectl"), cluster.kubeconfig)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": security.OPERATOR_NAMESPACE}}
    root = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": CHART_ROOT_SECRET, "namespace": security.OPERATOR_NAMESPACE},
        "type": "Opaque",
        "stringData": cluster.state_store_env(),
    }
    kubectl.apply([namespace])
    kubectl.apply([root])
    values = {
        "stateStore": {
            "url": cluster.state_store_url,
            "bundled": {"enabled": True, "install": False, "existingSecret": CHART_ROOT_SECRET},
        }
    }
    path = cluster.state_dir / "store-values.yaml"
    path.write_text(json.dumps(values, indent=2) + "\n")  # JSON is YAML
    return path


def write_env(cluster: LocalCluster) -> Path:
    """<state dir>/env: what a shell needs to use the cluster, for `source`."""
    tools = [str(cluster.bin_dir), str(Path(sys.executable).parent)]  # kubectl, helm; kubectl-agentrun
    path = cluster.state_dir / "env"
    path.write_text(
        f"export KUBECONFIG={shlex.quote(str(cluster.kubeconfig))}\n"
        f'export PATH={shlex.quote(os.pathsep.join(tools))}:"$PATH"\n'
    )
    return path


def down(state_dir: Path) -> int:
    if not (state_dir / "state.json").exists():
        print("no local control plane recorded in", state_dir)
        return 0
    stop_operator(state_dir)
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


def install_operator(state_dir: Path) -> int:
    try:
        install(state_dir)
    except ClusterError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


def demo(state_dir: Path) -> int:
    from .demo import main as run_demo  # noqa: PLC0415 - only the demo needs the agentrun package

    return run_demo(state_dir / "demo")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m devcluster", description=__doc__)
    commands = {"up": up, "down": down, "status": status, "install": install_operator, "demo": demo}
    parser.add_argument("command", choices=list(commands))
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    args = parser.parse_args()
    return commands[args.command](args.state_dir)


if __name__ == "__main__":
    sys.exit(main())
