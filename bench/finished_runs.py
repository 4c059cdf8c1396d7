"""What a finished Run leaves in the API server (issue 27, items 1 and 2): N Runs of the finishing agent
(tests/support/finishing_agent.py), each saving C Checkpoints of about B bytes and making E side effects,
all Succeeded, on a local control plane with its object store and the operator told the store. Once every
Run is compacted (status.checkpointIndex recorded, its Lease and superseded Checkpoints deleted) and its
Pod collected, the bytes per Run are the JSON of its runs, attempts, checkpoints, sideeffects and leases
as `kubectl get -o json --show-managed-fields` prints them (indented), and compact.

    PYTHONPATH=hack:tests .venv/bin/python bench/finished_runs.py [--runs 50] [--checkpoints 10]
        [--state-bytes 20000] [--effects 2] [--no-store] [--clear all|runs|none] [--out FILE]
        # bench/finished_runs.json (or FILE), a Markdown table

--no-store: neither the agents nor the operator have a store (states inline; the Lease goes, every
Checkpoint stays), for comparison.
--clear: which managedFields compaction's last write clears, for comparison: all (as installed: the Run's,
its Attempts', SideEffects' and Checkpoints'), runs (the operator's RBAC loses `patch` on attempts,
sideeffects and checkpoints, so only the Run's are: it is cleared first), none (no `patch` at all: the
managedFields stay, as before the clearing existed). Whatever is cleared is waited for before measuring.
Reported besides: what each part is worth in print (managedFields by kind, and the Run's conditions,
report and side-effect counts), so that each option can be weighed on the same objects.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from devcluster import security
from devcluster.cluster import LocalCluster
from devcluster.operator import OperatorProcess
from devcluster.processes import free_port
from devcluster.security import OPERATOR_SERVICE_ACCOUNT
from support.agentrun import install_crds
from support.clusters import opt_in_for_attempts
from support.kube import Kube, wait_for
from support.runs import support_agent_run

HERE = Path(__file__).resolve().parent

KINDS = ("runs", "attempts", "checkpoints", "sideeffects", "leases")
LABEL = "agentrun.dev/run"


def log(message: str) -> None:
    print(f"[finished-runs {time.strftime('%H:%M:%S')}] {message}", flush=True)


def kubectl_json(kube: Kube, ns: str, kind: str) -> list[dict[str, Any]]:
    out = kube.kubectl("get", kind, "-o", "json", "--show-managed-fields", namespace=ns).stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def printed_size(item: dict[str, Any]) -> int:
    return len(json.dumps(item, indent=4).encode())


def without(item: dict[str, Any], *path: str) -> dict[str, Any]:
    """A copy of the object without the field at `path` (e.g. "metadata", "managedFields")."""
    copy: dict[str, Any] = json.loads(json.dumps(item))
    parent = copy
    for key in path[:-1]:
        parent = parent.get(key) or {}
    parent.pop(path[-1], None)
    return copy


def parts_per_run(kube: Kube, ns: str) -> dict[str, float]:
    """What parts of the objects are worth in print, mean per Run: each kind's managedFields, and the Run's
    status conditions, report and side-effect counts (the printed object with it minus without it)."""
    totals: dict[str, int] = {}
    runs = 0
    for kind in ("runs", "attempts", "checkpoints", "sideeffects"):
        for item in kubectl_json(kube, ns, kind):
            runs += kind == "runs"
            whole = printed_size(item)
            key = f"{kind}.managedFields"
            bare = printed_size(without(item, "metadata", "managedFields"))
            totals[key] = totals.get(key, 0) + whole - bare
            if kind == "runs":
                for field in ("conditions", "report", "sideEffects"):
                    key = f"runs.status.{field}"
                    totals[key] = totals.get(key, 0) + whole - printed_size(without(item, "status", field))
    return {k: round(v / max(runs, 1)) for k, v in totals.items()}


CLEARED_KINDS = {"all": KINDS[:4], "runs": ("runs",), "none": ()}


def deny_patch(kube: Kube, kinds: tuple[str, ...]) -> None:
    """Takes `patch` on these kinds (their main resource) from the operator's ClusterRole."""
    role = json.loads(kube.kubectl("get", "clusterrole", OPERATOR_SERVICE_ACCOUNT, "-o", "json").stdout)
    for rule in role["rules"]:
        resources = rule.get("resources", [])
        if any(kind in resources for kind in kinds):
            kept = [r for r in resources if r not in kinds]
            if kept:  # the other kinds of the rule keep every verb
                role["rules"].append({**rule, "resources": kept})
            rule["resources"] = [r for r in resources if r in kinds]
            rule["verbs"] = [v for v in rule["verbs"] if v != "patch"]
    kube.rbac.patch_cluster_role(OPERATOR_SERVICE_ACCOUNT, {"rules": role["rules"]})


