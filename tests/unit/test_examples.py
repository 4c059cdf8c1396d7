"""The examples run unchanged wherever the README sends them: one image name, one agents' namespace and
ServiceAccount, a command that exists, every named compensation registered, and the ticket service's
errors classed so that an outage is retried rather than taken for the agent's own failure."""

from __future__ import annotations

import ast
import asyncio
import importlib
import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic_ai import Agent
from pydantic_ai.models.function import FunctionModel

from agentrun import worker
from agentrun.examples import manifests, ticket_ledger, tickets
from agentrun.examples.pydantic_ai_agent import scripted_model
from agentrun.integrations.pydantic_ai import AgentrunDurability
from agentrun.rbac import ATTEMPT_POD_RULES
from devcluster.processes import free_port
from support.corpus import REPO

EXAMPLES = REPO / "examples"
RUNS = sorted(EXAMPLES.glob("run-*.yaml"))
AGENT_MODULES = sorted((REPO / "operator" / "agentrun" / "examples").glob("*.py"))


def chart_app_version() -> str:
    chart = yaml.safe_load((REPO / "charts" / "agentrun" / "Chart.yaml").read_text())
    return str(chart["appVersion"])


def test_runs_exist() -> None:
    assert [p.name for p in RUNS] == [
        "run-langgraph-agent.yaml",
        "run-minimal.yaml",
        "run-pydantic-ai-agent.yaml",
        "run-with-retry-and-lease.yaml",
    ]


@pytest.mark.parametrize("path", RUNS, ids=lambda p: p.name)
def test_example_run_uses_the_agent_image_and_the_agents_service_account(path: Path) -> None:
    run = yaml.safe_load(path.read_text())
    agent = run["spec"]["agent"]
    assert agent["image"] == manifests.IMAGE == f"agentrun/agent:{chart_app_version()}"
    assert agent["serviceAccountName"] == manifests.AGENTS_SERVICE_ACCOUNT
    assert "namespace" not in run["metadata"]  # applied with -n agents, like every other example
    python, flag, module = agent["command"]
    assert (python, flag) == ("python", "-m")
    assert importlib.util.find_spec(module) is not None, f"{path.name} runs {module}, which does not exist"


def test_the_ticket_examples_get_the_ticket_services_address_from_its_service() -> None:
    """agentrun turns a Pod's Service variables off by default; the ticket examples turn them on, so
    TICKETS_SERVICE_HOST/PORT reach the agent on any node (the local one has no cluster DNS)."""
    for path in RUNS:
        run = yaml.safe_load(path.read_text())
        wants_tickets = "ticket" in run["metadata"]["name"]
        template = run["spec"]["agent"].get("podTemplate", {}).get("spec", {})
        assert template.get("enableServiceLinks", False) is wants_tickets, path.name


def test_every_image_the_repository_names_is_the_versioned_one() -> None:
    version = chart_app_version()
    named = {
        "examples/tickets.yaml": (EXAMPLES / "tickets.yaml").read_text(),
        "Dockerfile": (REPO / "Dockerfile").read_text(),
        "Dockerfile.agent": (REPO / "Dockerfile.agent").read_text(),
        "README.md": (REPO / "README.md").read_text(),
        "charts/agentrun/templates/NOTES.txt": (REPO / "charts/agentrun/templates/NOTES.txt").read_text(),
    }
    for where, text in named.items():
        for tag in re.findall(
            r"agentrun/(?:agent|operator):([\w.-]+)", text.replace(".Chart.AppVersion", "")
        ):
            assert tag == version, f"{where} names an image tagged {tag!r}"
    notes = named["charts/agentrun/templates/NOTES.txt"]
    assert "agentrun/agent:{{ .Chart.AppVersion }}" in notes


def test_agents_yaml_is_generated_from_the_attempt_rules() -> None:
    assert (EXAMPLES / "agents.yaml").read_text() == manifests.agents_yaml(), (
        "examples/agents.yaml is stale: python -m agentrun.examples.manifests > examples/agents.yaml"
    )
    docs = list(yaml.safe_load_all((EXAMPLES / "agents.yaml").read_text()))
    by_kind = {doc["kind"]: doc for doc in docs}
    assert by_kind["Namespace"]["metadata"]["name"] == manifests.AGENTS_NAMESPACE
    account = by_kind["ServiceAccount"]["metadata"]
    assert account["labels"] == {"agentrun.dev/agent": "true"}
    assert by_kind["Role"]["rules"] == ATTEMPT_POD_RULES
    binding = by_kind["RoleBinding"]
    assert binding["roleRef"]["name"] == by_kind["Role"]["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": manifests.AGENTS_NAMESPACE}
    ]


