"""Agent state at 200 tool calls (issue 24, "Measure"): the big-state agent through the operator, killed
twice, and what one superstep costs with agentrun's saver beside LangGraph's PostgresSaver and
InMemorySaver.

    .venv/bin/pip install langgraph-checkpoint-postgres 'psycopg[binary]'   # the baseline, not a dependency
    PYTHONPATH=hack:tests:bench .venv/bin/python bench/agent_state.py --phases baselines
    PYTHONPATH=hack:tests:bench .venv/bin/python bench/agent_state.py --phases cluster  # a control plane
Each phase adds its figures to bench/agent_state.json; the Markdown summary is printed at the end.

The graph (tests/support/langgraph_react.py): a model node asks for one tool call at a time, the tool
answers each with 40,000 characters; 200 calls are 403 supersteps (~8 MB of messages), with the ordinary
`operator.add` list and with a DeltaChannel. Superstep s = the pending writes made from checkpoint s-1,
then checkpoint s. Medians over supersteps 8-12 (early) and 398-402 (late).

- baselines (no cluster): the graph driven in this process, sync durability, through LangGraph's
  PostgresSaver on a private PostgreSQL of the distribution's packages (initdb into a temporary
  directory, defaults, Unix socket only) and through InMemorySaver. Per superstep: the bytes the saver
  stored (the rows it inserted: checkpoint JSON and metadata, blobs, writes, as octet_length; for
  PostgreSQL also the WAL it wrote, after TOAST compression) and the time spent in put + put_writes.
- direct (cluster, no operator): the same graph through AgentrunSaver on the local control plane's API
  server and object store (bench/langgraph_state.py's measured saver): bytes the store got per superstep
  against the superstep's new data (its serialized new messages), the Checkpoint objects' JSON, the time
  spent in aput + aput_writes.
- operator (cluster): killed_react_agent as a Run of the operator, the state store on, the worker killing
  itself (SIGKILL) as Attempt 1 starts tool call 60 and Attempt 2 starts tool call 140. Succeeded, the
  tool log (every call ended exactly once), the final state (200 outputs, their digest). The API server
  runs with an audit log (writes at RequestResponse, reads at Metadata, watches not logged): per
  superstep, the non-watch requests of the worker and of the operator, and every object revision
  written to etcd, sized as `kubectl get -o json --show-managed-fields` prints it (indented by 4) and
  compact; superstep s ends when the worker's create of State checkpoint s completes.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import hashlib
import json
import os
import pwd
import shutil
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import langgraph_state
from harness import api_requests, request_delta
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions, CheckpointMetadata
from langgraph.checkpoint.base import Checkpoint as LangGraphCheckpoint
from langgraph.checkpoint.memory import InMemorySaver

from agentrun.integrations.langgraph.serde import AllowListSerializer
from devcluster import security
from devcluster.cluster import LocalCluster
from devcluster.operator import OperatorProcess
from devcluster.processes import free_port
from support.agentrun import install_crds
from support.clusters import opt_in_for_attempts
from support.kube import Kube, wait_for
from support.langgraph_react import build, output, task
from support.runs import FAST_RETRY, support_agent_run

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "agent_state.json"
EARLY, LATE = range(8, 13), range(398, 403)
CALLS, OUTPUT_BYTES = 200, 40_000
KILLS = {"a1": 60, "a2": 140}
NAMESPACE = "big-state"
GROUP, VERSION = "agentrun.dev", "v1alpha1"


def log(message: str) -> None:
    print(f"[agent-state {time.strftime('%H:%M:%S')}] {message}", flush=True)


def windows(rows: list[dict[str, Any]], keys: Sequence[str]) -> dict[str, dict[str, float]]:
    """Medians of `keys` over the early and the late window (rows keyed by "superstep")."""
    out: dict[str, dict[str, float]] = {}
    for name, window in (("early", EARLY), ("late", LATE)):
        chosen = [r for r in rows if r["superstep"] in window]
        out[name] = {k: statistics.median(r.get(k, 0) for r in chosen) for k in keys} if chosen else {}
        out[name]["supersteps"] = len(chosen)
    return out


# --- the baselines: PostgresSaver and InMemorySaver, driven in this process ------------------------------

NEW_DATA = AllowListSerializer()


def new_data(writes: Sequence[tuple[str, Any]]) -> int:
    """The superstep's new data, as bench/langgraph_state.py counts it: its new messages, serialized."""
    return sum(len(NEW_DATA.dumps_typed(v)[1]) for c, v in writes if c == "messages")