def bytes_per_run(kube: Kube, ns: str, *, printed: bool) -> dict[str, dict[str, int]]:
    """run -> kind -> bytes of its objects' JSON: as kubectl prints each (indented by 4), or compact (about
    what etcd stores, before its own encoding)."""
    sizes: dict[str, dict[str, int]] = {}
    for kind in KINDS:
        for item in kubectl_json(kube, ns, kind):
            meta = item["metadata"]
            run = meta["name"] if kind == "runs" else (meta.get("labels") or {}).get(LABEL)
            if run is None:
                continue
            per = sizes.setdefault(run, dict.fromkeys(KINDS, 0))
            text = json.dumps(item, indent=4) if printed else json.dumps(item, separators=(",", ":"))
            per[kind] += len(text.encode())
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--checkpoints", type=int, default=10)
    parser.add_argument("--state-bytes", type=int, default=20_000)
    parser.add_argument("--effects", type=int, default=2)
    parser.add_argument("--no-store", action="store_true")
    parser.add_argument("--clear", choices=sorted(CLEARED_KINDS), default="all")
    parser.add_argument("--out", type=Path, help="where the figures go (default: bench/finished_runs*.json)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a batch may take")
    parser.add_argument("--concurrency", type=int, default=8, help="Runs started at once")
    parser.add_argument(
        "--dump", type=Path, help="write the first Run's objects (as kubectl prints them) here"
    )
    args = parser.parse_args()

    state_dir = Path(tempfile.mkdtemp(prefix="agentrun-finished-runs-"))
    cluster = LocalCluster(state_dir=state_dir / "cluster")
    cluster.start()
    operator: OperatorProcess | None = None
    try:
        kube = Kube(cluster.kubeconfig, Path(cluster.binary("kubectl")))
        install_crds(kube)
        operator_kubeconfig = security.install(
            cluster.binary("kubectl"), cluster.kubeconfig, state_dir / "operator.kubeconfig"
        )
        cleared = CLEARED_KINDS[args.clear]
        if args.clear != "all":
            deny_patch(kube, tuple(k for k in KINDS[:4] if k not in cleared))
        env = {"AGENTRUN_METRICS_PORT": str(free_port()), **security.OPERATOR_ENV}
        if not args.no_store:
            env |= security.state_store_operator_env(cluster.state_store_url) | cluster.state_store_env()
        operator = OperatorProcess(operator_kubeconfig, state_dir / "operator.log", env=env, verbose=False)
        operator.start()
        operator.wait_ready()

        ns = "finished-runs"
        kube.core.create_namespace({"metadata": {"name": ns}})
        wait_for(
            lambda: (
                kube.core.list_namespaced_service_account(ns, field_selector="metadata.name=default").items
            ),
            30,
            what="the default ServiceAccount",
        )
        opt_in_for_attempts(kube, ns)
        kube.core.create_namespaced_secret(ns, security.state_store_secret(ns, cluster.state_store_env()))

        agent_input = {
            "checkpoints": args.checkpoints,
            "stateBytes": args.state_bytes,
            "effects": args.effects,
        }
        names = [f"finished-{n:03d}" for n in range(args.runs)]
        started = time.monotonic()
        for batch in range(0, len(names), args.concurrency):
            chunk = names[batch : batch + args.concurrency]
            for name in chunk:
                body = support_agent_run(name, "finishing_agent", agent_input)
                # without a store neither the agent nor the operator has one: states stay inline
                body["spec"]["agent"]["env"] += (
                    []
                    if args.no_store
                    else [
                        {"name": "AGENTRUN_STATE_STORE_URL", "value": cluster.state_store_url},
                        *(
                            {
                                "name": k,
                                "valueFrom": {
                                    "secretKeyRef": {"name": security.STATE_STORE_SECRET, "key": k}
                                },
                            }
                            for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
                        ),
                    ]
                )
                kube.custom.create_namespaced_custom_object("agentrun.dev", "v1alpha1", ns, "runs", body)
            log(f"started {batch + len(chunk)}/{len(names)}")
            done = partial(settled, kube, ns, chunk, args.no_store, cleared)
            wait_for(done, args.timeout, interval=1.0, what="a batch")
        took = time.monotonic() - started
        if args.dump:
            first = names[0]
            objects = [
                item
                for kind in KINDS
                for item in kubectl_json(kube, ns, kind)
                if first in (item["metadata"]["name"], (item["metadata"].get("labels") or {}).get(LABEL))
            ]
            args.dump.write_text(json.dumps(objects, indent=4))
        sizes = bytes_per_run(kube, ns, printed=True)
        compact = bytes_per_run(kube, ns, printed=False)
        phases = {r["status"]["phase"] for r in kubectl_json(kube, ns, "runs")}
        pods = len(kube.core.list_namespaced_pod(ns).items)
        per_run = sorted(sum(kinds.values()) for kinds in sizes.values())
        result = {
            "runs": args.runs,
            "checkpoints": args.checkpoints,
            "stateBytes": args.state_bytes,
            "effects": args.effects,
            "store": not args.no_store,
            "cleared": list(cleared),
            "phases": sorted(phases),
            "podsLeft": pods,
            "seconds": round(took, 1),
            "bytesPerRunMax": per_run[-1],
            "bytesPerRunMean": round(sum(per_run) / len(per_run)),
            "bytesByKindMean": {k: round(sum(s[k] for s in sizes.values()) / len(sizes)) for k in KINDS},
            "compactBytesPerRunMean": round(sum(sum(s.values()) for s in compact.values()) / len(compact)),
            "printedBytesOfPartsMean": parts_per_run(kube, ns),
        }
        default = "finished_runs.json" if not args.no_store else "finished_runs_no_store.json"
        out = args.out or HERE / default
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        kib = 1024
        print("\n| kind | mean bytes per Run |\n|---|---|")
        for kind, size in result["bytesByKindMean"].items():
            print(f"| {kind} | {size} |")
        print(f"| **all** (max {result['bytesPerRunMax'] / kib:.1f} KiB) | {result['bytesPerRunMean']} |")
    finally:
        if operator is not None:
            operator.stop()
        cluster.stop()
        subprocess.run(["rm", "-rf", str(state_dir)], check=False)


