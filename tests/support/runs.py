"""Building Runs for the scenario agent and waiting on them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrun.api import API_VERSION
from agentrun.examples.manifests import IMAGE, agent_run
from support.kube import PERSON, Kube, wait_for

GROUP, VERSION = "agentrun.dev", "v1alpha1"

# Retries after one second, so retry paths take seconds in tests.
FAST_RETRY: dict[str, Any] = {
    "maxAttempts": 3,
    "backoff": {"initialSeconds": 1, "factor": 1.0, "maxSeconds": 1},
    "sameErrorLimit": 3,
}
# The scenario agent's question in the interrupt tests.
PRIORITY: dict[str, Any] = {
    "type": "object",
    "properties": {"priority": {"enum": ["low", "high"]}},
    "required": ["priority"],
    "additionalProperties": False,
}


def scenario_run(name: str, scenario: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return agent_run(name, "scenario", scenario, **spec)


TESTS_DIR = Path(__file__).resolve().parents[1]


def support_agent_run(name: str, module: str, input: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    """A Run of `python -m support.<module>`, one of the tests' own agents (e.g. the hostile agent)."""
    env = [{"name": "PYTHONPATH", "value": str(TESTS_DIR)}]
    agent = {"image": IMAGE, "command": ["python", "-m", f"support.{module}"], "env": env}
    return {
        "apiVersion": API_VERSION,
        "kind": "Run",
        "metadata": {"name": name, **metadata},
        "spec": {"agent": agent, "input": input},
    }


def create_run(kube: Kube, namespace: str, body: dict[str, Any]) -> None:
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "runs", body)


def patch_spec(kube: Kube, namespace: str, name: str, spec: dict[str, Any]) -> None:
    """A merge patch of the Run's spec, as `kubectl patch --type merge` sends it."""
    kube.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, "runs", name, {"spec": spec})


def get_run(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    run: dict[str, Any] = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "runs", name)
    return run


def attempts(kube: Kube, namespace: str, run: str) -> list[dict[str, Any]]:
    items = kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, "attempts", label_selector=f"agentrun.dev/run={run}"
    )["items"]
    return sorted(items, key=lambda a: a["spec"]["number"])


def wait_attempt_phase(
    kube: Kube, namespace: str, run: str, number: int, phases: set[str], *, timeout: float = 120
) -> dict[str, Any]:
    """The Run's Attempt `number` once it is in one of `phases`. A Run's decision is written before the
    Attempt's end (the fence comes first), so a test that saw the Run decide waits for the Attempt too."""

    def probe() -> dict[str, Any] | None:
        found = [a for a in attempts(kube, namespace, run) if a["spec"]["number"] == number]
        return found[0] if found and found[0].get("status", {}).get("phase") in phases else None

    try:
        return wait_for(probe, timeout, interval=0.2, what=f"attempt {number} of {run} in {sorted(phases)}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nattempts: {attempts(kube, namespace, run)}") from None


def wait_phase(
    kube: Kube, namespace: str, name: str, phases: set[str], timeout: float = 180
) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        run = get_run(kube, namespace, name)
        return run if run.get("status", {}).get("phase") in phases else None

    try:
        return wait_for(probe, timeout, interval=0.2, what=f"run {name} in {sorted(phases)}")
    except AssertionError as exc:
        run = get_run(kube, namespace, name)
        raise AssertionError(f"{exc}\nstatus: {run.get('status')}") from None


def resume_patch(pending: dict[str, Any], value: Any, key: str, by: str | None = None) -> dict[str, Any]:
    """The spec patch that answers a Run's pending request (status.pendingRequest) with a value, as the
    person `by` (who must send it: the API server checks)."""
    answer = {
        "requestId": pending["requestId"],
        "checkpointId": pending["checkpointId"],
        "value": value,
        "idempotencyKey": key,
    }
    return {"resume": {**answer, "answeredBy": by} if by else answer}


def resume(
    kube: Kube, namespace: str, name: str, pending: dict[str, Any], value: Any, *, key: str, by: str = PERSON
) -> None:
    """Answer the Run's pending request as the person `by`, as `kubectl agentrun resume` does."""
    patch_spec(kube.impersonating(by), namespace, name, resume_patch(pending, value, key, by))


def controls(kube: Kube, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    """The Run's recorded control outcomes (status.controls) by idempotency key."""
    return {c["idempotencyKey"]: c for c in get_run(kube, namespace, name)["status"].get("controls", [])}
