"""The architecture the import-linter contracts in pyproject.toml hold, and proof that they would catch a
breach: each contract is run over a copy of the package with one offending import added (the package
itself keeps every contract, see the first test)."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = str(Path(sys.executable).with_name("lint-imports"))


def lint_imports(root: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    """lint-imports with the project's contracts over the package under root/operator."""
    selected = [arg for contract in contracts for arg in ("--contract", contract)]
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache", "--no-logo", *selected],
        cwd=root,
        env={"PYTHONPATH": str(root / "operator"), "PATH": ""},
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture
def package_copy(tmp_path: Path) -> Path:
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    shutil.copytree(
        REPO / "operator" / "agentrun",
        tmp_path / "operator" / "agentrun",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    return tmp_path


def test_the_contracts_hold_for_the_package() -> None:
    out = lint_imports(REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken." in out.stdout


# case (a contract id, maybe with a suffix) -> (new modules under agentrun/ and what each imports, what
# the report must name). New modules, so that the cases do not depend on what existing modules hold.
BREACHES: dict[str, tuple[dict[str, str], str]] = {
    "core-pure": ({"core/breach.py": "agentrun.tracing"}, "agentrun.core.breach -> agentrun.tracing"),
    # indirect: core imports an api module that would read the clock
    "core-pure-indirectly": (
        {"core/breach.py": "agentrun.api.breach", "api/breach.py": "time"},
        "agentrun.api.breach -> time",
    ),
    "layers": ({"api/breach.py": "agentrun.core"}, "agentrun.api.breach -> agentrun.core"),
    "layers-exhaustive": ({"misc.py": "typing"}, "not listed as layers:\n\n- agentrun.misc"),
    "programs-independent": ({"worker/breach.py": "agentrun.cli"}, "agentrun.worker.breach -> agentrun.cli"),
    "deploy-without-operator": (
        {"deploy/breach.py": "agentrun.operator"},
        "agentrun.deploy.breach -> agentrun.operator",
    ),
    "agents-on-the-sdk": (
        {"integrations/breach.py": "agentrun.operator"},
        "agentrun.integrations.breach -> agentrun.operator",
    ),
    "integrations-on-the-public-sdk": (
        {"integrations/breach.py": "agentrun.worker.session"},
        "agentrun.integrations.breach -> agentrun.worker.session",
    ),
    "api-declarative": ({"api/breach.py": "asyncio"}, "agentrun.api.breach -> asyncio"),
    "operator-runtime": ({"cli/breach.py": "kopf"}, "agentrun.cli.breach -> kopf"),
    "kubernetes-client": ({"worker/breach.py": "kubernetes"}, "agentrun.worker.breach -> kubernetes"),
    "object-store-client": ({"worker/breach.py": "obstore"}, "agentrun.worker.breach -> obstore"),
}


@pytest.mark.parametrize(("case", "breach"), BREACHES.items(), ids=BREACHES.keys())
def test_a_contract_catches_its_breach(
    package_copy: Path, case: str, breach: tuple[dict[str, str], str]
) -> None:
    modules, named = breach
    for module, imported in modules.items():
        (package_copy / "operator" / "agentrun" / module).write_text(f"import {imported}\n")
    out = lint_imports(package_copy, case.removesuffix("-indirectly").removesuffix("-exhaustive"))
    assert out.returncode == 1, out.stdout + out.stderr
    assert named in out.stdout + out.stderr


def loaded_after_import(*modules: str) -> set[str]:
    """The modules a fresh interpreter has loaded after importing these (dynamic imports included)."""
    code = "import sys\n" + "".join(f"import {m}\n" for m in modules) + "print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_the_chart_generator_and_helm_test_load_no_operator_runtime() -> None:
    loaded = loaded_after_import("agentrun.deploy.generate", "agentrun.deploy.selftest")
    assert {m for m in loaded if m.split(".")[0] in ("kopf", "prometheus_client")} == set()
    assert {m for m in loaded if m.startswith("agentrun.operator")} == set()


def test_the_decisions_load_no_client_and_no_other_layer() -> None:
    core = sorted(
        f"agentrun.core.{path.stem}" for path in (REPO / "operator" / "agentrun" / "core").glob("[!_]*.py")
    )
    loaded = loaded_after_import(*core)
    project = {m.split(".")[1] for m in loaded if m.startswith("agentrun.")}
    assert project <= {"api", "core", "admission", "rbac"}
    assert {m.split(".")[0] for m in loaded} & {"kubernetes", "kopf", "aiohttp", "urllib3"} == set()


# What an attempt Pod never calls, or calls only on a path most Attempts do not take: importing the SDK
# must not load it (each is imported where it is used). Start-up time is measured in bench/, not here.
NOT_FOR_THE_WORKER = {
    "kubernetes": "the official client: agentrun.kubeauth reads kubeconfigs itself",
    "urllib3": "the official client's transport",
    "yaml": "a kubeconfig is read only when there is one (not in a Pod)",
    "jsonschema": "only an answer to a request with a schema is validated",
    "kopf": "the operator's runtime",
    "prometheus_client": "the operator's metrics",
}


def test_the_worker_sdk_loads_nothing_it_does_not_use() -> None:
    loaded = loaded_after_import("agentrun.worker")
    assert {m.split(".")[0] for m in loaded} & NOT_FOR_THE_WORKER.keys() == set()
    # OpenTelemetry (agentrun[otel]) only once an OTLP endpoint turns tracing on: nothing but the
    # empty namespace package its presence is looked up in
    assert {m for m in loaded if m.startswith("opentelemetry.")} == set()
    programs = ("agentrun.operator", "agentrun.cli", "agentrun.deploy")
    assert {m for m in loaded if m.startswith(programs)} == set()


def run_after_import(module: str, code: str) -> str:
    """What `code` prints in a fresh interpreter that has imported `module`."""
    script = f"import {module}\n{code}"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout


def test_importing_the_worker_sdk_builds_no_model_and_reads_no_ca_bundle() -> None:
    """The two costs that were half of the SDK's import: every model's validator (built when a model is
    first used) and aiohttp's default TLS contexts reading the system's CA bundle (at their first
    handshake, agentrun.deferredtls)."""
    check = (
        "import ssl, pydantic\n"
        "from agentrun.api import ApiModel\n"
        "import aiohttp.connector as connector\n"
        "models, pending = [], [ApiModel]\n"
        "while pending:\n"
        "    models.append(pending.pop()); pending.extend(models[-1].__subclasses__())\n"
        "print(sum(m.__pydantic_complete__ for m in models), len(models))\n"
        # aiohttp's own names for its two default contexts (ssl=True, ssl=False)
        "for context in (connector._SSL_CONTEXT_VERIFIED, connector._SSL_CONTEXT_UNVERIFIED):\n"
        "    print(ssl.SSLContext.cert_store_stats(context)['x509'])\n"
    )
    built, models, verified, unverified = map(int, run_after_import("agentrun.worker", check).split())
    assert (built, verified, unverified) == (0, 0, 0) and models > 40
    assert "pydantic.plugin._loader" not in loaded_after_import("agentrun.worker")  # no validator made


# ---- the clock: one injected object (agentrun.clock), read nowhere else --------------------------------

# What reads the machine's clock or waits on it: every such read and sleep in the package goes through the
# Clock the program was given (agentrun.clock), so that a test's fake clock reaches it; a line that cannot
# (a request signature, a duration measured for a metric) says why in a `# clock-exempt: <why>` comment.
CLOCK_READS = frozenset(
    {
        *(f"time.{name}" for name in ("time", "time_ns", "monotonic", "monotonic_ns", "sleep")),
        *(f"time.{name}" for name in ("perf_counter", "perf_counter_ns", "gmtime", "localtime", "ctime")),
        "asyncio.sleep",
        *(
            f"{cls}.{name}"
            for cls in ("datetime", "datetime.datetime")
            for name in ("now", "utcnow", "today")
        ),
        "date.today",
        "datetime.date.today",
    }
)
EXEMPT = re.compile(r"#.*\bclock-exempt: *\S")
CLOCK_MODULE = Path("agentrun") / "clock.py"


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (base := _dotted(node.value)) is not None:
        return f"{base}.{node.attr}"
    return None


def direct_clock_reads(source: str, where: str) -> list[str]:
    """Each direct read of the clock or sleep in `source` (a reference, called or not, or an import of
    one by name) whose lines carry no clock-exempt comment, as 'where:line: what'."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Attribute) and (dotted := _dotted(node)) in CLOCK_READS:
            names = [dotted]
        elif isinstance(node, ast.ImportFrom) and node.module in ("time", "asyncio", "datetime"):
            names = [
                f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in CLOCK_READS
            ]
        first, last = getattr(node, "lineno", 1), getattr(node, "end_lineno", 0)
        if names and not any(EXEMPT.search(lines[n - 1]) for n in range(first, last + 1)):
            found += [f"{where}:{first}: {name}" for name in names]
    return found


def test_every_clock_read_and_sleep_in_the_package_goes_through_the_injected_clock() -> None:
    package = REPO / "operator" / "agentrun"
    found = [
        read
        for path in sorted(package.rglob("*.py"))
        if path.relative_to(package.parent) != CLOCK_MODULE
        for read in direct_clock_reads(path.read_text(), str(path.relative_to(REPO)))
    ]
    assert found == [], "read the time and sleep through agentrun.clock (or say why not: clock-exempt)"


def test_the_clock_scan_finds_each_kind_of_direct_read() -> None:
    breaches = {
        "import time\nstarted = time.monotonic()\n": "time.monotonic",
        "import time\nclock = time.time\n": "time.time",
        "import asyncio\nasync def f() -> None:\n    await asyncio.sleep(1)\n": "asyncio.sleep",
        "import datetime\nnow = datetime.datetime.now(datetime.UTC)\n": "datetime.datetime.now",
        "from datetime import UTC, datetime\nnow = datetime.now(UTC)\n": "datetime.now",
        "from time import monotonic\n": "time.monotonic",
        "import time\nstarted = time.perf_counter()  # clock-exempt:\n": "time.perf_counter",  # no reason
    }
    for source, name in breaches.items():
        assert [r.split(": ", 1)[1] for r in direct_clock_reads(source, "m.py")] == [name], source
    justified = "import time\nstarted = time.perf_counter()  # clock-exempt: a duration for a metric\n"
    assert direct_clock_reads(justified, "m.py") == []
    assert (
        direct_clock_reads("from datetime import UTC, datetime\nwhen = datetime(2026, 1, 1)\n", "m.py") == []
    )