class Steps:
    """Per checkpoint saved: bytes stored, seconds in the saver, new data (what the pending writes since the
    previous checkpoint carried); superstep s = the s-th checkpoint, the input's being 1, as the sequence
    of agentrun's Checkpoint objects counts them."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.stored = self.seconds = 0.0
        self.data = 0
        self.extra: Counter[str] = Counter()

    def writes(self, seconds: float, stored: int, data: int, **extra: int) -> None:
        self.seconds += seconds
        self.stored += stored
        self.data += data
        self.extra.update(extra)

    def checkpoint(self, seconds: float, stored: int, **extra: int) -> None:
        self.writes(seconds, stored, 0, **extra)
        row = {
            "superstep": len(self.rows) + 1,
            "stored_bytes": self.stored,
            "new_data": self.data,
            "seconds": round(self.seconds, 5),
            **self.extra,
        }
        self.rows.append(row)
        self.stored = self.seconds = 0.0
        self.data = 0
        self.extra = Counter()


class MeasuredMemorySaver(InMemorySaver):
    """InMemorySaver that notes what each put and put_writes stored (serialized bytes) and took."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = Steps()

    def put(
        self,
        config: RunnableConfig,
        checkpoint: LangGraphCheckpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        started = time.perf_counter()
        stored = super().put(config, checkpoint, metadata, new_versions)
        seconds = time.perf_counter() - started
        thread, ns = config["configurable"]["thread_id"], config["configurable"].get("checkpoint_ns", "")
        blobs = sum(len(self.blobs[(thread, ns, k, v)][1]) for k, v in new_versions.items())
        saved, meta, _ = self.storage[thread][ns][checkpoint["id"]]
        self.steps.checkpoint(seconds, blobs + len(saved[1]) + len(meta[1]))
        return stored

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        key = (
            config["configurable"]["thread_id"],
            config["configurable"].get("checkpoint_ns", ""),
            config["configurable"]["checkpoint_id"],
        )
        before = dict(self.writes.get(key, {}))
        started = time.perf_counter()
        super().put_writes(config, writes, task_id, task_path)
        seconds = time.perf_counter() - started
        added = sum(len(v[2][1]) for k, v in self.writes.get(key, {}).items() if k not in before)
        self.steps.writes(seconds, added, new_data(writes))


class PostgreSQL:
    """A private PostgreSQL of the distribution's packages: initdb into a temporary directory, defaults,
    listening on a Unix socket in that directory only; run as the `postgres` user when started as root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        bindir = Path(
            subprocess.run(
                ["pg_config", "--bindir"], capture_output=True, text=True, check=False
            ).stdout.strip()
            or "/usr/lib/postgresql/15/bin"
        )
        self.bin = bindir if (bindir / "initdb").exists() else Path(shutil.which("initdb") or "initdb").parent
        self.user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name

    def _run(self, *argv: str) -> str:
        prefix = ["runuser", "-u", self.user, "--"] if os.geteuid() == 0 else []
        done = subprocess.run([*prefix, *argv], capture_output=True, text=True, check=True)
        return done.stdout

    def start(self) -> str:
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, self.user, self.user)
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", self.user, "--auth=trust")
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.root / "postgres.log"),
            "-o",
            f"-c listen_addresses='' -k {self.root}",
            "-w",
            "start",
        )
        return f"host={self.root} user={self.user} dbname=postgres"

    def version(self) -> str:
        return self._run(str(self.bin / "postgres"), "--version").strip()

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")


def postgres_saver(conninfo: str) -> tuple[Any, Callable[[], None]]:
    """A PostgresSaver subclass, measured like MeasuredMemorySaver: per put the rows' bytes it inserted
    (octet_length, read back by key) and the WAL it wrote; and a close function."""
    # the baseline's packages are installed for this benchmark only (the module docstring)
    import psycopg  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415
    from langgraph.checkpoint.postgres import (  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415
        PostgresSaver,
    )
    from psycopg.rows import dict_row  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415

    conn = psycopg.connect(conninfo, autocommit=True, prepare_threshold=0, row_factory=dict_row)
    probe = psycopg.connect(conninfo, autocommit=True)

    def wal() -> int:
        row = probe.execute("select pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint").fetchone()
        return int(row[0]) if row else 0

    def scalar(sql: str, params: Sequence[Any]) -> int:
        row = probe.execute(sql, params).fetchone()
        return int(row[0] or 0) if row else 0

    class MeasuredPostgresSaver(PostgresSaver):  # type: ignore[misc, unused-ignore]
        steps = Steps()

        def put(
            self,
            config: RunnableConfig,
            checkpoint: LangGraphCheckpoint,
            metadata: CheckpointMetadata,
            new_versions: ChannelVersions,
        ) -> RunnableConfig:
            wal0 = wal()
            started = time.perf_counter()
            stored: RunnableConfig = super().put(config, checkpoint, metadata, new_versions)
            seconds = time.perf_counter() - started
            wal1 = wal()
            thread, ns = config["configurable"]["thread_id"], config["configurable"].get("checkpoint_ns", "")
            row = scalar(
                "select octet_length(checkpoint::text) + octet_length(metadata::text) from checkpoints"
                " where thread_id = %s and checkpoint_ns = %s and checkpoint_id = %s",
                (thread, ns, checkpoint["id"]),
            )
            blobs = sum(
                scalar(
                    "select octet_length(blob) from checkpoint_blobs where thread_id = %s and"
                    " checkpoint_ns = %s and channel = %s and version = %s",
                    (thread, ns, channel, str(version)),
                )
                for channel, version in new_versions.items()
            )
            self.steps.checkpoint(seconds, row + blobs, wal_bytes=wal1 - wal0)
            return stored

        def put_writes(
            self,
            config: RunnableConfig,
            writes: Sequence[tuple[str, Any]],
            task_id: str,
            task_path: str = "",
        ) -> None:
            wal0 = wal()
            started = time.perf_counter()
            super().put_writes(config, writes, task_id, task_path)
            seconds = time.perf_counter() - started
            wal1 = wal()
            c = config["configurable"]
            stored = scalar(
                "select sum(octet_length(blob)) from checkpoint_writes where thread_id = %s and"
                " checkpoint_ns = %s and checkpoint_id = %s and task_id = %s",
                (c["thread_id"], c.get("checkpoint_ns", ""), c["checkpoint_id"], task_id),
            )
            self.steps.writes(seconds, stored, new_data(writes), wal_bytes=wal1 - wal0)

    saver = MeasuredPostgresSaver(conn)
    saver.setup()

    def close() -> None:
        conn.close()
        probe.close()

    return saver, close


def drive(saver: Any, thread: str, *, delta: bool, calls: int, output_bytes: int) -> list[dict[str, Any]]:
    """The graph through a sync saver, sync durability; checks the final state; its per-superstep rows."""
    config: RunnableConfig = {"configurable": {"thread_id": thread}, "recursion_limit": 2 * calls + 10}
    graph = build(calls, output_bytes, delta=delta).compile(checkpointer=saver)
    graph.invoke(task(), config, durability="sync")
    texts = [m.content for m in graph.get_state(config).values["messages"] if m.type == "tool"]
    if texts != [output(c, output_bytes) for c in range(calls)]:
        raise AssertionError(f"{thread}: the final state holds {len(texts)} tool outputs, not {calls}")
    rows: list[dict[str, Any]] = saver.steps.rows
    saver.steps.rows = []
    return rows


def baselines(args: argparse.Namespace, results: dict[str, Any]) -> None:
    keys = ("stored_bytes", "new_data", "seconds")
    found: dict[str, Any] = {}
    for delta in (False, True):
        channel = "delta" if delta else "list"
        memory = MeasuredMemorySaver()
        log(f"InMemorySaver, {channel}")
        rows = drive(
            memory, f"memory-{channel}", delta=delta, calls=args.calls, output_bytes=args.output_bytes
        )
        found[f"InMemorySaver {channel}"] = windows(rows, keys) | {"rows": rows}
        del memory
    with tempfile.TemporaryDirectory(prefix="agentrun-pg-") as tmp:
        os.chmod(tmp, 0o755)
        postgres = PostgreSQL(Path(tmp) / "pg")
        conninfo = postgres.start()
        found["postgresql"] = postgres.version()
        try:
            saver, close = postgres_saver(conninfo)
            try:
                for delta in (False, True):
                    channel = "delta" if delta else "list"
                    log(f"PostgresSaver, {channel}")
                    rows = drive(
                        saver, f"pg-{channel}", delta=delta, calls=args.calls, output_bytes=args.output_bytes
                    )
                    found[f"PostgresSaver {channel}"] = windows(rows, (*keys, "wal_bytes")) | {"rows": rows}
            finally:
                close()
        finally:
            postgres.stop()
    results["baselines"] = found


# --- the cluster: agentrun's saver directly, then the operator's Run killed twice --------------------------

AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: None
    verbs: ["watch"]
  - level: None
    nonResourceURLs: ["/metrics", "/healthz*", "/livez*", "/readyz*", "/version", "/openapi*", "/api*"]
  - level: RequestResponse
    verbs: ["create", "update", "patch", "delete", "deletecollection"]
  - level: Metadata
"""


def direct(cluster: LocalCluster, kube: Kube, args: argparse.Namespace) -> dict[str, Any]:
    kube.core.create_namespace({"metadata": {"name": langgraph_state.NAMESPACE}})
    found: dict[str, Any] = {}
    keys = ("state_object", "writes_objects", "store_bytes", "store_puts", "new_data", "seconds")
    for name, delta in (("list", False), ("delta", True)):
        log(f"AgentrunSaver directly, {name}")
        began = time.monotonic()
        rows = langgraph_state.run_thread(
            cluster, kube, name, calls=args.calls, output_bytes=args.output_bytes, delta=delta
        )
        # the Run named for the thread is done with: the operator, started next, must not run it
        kube.custom.delete_namespaced_custom_object(GROUP, VERSION, langgraph_state.NAMESPACE, "runs", name)
        store = sum(r["store_bytes"] for r in rows)
        data = sum(r["new_data"] for r in rows)
        found[f"AgentrunSaver {name}"] = windows(rows, keys) | {
            "wall_seconds": round(time.monotonic() - began, 1),
            "store_bytes_over_new_data": round(store / max(1, data), 3),
            "rows": rows,
        }
    return found


def store_env(cluster: LocalCluster) -> list[dict[str, Any]]:
    return [
        {"name": "AGENTRUN_STATE_STORE_URL", "value": cluster.state_store_url},
        *(
            {"name": k, "valueFrom": {"secretKeyRef": {"name": security.STATE_STORE_SECRET, "key": k}}}
            for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
        ),
    ]


def audit_entries(path: Path) -> list[dict[str, Any]]:
    entries = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(entries, key=lambda e: e["stageTimestamp"])


def when(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def per_superstep(entries: list[dict[str, Any]], ns: str, run: str) -> list[dict[str, Any]]:
    """The Run's supersteps from the audit log: requests by writer and the revisions written."""
    worker_user = f"system:serviceaccount:{ns}:default"
    ends: dict[int, float] = {}
    for e in entries:
        obj = e.get("responseObject") or {}
        spec = obj.get("spec") or {}
        if (
            e["verb"] == "create"
            and (e.get("objectRef") or {}).get("resource") == "checkpoints"
            and e.get("responseStatus", {}).get("code") == 201
            and spec.get("runName") == run
            and spec.get("kind") == "State"
            and "thread" in spec
        ):
            ends.setdefault(int(spec["sequence"]), when(e["stageTimestamp"]))
    ordered = sorted(ends.items())
    stamps = [t for _, t in ordered]
    buckets: dict[int, list[dict[str, Any]]] = {s: [] for s, _ in ordered}
    seen: dict[tuple[str, str, str], str] = {}
    for e in entries:
        ref = e.get("objectRef") or {}
        obj = e.get("responseObject") or {}
        meta = obj.get("metadata") or {}
        rv = str(meta.get("resourceVersion") or "")
        written = bool(rv) and obj.get("kind") != "Status"
        key = (ref.get("resource", ""), ref.get("namespace", ""), ref.get("name") or meta.get("name", ""))
        # a write that changed nothing answers with the revision it found: etcd wrote nothing
        e["_revision"] = written and seen.get(key) != rv
        if written:
            seen[key] = rv
        at = bisect.bisect_left(stamps, when(e["stageTimestamp"]))
        if at < len(ordered) and at > 0:  # after the end of superstep ordered[at-1], up to ordered[at]'s
            buckets[ordered[at][0]].append(e)
    rows: list[dict[str, Any]] = []
    for s, bucket in sorted(buckets.items()):
        row: dict[str, Any] = {
            "superstep": s,
            "requests_worker": 0,
            "requests_operator": 0,
            "requests_other": 0,
        }
        kinds: Counter[str] = Counter()
        printed = compact = created_printed = created_compact = revisions = 0
        for e in bucket:
            user = e["user"]["username"]
            ref = e.get("objectRef") or {}
            who = (
                "worker" if user == worker_user else "operator" if user == security.OPERATOR_USER else "other"
            )
            if who == "other" and ref.get("namespace") != ns:
                continue  # the controllers' leader leases, the collection of earlier threads' objects
            row[f"requests_{who}"] += 1
            resource = ref.get("resource", "-") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            kinds[f"{who} {e['verb']} {resource}"] += 1
            if e["_revision"] and ref.get("namespace") == ns:
                obj = e["responseObject"]
                p, c = (
                    len(json.dumps(obj, indent=4).encode()),
                    len(json.dumps(obj, separators=(",", ":")).encode()),
                )
                printed += p
                compact += c
                revisions += 1
                if e["verb"] == "create":
                    created_printed += p
                    created_compact += c
        row |= {
            "etcd_revisions": revisions,
            "etcd_bytes_printed": printed,
            "etcd_bytes_compact": compact,
            "created_bytes_printed": created_printed,
            "created_bytes_compact": created_compact,
            "requests": dict(kinds),
        }
        rows.append(row)
    return rows


def tool_log_check(path: Path, calls: int) -> dict[str, Any]:
    lines = [tuple(line.split()) for line in path.read_text().splitlines() if line.strip()]
    ends = Counter(int(n) for _, event, n in lines if event == "end")
    starts = Counter(int(n) for _, event, n in lines if event == "start")
    ended = {(a, n) for a, event, n in lines if event == "end"}
    return {
        "every_call_ended_once": sorted(ends) == list(range(calls)) and set(ends.values()) == {1},
        "calls_started_twice": sorted(n for n, k in starts.items() if k > 1),
        "killed_at": [f"{a} {n}" for a, event, n in lines if event == "start" and (a, n) not in ended],
        "attempts": sorted({a for a, _, _ in lines}),
    }


def operator_runs(
    cluster: LocalCluster, kube: Kube, args: argparse.Namespace, state_dir: Path
) -> dict[str, Any]:
    operator_kubeconfig = security.install(
        cluster.binary("kubectl"), cluster.kubeconfig, state_dir / "operator.kubeconfig"
    )
    env = {"AGENTRUN_METRICS_PORT": str(free_port()), **security.OPERATOR_ENV}
    env |= security.state_store_operator_env(cluster.state_store_url) | cluster.state_store_env()
    operator = OperatorProcess(operator_kubeconfig, state_dir / "operator.log", env=env, verbose=False)
    operator.start()
    found: dict[str, Any] = {}
    try:
        operator.wait_ready()
        kube.core.create_namespace({"metadata": {"name": NAMESPACE}})
        wait_for(
            lambda: (
                kube.core.list_namespaced_service_account(
                    NAMESPACE, field_selector="metadata.name=default"
                ).items
            ),
            30,
            what="the default ServiceAccount",
        )
        opt_in_for_attempts(kube, NAMESPACE)
        kube.core.create_namespaced_secret(
            NAMESPACE, security.state_store_secret(NAMESPACE, cluster.state_store_env())
        )
        for channel, delta in (("list", False), ("delta", True)):
            name = f"big-{channel}"
            tool_log = state_dir / f"{name}-tools.log"
            spec = {
                "calls": args.calls,
                "outputBytes": args.output_bytes,
                "delta": delta,
                "kills": args.kills,
            }
            body = support_agent_run(name, "killed_react_agent", spec)
            body["spec"]["agent"]["command"] = ["python", "-m", "killed_react_agent"]  # a bench module
            body["spec"]["agent"]["env"] = [
                {"name": "PYTHONPATH", "value": f"{HERE.parent / 'tests'}:{HERE}"},
                {"name": "AGENTRUN_TOOL_LOG", "value": str(tool_log)},
                *store_env(cluster),
            ]
            body["spec"]["retry"] = FAST_RETRY | {"maxAttempts": len(args.kills) + 2}
            log(f"operator Run {name}: {args.calls} calls, killed at {args.kills}")
            before = api_requests(kube)
            began, began_wall = time.monotonic(), time.time()
            kube.custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "runs", body)

            def finished(name: str = name) -> dict[str, Any] | None:
                run: dict[str, Any] = kube.custom.get_namespaced_custom_object(
                    GROUP, VERSION, NAMESPACE, "runs", name
                )
                phase = (run.get("status") or {}).get("phase")
                return run if phase in ("Succeeded", "Failed", "Cancelled", "NeedsReconciliation") else None

            run = wait_for(finished, args.timeout, interval=1.0, what=f"{name} to end")
            took = time.monotonic() - began
            totals = request_delta(api_requests(kube), before)
            status = run["status"]
            result = status.get("result") or {}
            texts = [output(c, args.output_bytes) for c in range(args.calls)]
            expected = hashlib.sha256("\n".join(texts).encode()).hexdigest()
            attempts = kube.custom.list_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, "attempts", label_selector=f"agentrun.dev/run={name}"
            )["items"]
            found[name] = {
                "phase": status.get("phase"),
                "seconds": round(took, 1),
                "attempts": sorted(
                    (a["metadata"]["name"], (a.get("status") or {}).get("phase", "?")) for a in attempts
                ),
                "result": result,
                "final_state_complete": result.get("toolOutputs") == args.calls
                and result.get("sha256") == expected,
                "tool_log": tool_log_check(tool_log, args.calls),
                # apiserver_request_total over the Run (all clients, WATCH excluded), beside the audit log's
                "apiserver_requests_total": sum(totals.values()),
                "wall": [began_wall, time.time()],
            }
            log(f"{name}: {found[name]['phase']} in {took:.0f}s, {found[name]['tool_log']}")
    finally:
        operator.stop()
    return found


