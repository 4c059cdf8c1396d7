"""Latencies of one Run's life, on the instant node (the SDK protocol is real, the process start is not).

- lifecycle: echo Runs and failing Runs (the scenario agent raising PermanentError, maxAttempts 1),
  created alternately at a steady rate. Run applied (create request sent) -> attempt Pod created (the
  Pod's ADDED event); the worker's commit seen (the first Run event carrying status.result) -> Run
  Succeeded (a Run is Succeeded when its commit is seen, usually before the Pod has exited); Pod exit
  (the first Pod event with the agent container terminated) -> Run terminal, on the failing Runs (their
  Pod's exit is what ends them).
- cancel: Runs whose agent works for an hour. Once every one runs, each gets `spec.cancelEpoch: 1` (a
  merge patch, as `kubectl patch` sends it) and, as soon as that patch has returned, a commit by a worker
  still holding the Attempt's epochs (the SDK's Session.commit, with the Attempt's identity): cancel
  patch sent -> that commit refused (FenceRejected returned to the worker); cancel patch sent -> Run
  Cancelled.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from harness import Bench, JsonDict, create_all, first_times, log, percentile, runs_path, wait_until

from agentrun.api import RUN_LABEL
from agentrun.examples.manifests import agent_run
from agentrun.worker.errors import FenceRejected
from agentrun.worker.identity import Identity
from agentrun.worker.session import Session

ONE_ATTEMPT = {"maxAttempts": 1}
HANG = {"steps": 1, "stepSeconds": 3600}


def _run_event(kind: str, obj: JsonDict) -> tuple[str, str | None, bool]:
    status = obj.get("status") or {}
    return obj["metadata"]["name"], status.get("phase"), bool(status.get("result"))


def _pod_event(kind: str, obj: JsonDict) -> tuple[str, str, str] | None:
    """(run, event type, agent container state: running | terminated | "")"""
    run = (obj["metadata"].get("labels") or {}).get(RUN_LABEL)
    if not run:
        return None
    statuses = (obj.get("status") or {}).get("containerStatuses") or []
    state = statuses[0].get("state", {}) if statuses else {}
    return run, kind, "running" if "running" in state else "terminated" if "terminated" in state else ""


def stats(values: list[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "p50_ms": round(percentile(values, 0.5) * 1000, 1),
        "p99_ms": round(percentile(values, 0.99) * 1000, 1),
        "max_ms": round(max(values) * 1000, 1) if values else None,
    }


def lifecycle(bench: Bench, ns: str, n: int, rate: float) -> dict[str, Any]:
    runs = bench.recorder(runs_path(ns), _run_event)
    pods = bench.recorder(f"/api/v1/namespaces/{ns}/pods", _pod_event)
    api = bench.api(4)
    sent: dict[str, float] = {}

    async def create() -> None:
        began = time.monotonic()
        for i in range(2 * n):
            name = f"ok{i // 2}" if i % 2 == 0 else f"fail{i // 2}"
            body = (
                agent_run(name, "echo", {"i": i})
                if i % 2 == 0
                else agent_run(name, "scenario", {"fail": {"how": "permanent"}}, retry=ONE_ATTEMPT)
            )
            delay = began + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            sent[name] = time.monotonic()
            await api.create(runs_path(ns), body)

    try:
        asyncio.run(create())
    finally:
        api.close()
    names = set(sent)

    def terminal() -> dict[str, float]:
        return first_times(runs.snapshot(), lambda e: e[0] if e[1] in ("Succeeded", "Failed") else None)

    wait_until(lambda: names <= set(terminal()), 300, f"{len(names)} lifecycle Runs terminal")
    time.sleep(1.0)
    runs.stop()
    pods.stop()
    run_events, pod_events = runs.snapshot(), pods.snapshot()
    done = terminal()
    phases = {e[0]: e[1] for _, e in run_events if e[1] in ("Succeeded", "Failed")}
    pod_added = first_times(pod_events, lambda e: e[0] if e[1] == "ADDED" else None)
    pod_exit = first_times(pod_events, lambda e: e[0] if e[2] == "terminated" else None)
    committed = first_times(run_events, lambda e: e[0] if e[2] else None)
    pod_running = first_times(pod_events, lambda e: e[0] if e[2] == "running" else None)
    ok = sorted(n_ for n_ in names if n_.startswith("ok"))
    failing = sorted(n_ for n_ in names if n_.startswith("fail"))
    wrong = [n_ for n_ in ok if phases.get(n_) != "Succeeded"] + [
        n_ for n_ in failing if phases.get(n_) != "Failed"
    ]
    succeeded_before_exit = sum(1 for n_ in ok if done[n_] < pod_exit.get(n_, float("inf")))
    result = {
        "runs": len(names),
        "rate_per_s": rate,
        "unexpected_phase": len(wrong),
        "applied_to_pod_created": stats([pod_added[n_] - sent[n_] for n_ in names if n_ in pod_added]),
        "commit_seen_to_succeeded": stats([done[n_] - committed[n_] for n_ in ok if n_ in committed]),
        "pod_exit_to_failed": stats([done[n_] - pod_exit[n_] for n_ in failing if n_ in pod_exit]),
        "applied_to_succeeded": stats([done[n_] - sent[n_] for n_ in ok]),
        # where the time of an echo Run goes: operator, node (token, start), SDK protocol, operator
        "stages": {
            "applied_to_pod_created": stats([pod_added[n_] - sent[n_] for n_ in ok if n_ in pod_added]),
            "pod_created_to_agent_running": stats(
                [pod_running[n_] - pod_added[n_] for n_ in ok if n_ in pod_running and n_ in pod_added]
            ),
            "agent_running_to_commit_seen": stats(
                [committed[n_] - pod_running[n_] for n_ in ok if n_ in committed and n_ in pod_running]
            ),
            "commit_seen_to_succeeded": stats([done[n_] - committed[n_] for n_ in ok if n_ in committed]),
        },
        "succeeded_before_pod_exit": succeeded_before_exit,
        "echo_runs": len(ok),
    }
    log(f"lifecycle: {result}")
    return result


def cancel(bench: Bench, ns: str, n: int, rate: float) -> dict[str, Any]:
    runs = bench.recorder(runs_path(ns), _run_event)
    pods = bench.recorder(f"/api/v1/namespaces/{ns}/pods", _pod_event)
    api = bench.api(16)
    names = [f"c{i}" for i in range(n)]
    bodies = (agent_run(name, "scenario", HANG, retry=ONE_ATTEMPT) for name in names)

    asyncio.run(create_all(api, runs_path(ns), bodies, concurrency=8))

    def running() -> set[str]:
        return set(first_times(pods.snapshot(), lambda e: e[0] if e[2] == "running" else None))

    wait_until(lambda: set(names) <= running(), 300, f"{n} hanging Runs running")
    time.sleep(2.0)  # every worker past its first lease renewal, inside the agent
    log(f"cancel: {n} Runs running; cancelling at {rate}/s, each followed by a late commit")
    sent: dict[str, float] = {}
    refused: dict[str, float] = {}
    outcomes: dict[str, str] = {}

    async def cancel_and_commit(name: str) -> None:
        attempt = await api.get(api.custom_path("attempts", ns, f"{name}-a1"))
        assert attempt is not None
        me = Identity(
            run=name,
            namespace=ns,
            attempt=attempt["metadata"]["name"],
            lease_epoch=int(attempt["spec"]["leaseEpoch"]),
            cancel_epoch=int(attempt["spec"].get("cancelEpoch", 0)),
            resume_from=None,
            termination_message_path="/dev/null",
        )
        worker = Session(api, me)
        sent[name] = time.monotonic()
        await api.merge_patch(api.custom_path("runs", ns, name), {"spec": {"cancelEpoch": 1}})
        try:
            await worker.commit({"late": True})
            outcomes[name] = "accepted"
        except FenceRejected as exc:
            refused[name] = time.monotonic()
            outcomes[name] = exc.reason

    async def all_cancels() -> None:
        began = time.monotonic()
        tasks = []
        for i, name in enumerate(names):
            delay = began + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(cancel_and_commit(name)))
        await asyncio.gather(*tasks)

    try:
        asyncio.run(all_cancels())
    finally:
        api.close()

    def cancelled() -> dict[str, float]:
        return first_times(runs.snapshot(), lambda e: e[0] if e[1] == "Cancelled" else None)

    wait_until(lambda: set(names) <= set(cancelled()), 120, f"{n} Runs Cancelled")
    runs.stop()
    pods.stop()
    done = cancelled()
    tally: dict[str, int] = {}
    for outcome in outcomes.values():
        tally[outcome] = tally.get(outcome, 0) + 1
    result = {
        "runs": n,
        "rate_per_s": rate,
        "commit_outcomes": tally,
        "cancel_to_commit_refused": stats([refused[n_] - sent[n_] for n_ in refused]),
        "cancel_to_cancelled": stats([done[n_] - sent[n_] for n_ in names]),
    }
    log(f"cancel: {result}")
    return result