def test_ticket_service_manifest_serves_on_the_port_the_examples_call() -> None:
    deployment, service = yaml.safe_load_all((EXAMPLES / "tickets.yaml").read_text())
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:3] == ["python", "-m", "agentrun.examples.ticketservice"]
    assert container["image"] == manifests.IMAGE
    assert service["metadata"]["name"] == tickets.SERVICE_NAME
    assert service["spec"]["ports"][0]["port"] == tickets.SERVICE_PORT
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]


def _named_compensations(source: str) -> set[str]:
    """Every compensation an example names: compensation="..." or "compensation": "..."."""
    return set(re.findall(r"""["']?compensation["']?\s*[=:]\s*["'](\w+)["']""", source))


def _main_call(tree: ast.Module) -> ast.Call:
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "main"
    ]
    assert len(calls) == 1
    return calls[0]


@pytest.mark.parametrize(
    "module", [p for p in AGENT_MODULES if _named_compensations(p.read_text())], ids=lambda p: p.stem
)
def test_every_compensation_an_example_names_is_registered(module: Path) -> None:
    source = module.read_text()
    named = _named_compensations(source)
    loaded = importlib.import_module(f"agentrun.examples.{module.stem}")
    keywords = {k.arg: k.value for k in _main_call(ast.parse(source)).keywords}
    assert "compensations" in keywords and "lookups" in keywords, f"{module.name}: worker.main(agent) only"
    registered = eval(compile(ast.Expression(keywords["compensations"]), module.name, "eval"), vars(loaded))
    assert named <= set(registered), f"{module.name} names {named - set(registered)} but does not register it"
    lookups = eval(compile(ast.Expression(keywords["lookups"]), module.name, "eval"), vars(loaded))
    assert "create_ticket" in lookups


def test_the_ticket_examples_all_name_close_ticket() -> None:
    names = {p.stem: _named_compensations(p.read_text()) for p in AGENT_MODULES}
    assert {stem for stem, found in names.items() if found} == {
        "ticket_agent",
        "langgraph_agent",
        "pydantic_ai_agent",
    }
    assert all(found == {"close_ticket"} for found in names.values() if found)
    assert set(ticket_ledger.COMPENSATIONS) == {"close_ticket"}


# --- the ticket service's errors, classed --------------------------------------------------------------


def test_an_unreachable_service_is_transient(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TICKET_SERVICE_URL", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(worker.TransientError, match="unreachable"):
        ticket_ledger.create("k", "t", "b")
    with pytest.raises(worker.TransientError):
        ticket_ledger.find_by_key("k")


def test_a_name_that_does_not_resolve_is_transient(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TICKET_SERVICE_URL", "http://tickets.invalid:8088")  # .invalid never resolves
    with pytest.raises(worker.TransientError, match="unreachable"):
        ticket_ledger.create("k", "t", "b")


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (tickets.TicketServiceError("down", 503), worker.TransientError),
        (tickets.RateLimitedError("slow down", 2.0), worker.RateLimited),
        (tickets.TicketServiceError("bad request", 422), tickets.TicketServiceError),
        (tickets.OutcomeUnknown("sent, no answer"), tickets.OutcomeUnknown),
    ],
)
def test_answers_are_classed(error: Exception, expected: type[Exception]) -> None:
    with pytest.raises(expected) as raised, ticket_ledger.classified():
        raise error
    assert type(raised.value) is expected or isinstance(raised.value, expected)
    if expected is worker.RateLimited:
        assert isinstance(raised.value, worker.RateLimited) and raised.value.retry_after == 2.0


# --- where the ticket service is ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "url"),
    [
        (
            {"TICKET_SERVICE_URL": "http://elsewhere:9/", "TICKETS_SERVICE_HOST": "10.0.0.7"},
            "http://elsewhere:9",
        ),
        ({"TICKETS_SERVICE_HOST": "10.0.0.7", "TICKETS_SERVICE_PORT": "8088"}, "http://10.0.0.7:8088"),
        ({"TICKETS_SERVICE_HOST": "fd00::7", "TICKETS_SERVICE_PORT": "8088"}, "http://[fd00::7]:8088"),
        ({}, "http://tickets:8088"),
    ],
)
def test_service_url(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], url: str) -> None:
    for name in ("TICKET_SERVICE_URL", "TICKETS_SERVICE_HOST", "TICKETS_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert tickets.service_url() == url


def test_a_tool_of_a_pydantic_ai_agent_hands_the_outage_on_as_transient(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pydantic AI passes a tool's TransientError on as it is, so the ledger sends the create again (and
    the Attempt ends transient, retried) instead of a deterministic failure."""
    monkeypatch.setenv("TICKET_SERVICE_URL", f"http://127.0.0.1:{free_port()}")
    agent = Agent(FunctionModel(scripted_model), name="outage", capabilities=[AgentrunDurability()])

    @agent.tool_plain
    def create_ticket(title: str) -> dict[str, Any]:
        return ticket_ledger.create("outage-key", title, "")

    with pytest.raises(worker.TransientError, match="unreachable"):
        asyncio.run(agent.run("Printer on fire"))
