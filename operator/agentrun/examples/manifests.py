"""Run manifests for the example agents (the demo and the tests build their Runs here)."""

from __future__ import annotations

from typing import Any

from agentrun.api import API_VERSION

IMAGE = "agentrun/agent:dev"  # images are not pulled on the local process node; the command runs as is


def agent_run(
    name: str, agent: str, input: Any = None, *, env: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    """A Run of `python -m agentrun.examples.<agent>`; extra keyword arguments are spec fields."""
    agent_spec: dict[str, Any] = {"image": IMAGE, "command": ["python", "-m", f"agentrun.examples.{agent}"]}
    if env:
        agent_spec["env"] = [{"name": key, "value": value} for key, value in env.items()]
    body: dict[str, Any] = {"agent": agent_spec, **spec}
    if input is not None:
        body["input"] = input
    return {"apiVersion": API_VERSION, "kind": "Run", "metadata": {"name": name}, "spec": body}
