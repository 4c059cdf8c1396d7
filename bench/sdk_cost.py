"""The SDK's requests: what usage reporting and a LangGraph superstep cost the API server.

    PYTHONPATH=hack:tests .venv/bin/python bench/sdk_cost.py          # alone, on its own control plane
    (and the "SDK requests" section of `make bench`, on its real-process control plane)

- usage: one scenario Attempt (one checkpoint, then its result) with no usage reported, with one
  `ctx.add_usage` call and with 500 of them; the worker's own request counter (`KubeApi.requests`) up to
  its result, as the agent reports it (`reportRequests`).
- LangGraph: a six-node graph (tests/support/langgraph_steps.py, one task per superstep, sync
  durability); the worker's requests between the starts of two successive nodes.
"""

from __future__ import annotations

import itertools
import json
import tempfile
from pathlib import Path
from typing import Any

from harness import Bench, log, wait_until

from agentrun.examples.manifests import agent_run
from support.runs import support_agent_run

USAGE_CALLS = (0, 1, 500)
SUPERSTEPS = 6


def _succeeded(bench: Bench, ns: str, name: str) -> dict[str, Any]:
    def done() -> bool:
        run = bench.kube.custom.get_namespaced_custom_object("agentrun.dev", "v1alpha1", ns, "runs", name)
        return (run.get("status") or {}).get("phase") in ("Succeeded", "Failed")

    wait_until(done, 180, f"Run {name} finished", interval=0.5)
    run: dict[str, Any] = bench.kube.custom.get_namespaced_custom_object(
        "agentrun.dev", "v1alpha1", ns, "runs", name
    )
    assert run["status"]["phase"] == "Succeeded", run["status"]
    return run


def _create(bench: Bench, ns: str, body: dict[str, Any]) -> None:
    bench.kube.custom.create_namespaced_custom_object("agentrun.dev", "v1alpha1", ns, "runs", body)


def usage_requests(bench: Bench, ns: str) -> dict[str, int]:
    """Requests of one Attempt until its result, by the number of add_usage calls it made."""
    made = {}
    for calls in USAGE_CALLS:
        scenario: dict[str, Any] = {"steps": 1, "reportRequests": True}
        if calls:
            scenario["usage"] = {"inputTokens": 10, "modelCalls": 1, "times": calls}
        name = f"usage-{calls}"
        _create(bench, ns, agent_run(name, "scenario", scenario))
        made[str(calls)] = int(_succeeded(bench, ns, name)["status"]["result"]["apiRequests"])
    log(f"SDK requests of an Attempt until its result, by add_usage calls: {made}")
    return made


def langgraph_superstep_requests(bench: Bench, ns: str, log_dir: Path) -> list[int]:
    """The worker's requests per superstep of a graph with one task per superstep."""
    steps_log = log_dir / "langgraph-steps.log"
    body = support_agent_run("supersteps", "langgraph_steps", {"steps": SUPERSTEPS})
    body["spec"]["agent"]["env"].append({"name": "AGENTRUN_STEP_LOG", "value": str(steps_log)})
    _create(bench, ns, body)
    _succeeded(bench, ns, "supersteps")
    counts = [int(line.split()[2]) for line in steps_log.read_text().splitlines()]
    per_superstep = [b - a for a, b in itertools.pairwise(counts)]
    log(f"LangGraph: API requests per superstep (sync durability, one task): {per_superstep}")
    return per_superstep


def measure(bench: Bench, log_dir: Path) -> dict[str, Any]:
    return {
        "requests_by_usage_calls": usage_requests(bench, bench.namespace("sdk-usage")),
        "langgraph_requests_per_superstep": langgraph_superstep_requests(
            bench, bench.namespace("sdk-langgraph"), log_dir
        ),
    }


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="agentrun-sdk-cost-") as tmp:
        bench = Bench(Path(tmp), instant=False)
        try:
            bench.start()
            print(json.dumps(measure(bench, Path(tmp)), indent=1))
        finally:
            bench.stop()


if __name__ == "__main__":
    main()
