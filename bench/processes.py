"""What needs real worker processes (a control plane of its own, the node agent in its default mode).

- echo: Runs created one at a time (2 per second): Run applied -> Run Succeeded with a real Python
  process per attempt (interpreter start and imports included), for comparison with the instant node.
- killed: a Run's worker process is SIGKILLed while its agent works (lease 10 s, renewed every 2 s;
  retry after 1 s). The node agent reports the exit (137) at once, the operator classifies it
  (infrastructure), waits the retry backoff and starts the next Attempt. Measured: kill -> next
  attempt's agent container running, and the same minus the 1 s backoff.
- frozen: the worker is SIGSTOPped instead (its Pod looks alive): only the lease can tell. Measured:
  stop -> next attempt's agent container running; and from the last renewal seen before the freeze (the
  lease runs out a lease duration after it) -> next attempt running, minus the lease duration (10 s), and
  minus the lease and the 1 s retry backoff (a lease_lost Attempt is retried after the backoff too).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from typing import Any

from harness import Bench, JsonDict, first_times, log, runs_path, wait_until
from latency import HANG, _run_event, stats

from agentrun.examples.manifests import agent_run

LEASE_SECONDS = 10
LEASE = {"durationSeconds": LEASE_SECONDS, "renewSeconds": 2}
BACKOFF_SECONDS = 1
RETRY = {
    "maxAttempts": 3,
    "backoff": {"initialSeconds": BACKOFF_SECONDS, "factor": 1.0, "maxSeconds": BACKOFF_SECONDS},
}


def echo(bench: Bench, ns: str, n: int, rate: float = 2.0) -> dict[str, Any]:
    runs = bench.recorder(runs_path(ns), _run_event)
    api = bench.api(2)
    sent: dict[str, float] = {}

    async def create() -> None:
        for i in range(n):
            name = f"p{i}"
            sent[name] = time.monotonic()
            await api.create(runs_path(ns), agent_run(name, "echo", {"i": i}))
            await asyncio.sleep(1 / rate)

    try:
        asyncio.run(create())
    finally:
        api.close()

    def done() -> dict[str, float]:
        return first_times(runs.snapshot(), lambda e: e[0] if e[1] in ("Succeeded", "Failed") else None)

    wait_until(lambda: set(sent) <= set(done()), 180, f"{n} process Runs finished")
    runs.stop()
    finished = done()
    result = {"applied_to_succeeded": stats([finished[k] - sent[k] for k in sent])}
    log(f"processes echo: {result}")
    return result


def _attempt_pod(kind: str, obj: JsonDict) -> tuple[str, int, bool] | None:
    """(run, attempt number, agent container running) of an attempt Pod (named <run>-a<number>)."""
    run, _, number = obj["metadata"]["name"].rpartition("-a")
    if not run or not number.isdigit():
        return None
    statuses = (obj.get("status") or {}).get("containerStatuses") or []
    running = bool(statuses) and "running" in (statuses[0].get("state") or {})
    return run, int(number), running


def _pid(pod: JsonDict) -> int:
    container_id = pod["status"]["containerStatuses"][0]["containerID"]
    return int(container_id.removeprefix("process://"))


def replacement(bench: Bench, ns: str, n: int) -> dict[str, Any]:
    pods = bench.recorder(f"/api/v1/namespaces/{ns}/pods", _attempt_pod)
    leases = bench.recorder(
        f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
        lambda kind, obj: obj["metadata"]["name"].removesuffix(".run.agentrun.dev"),
    )
    api = bench.api(8)
    kinds = {f"k{i}": signal.SIGKILL for i in range(n)} | {f"f{i}": signal.SIGSTOP for i in range(n)}

    async def create() -> None:
        for name in kinds:
            body = agent_run(name, "scenario", HANG, lease=LEASE, retry=RETRY)
            await api.create(runs_path(ns), body)

    asyncio.run(create())

    def running(attempt: int) -> dict[str, float]:
        return first_times(pods.snapshot(), lambda e: e[0] if e[2] and e[1] == attempt else None)

    wait_until(lambda: set(kinds) <= set(running(1)), 180, f"{len(kinds)} worker processes running")
    time.sleep(2.5)  # past the SDK's first renewals, inside the agent
    log(f"processes: {len(kinds)} workers running; killing {n}, freezing {n}")
    hit: dict[str, float] = {}
    frozen: list[int] = []
    lost_before = []
    for name, sig in kinds.items():
        pod = bench.kube.get("pod", f"{name}-a1", ns)
        if pod is None or pod.get("status", {}).get("phase") != "Running":
            lost_before.append(name)  # e.g. a worker that lost its lease under load before the measure
            continue
        pid = _pid(pod)
        hit[name] = time.monotonic()
        os.killpg(pid, sig)
        if sig == signal.SIGSTOP:
            frozen.append(pid)
        time.sleep(0.3)
    try:
        wait_until(lambda: set(hit) <= set(running(2)), 120, "every next attempt running")
    finally:
        for pid in frozen:  # the operator deleted their Pods; never leave a stopped process behind
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        api.close()
        pods.stop()
        leases.stop()
    second = running(2)
    lease_events = leases.snapshot()

    def last_renewal(run: str) -> float:
        return max(t for t, name in lease_events if name == run and t <= hit[run])

    killed = [second[k] - hit[k] for k in hit if kinds[k] == signal.SIGKILL]
    stopped = [second[k] - hit[k] for k in hit if kinds[k] == signal.SIGSTOP]
    # the lease runs out a lease duration after its last renewal, which came before the freeze
    renewed = [second[k] - last_renewal(k) for k in hit if kinds[k] == signal.SIGSTOP]
    result = {
        "workers": n,
        "not_running_at_the_kill": len(lost_before),
        "kill_to_next_running": stats(killed),
        "kill_to_next_running_minus_backoff": stats([v - BACKOFF_SECONDS for v in killed]),
        "freeze_to_next_running": stats(stopped),
        "last_renewal_to_next_running_minus_lease": stats([v - LEASE_SECONDS for v in renewed]),
        "last_renewal_to_next_running_minus_lease_and_backoff": stats(
            [v - LEASE_SECONDS - BACKOFF_SECONDS for v in renewed]
        ),
    }
    log(f"processes replacement: {result}")
    return result
