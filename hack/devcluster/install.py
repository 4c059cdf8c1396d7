"""`make operator`: agentrun installed on the local control plane the way a user installs it, with the
operator run from this checkout: the CRDs (crds/), the operator's ServiceAccount, its RBAC and the
admission policies (security.install, as the chart makes them), then `python -m agentrun.operator` as
that ServiceAccount in the background, with the object store `make cluster` runs (each opted-in
namespace's bucket and Secrets made by the operator, as the chart's operator does with its bundled
server). Its log is <state dir>/logs/operator.log; `make operator` again
restarts it (after a code change), `make cluster-down` stops it with the cluster."""

from __future__ import annotations

import json
import time
from pathlib import Path

from . import security
from .cluster import REPO_ROOT, ClusterError, LocalCluster
from .operator import OperatorProcess
from .processes import pid_alive, stop_group

OPERATOR_RECORD = "operator.json"
# What `make cluster` writes for an operator started by hand: the same state-store settings as here.
OPERATOR_STORE_ENV = "operator-store.env"


def install(state_dir: Path) -> None:
    """Installs agentrun on the cluster recorded in state_dir and starts the operator; raises
    ClusterError when no cluster runs there."""
    if not (state_dir / "state.json").exists() or not (cluster := LocalCluster.attach(state_dir)).running():
        raise ClusterError(f"no local control plane runs from {state_dir}: start one with `make cluster`")
    if cluster.object_store is None:
        raise ClusterError(
            f"the local control plane from {state_dir} runs no object store: the operator would keep agent "
            "state inline; start it again with `make cluster-down && make cluster`"
        )
    stop_operator(state_dir)
    kubectl = security.Kubectl(cluster.binary("kubectl"), cluster.kubeconfig)
    began = time.monotonic()
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO_ROOT / "crds"))
    kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    print("CRDs installed:", ", ".join(sorted(p.stem for p in (REPO_ROOT / "crds").glob("*.yaml"))))
    operator_kubeconfig = security.install(
        cluster.binary("kubectl"), cluster.kubeconfig, state_dir / "operator.kubeconfig"
    )
    print(
        f"admission policies enforced; the operator runs as ServiceAccount "
        f"{security.OPERATOR_NAMESPACE}/{security.OPERATOR_SERVICE_ACCOUNT}"
    )
    operator = OperatorProcess(
        operator_kubeconfig,
        state_dir / "logs" / "operator.log",
        # the cluster's object store, as the demo's and the tests' operators have it; and it makes each
        # opted-in namespace's bucket and Secrets, as nobody else sets up a namespace made by hand
        env={**security.OPERATOR_ENV, **security.local_store_operator_env(cluster, provision=True)},
        verbose=False,
        tie_to_parent=False,
    )
    operator.start()
    assert operator.process is not None
    (state_dir / OPERATOR_RECORD).write_text(json.dumps({"pid": operator.process.pid}))
    operator.wait_ready(timeout=120)
    print(f"operator running, pid {operator.process.pid}, in {time.monotonic() - began:.1f}s")
    print(
        f"  state store: Bundled, the cluster's object store ({cluster.state_store_url}): a namespace "
        "that opts its agents' ServiceAccount in gets its bucket and its Secrets from the operator"
    )
    print(f"  log: {operator.log_path}    restart: make operator    stop: make cluster-down")


def stop_operator(state_dir: Path) -> None:
    """Stops the operator an earlier `make operator` started, if it still runs."""
    record = state_dir / OPERATOR_RECORD
    if not record.exists():
        return
    pid = int(json.loads(record.read_text())["pid"])
    if pid_alive(pid) and b"agentrun.operator" in _command_line(pid):  # not a reused pid
        stop_group(pid, grace_seconds=5)
    record.unlink()


def _command_line(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