def cluster_phase(args: argparse.Namespace, results: dict[str, Any]) -> None:
    state_dir = Path(tempfile.mkdtemp(prefix="agentrun-agent-state-"))
    policy = state_dir / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    audit = state_dir / "audit.log"
    flags = [f"--audit-policy-file={policy}", f"--audit-log-path={audit}", "--audit-log-maxsize=0"]
    cluster = LocalCluster(state_dir=state_dir / "cluster", apiserver_flags=flags)
    cluster.start()
    try:
        kube = Kube(cluster.kubeconfig, Path(cluster.binary("kubectl")))
        install_crds(kube)
        results["direct"] = direct(cluster, kube, args)
        runs = operator_runs(cluster, kube, args, state_dir)
        entries = audit_entries(audit)
        keys = (
            "requests_worker",
            "requests_operator",
            "requests_other",
            "etcd_revisions",
            "etcd_bytes_printed",
            "etcd_bytes_compact",
            "created_bytes_printed",
            "created_bytes_compact",
        )
        for name in runs:
            rows = per_superstep(entries, NAMESPACE, name)
            start, end = runs[name].pop("wall")
            audited = sum(1 for e in entries if start <= when(e["stageTimestamp"]) <= end)
            runs[name] |= windows(rows, keys) | {
                "audited_requests": audited,
                "supersteps": len(rows),
                "rows": rows,
            }
        results["operator"] = runs
    finally:
        cluster.stop()
        if not args.keep:
            shutil.rmtree(state_dir, ignore_errors=True)
        else:
            log(f"kept {state_dir}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--phases", nargs="+", choices=("baselines", "cluster"), default=["baselines", "cluster"]
    )
    parser.add_argument("--calls", type=int, default=CALLS)
    parser.add_argument("--output-bytes", type=int, default=OUTPUT_BYTES)
    parser.add_argument(
        "--kills",
        default=",".join(f"{a}={n}" for a, n in KILLS.items()),
        help="attempt=tool call at whose start it kills itself (a1=60,a2=140)",
    )
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the figures go (JSON)")
    parser.add_argument("--keep", action="store_true", help="keep the cluster's directory (audit log, logs)")
    args = parser.parse_args()
    out: Path = args.results
    results: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    args.kills = {a: int(n) for a, n in (part.split("=") for part in args.kills.split(","))}
    results["args"] = {"calls": args.calls, "outputBytes": args.output_bytes, "kills": args.kills}
    if "baselines" in args.phases:
        baselines(args, results)
        out.write_text(json.dumps(results, indent=1) + "\n")
    if "cluster" in args.phases:
        cluster_phase(args, results)
        out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(summary(results), indent=1))
    print(markdown(results))