def settled(kube: Kube, ns: str, names: list[str], no_store: bool, cleared: tuple[str, ...]) -> bool:
    """Every Run of the batch ended, compacted (or, without a store, its Lease gone), its Pod gone, and
    the managedFields of the `cleared` kinds cleared."""
    runs = {
        r["metadata"]["name"]: r for r in kubectl_json(kube, ns, "runs") if r["metadata"]["name"] in names
    }
    if len(runs) < len(names):
        return False
    for run in runs.values():
        status = run.get("status") or {}
        if status.get("phase") not in ("Succeeded", "Failed", "Cancelled"):
            return False
        if not no_store and "checkpointIndex" not in status:
            return False
    leases = {lease["metadata"]["name"] for lease in kubectl_json(kube, ns, "leases")}
    pods = {pod.metadata.name.rsplit("-a", 1)[0] for pod in kube.core.list_namespaced_pod(ns).items}
    left = [n for n in names if n in pods or any(lease.endswith(n) or n in lease for lease in leases)]
    if left:
        return False
    checkpoints = [c for c in kubectl_json(kube, ns, "checkpoints") if c["spec"]["runName"] in names]
    if not no_store and len(checkpoints) != len(names):
        return False
    for kind in cleared:
        for item in runs.values() if kind == "runs" else kubectl_json(kube, ns, kind):
            owner = item["metadata"]["name"] if kind == "runs" else item["metadata"]["labels"].get(LABEL)
            if owner in names and item["metadata"].get("managedFields"):
                return False
    return True


if __name__ == "__main__":
    main()