def _kib(n: float) -> str:
    return f"{n / 1024:.1f} KiB"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def markdown(results: dict[str, Any]) -> str:
    """The tables of bench/findings.md, from the figures found so far."""
    out: list[str] = []
    runs: dict[str, Any] = results.get("operator") or {}
    if runs:
        out += [
            "| Run | phase | attempts | killed at (tool call starts) | every tool call ended once | "
            "final state complete | took |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, r in runs.items():
            attempts = ", ".join(f"{a} {p}" for a, p in r["attempts"])
            log = r["tool_log"]
            out.append(
                f"| {name} | {r['phase']} | {attempts} | {', '.join(log['killed_at'])} | "
                f"{log['every_call_ended_once']} | {r['final_state_complete']} "
                f"({r['result'].get('toolOutputs')} outputs) | {r['seconds']:.0f} s |"
            )
        out += [
            "",
            "| per superstep (median) | "
            + " | ".join(f"{n} {w}" for n in runs for w in ("8-12", "398-402"))
            + " |",
            "|---|" + "---|" * (2 * len(runs)),
        ]
        for key, label, fmt in (
            ("requests_worker", "API requests by the worker", str),
            ("requests_operator", "API requests by the operator", str),
            ("requests_other", "API requests by others in the Run's namespace (node agent, collector)", str),
            ("etcd_revisions", "object revisions written", str),
            ("etcd_bytes_printed", "bytes written to etcd, as kubectl prints them", _kib),
            ("etcd_bytes_compact", "… compact JSON", _kib),
            ("created_bytes_printed", "objects created, as printed", _kib),
            ("created_bytes_compact", "… compact JSON", _kib),
        ):
            cells = [fmt(r[w].get(key, float("nan"))) for r in runs.values() for w in ("early", "late")]
            out.append(f"| {label} | " + " | ".join(cells) + " |")
    savers: dict[str, Any] = {**(results.get("direct") or {}), **(results.get("baselines") or {})}
    savers = {
        k: v for k, v in savers.items() if isinstance(v, dict) and v["rows"][-1]["superstep"] >= LATE[-1]
    }
    if savers:
        # Means over each window, not medians: a saver's writes of one superstep may land after the mark
        # of the checkpoint (LangGraph saves pending writes in the background), which moves bytes between
        # neighbouring supersteps but not out of the window.
        out += [
            "",
            "| saver, message list | written per superstep 8-12 / 398-402 (mean) | new data per superstep | "
            "written / new data 8-12 / 398-402 / whole thread | time in the saver 8-12 / 398-402 (median) |",
            "|---|---|---|---|---|",
        ]
        for name, v in savers.items():
            rows = v["rows"]
            key = "store_bytes" if "store_bytes" in rows[0] else "stored_bytes"
            early = [r for r in rows if r["superstep"] in EARLY]
            late = [r for r in rows if r["superstep"] in LATE]

            def mean(chosen: list[dict[str, Any]], k: str) -> float:
                return float(sum(r.get(k, 0) for r in chosen)) / len(chosen)

            def ratio(chosen: list[dict[str, Any]], key: str = key) -> float:
                return float(sum(r[key] for r in chosen)) / float(max(1, sum(r["new_data"] for r in chosen)))

            extra = ""
            if "wal_bytes" in rows[0]:
                extra = f" (WAL {_kib(mean(early, 'wal_bytes'))} / {_kib(mean(late, 'wal_bytes'))})"
            if "state_object" in rows[0]:
                objects = [mean(w, "state_object") + mean(w, "writes_objects") for w in (early, late)]
                extra = f" to the store, + Checkpoint objects {_kib(objects[0])} / {_kib(objects[1])}"
            out.append(
                f"| {name} | {_kib(mean(early, key))} / {_kib(mean(late, key))}{extra} | "
                f"{_kib(mean(early, 'new_data'))} / {_kib(mean(late, 'new_data'))} | "
                f"{ratio(early):.2f} / {ratio(late):.2f} / {ratio(rows):.2f} | "
                f"{_ms(v['early']['seconds'])} / {_ms(v['late']['seconds'])} |"
            )
    return "\n".join(out)


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """Everything but the per-superstep rows."""
    out: dict[str, Any] = {}
    for part, found in results.items():
        if isinstance(found, dict):
            out[part] = {
                k: ({kk: vv for kk, vv in v.items() if kk != "rows"} if isinstance(v, dict) else v)
                for k, v in found.items()
            }
        else:
            out[part] = found
    return out


if __name__ == "__main__":
    main()
