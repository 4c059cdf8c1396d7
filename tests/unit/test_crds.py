"""The generated CRDs: in sync with the models, structural, documented, bounded and usable offline.

CEL rules need an API server to run; tests/integration exercises them. Here the OpenAPI part of the
schemas is checked with jsonschema, which is what the API server applies before CEL.
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pydantic
import pytest
import yaml

from agentrun.api import Attempt, Checkpoint, KubernetesObject, Run, SideEffect, crdgen
from support.corpus import (
    BAD_OBJECTS,
    BAD_RUNS,
    CRD_DIR,
    EXAMPLES,
    PATCH_EXAMPLES,
    RUN_EXAMPLES,
    VALID_OBJECTS,
    bad_input_id,
    load_yaml,
    set_path,
    with_changes,
)

CRDS = {crd["spec"]["names"]["kind"]: crd for crd in crdgen.custom_resource_definitions()}
MODELS: dict[str, type[KubernetesObject]] = {
    "Run": Run,
    "Attempt": Attempt,
    "Checkpoint": Checkpoint,
    "SideEffect": SideEffect,
}
KINDS = sorted(CRDS)

# The free-form JSON fields, and the PodSpec stored as sent (see agentrun.api.kube.PodSpecJson) with the
# parts its admission rules read.
POD_SPEC = ".spec.agent.podTemplate.spec"
PRESERVE_UNKNOWN_FIELDS = {
    "Run": {
        ".spec.input",
        ".spec.resume.value",
        POD_SPEC,
        *(f"{POD_SPEC}.{c}[*]" for c in ("containers", "initContainers", "ephemeralContainers")),
        *(
            f"{POD_SPEC}.{c}[*].securityContext"
            for c in ("containers", "initContainers", "ephemeralContainers")
        ),
        f"{POD_SPEC}.volumes[*]",
        f"{POD_SPEC}.volumes[*].hostPath",
        ".status.result",
        ".status.acceptedInput.value",
        ".status.pendingRequest.acceptedSchema",
        ".status.pendingRequest.action.request",
    },
    "Attempt": {".spec.input"},
    "Checkpoint": {".spec.state"},
    "SideEffect": {".status.result"},
}
NAMES = {
    "Run": ("runs", "arun"),
    "Attempt": ("attempts", "att"),
    "Checkpoint": ("checkpoints", "ckpt"),
    "SideEffect": ("sideeffects", "sfx"),
}
PRINTER_COLUMNS = {
    "Run": ["Phase", "Attempt", "Lease Epoch", "Cancel Epoch", "Waiting For", "Held By", "Age"],
    "Attempt": ["Run", "Number", "Phase", "Reason", "Pod", "Age"],
    "Checkpoint": ["Run", "Sequence", "Step", "Kind", "Age"],
    "SideEffect": ["Run", "Tool", "State", "External Reference", "Age"],
}
STRUCTURAL_FORBIDDEN = {"$ref", "$defs", "title", "anyOf", "oneOf", "allOf", "not", "const", "uniqueItems"}


def openapi_schema(kind: str) -> dict[str, Any]:
    schema: dict[str, Any] = CRDS[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def all_keys(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from all_keys(item)
    elif isinstance(value, list):
        for item in value:
            yield from all_keys(item)


def node_at(schema: dict[str, Any], path: str) -> dict[str, Any]:
    """The schema node of a field path like .spec.lease.durationSeconds."""
    node = schema
    for name in path.strip(".").split("."):
        node = node["properties"][name]
    return node


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, as `kubectl patch --type merge` applies it."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


# --- generation ---------------------------------------------------------------------------------------


def test_committed_crds_match_the_models() -> None:
    drifted = crdgen.drifted_files(CRD_DIR, crdgen.rendered_files())
    assert drifted == [], f"out of date (run `make crds`): {[str(path) for path in drifted]}"


def test_generation_is_deterministic() -> None:
    assert crdgen.rendered_files() == crdgen.rendered_files()


def test_check_lists_changed_and_stale_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = ["--output-dir", str(tmp_path)]
    assert crdgen.main(out) == 0
    assert crdgen.main(["--check", *out]) == 0

    (tmp_path / "runs.agentrun.dev.yaml").write_text("# edited by hand\n")
    (tmp_path / "gone.agentrun.dev.yaml").write_text("# a kind that no longer exists\n")
    capsys.readouterr()
    assert crdgen.main(["--check", *out]) == 1
    err = capsys.readouterr().err
    assert "runs.agentrun.dev.yaml" in err
    assert "gone.agentrun.dev.yaml" in err
    assert "attempts.agentrun.dev.yaml" not in err

    assert crdgen.main(out) == 0
    assert crdgen.main(["--check", *out]) == 0
    assert not (tmp_path / "gone.agentrun.dev.yaml").exists()


@pytest.mark.parametrize("kind", KINDS)
def test_committed_file_names_its_source(kind: str) -> None:
    text = (CRD_DIR / f"{NAMES[kind][0]}.agentrun.dev.yaml").read_text()
    assert text.startswith("# Generated by `python -m agentrun.api.crdgen`")
    assert f"# from {MODELS[kind].__module__}.{kind} in operator/agentrun/api/" in text


# --- structure ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_schema_is_structural(kind: str) -> None:
    schema = openapi_schema(kind)
    assert STRUCTURAL_FORBIDDEN.isdisjoint(all_keys(schema))
    assert crdgen.structural_problems(schema) == []
    assert schema["properties"]["metadata"] == {"type": "object"}


@pytest.mark.parametrize("kind", KINDS)
def test_every_field_is_documented(kind: str) -> None:
    schema = openapi_schema(kind)
    assert len(schema["description"]) > 40
    undocumented = [
        path
        for path, node in crdgen.schema_nodes(schema)
        if path not in ("", ".metadata") and not path.endswith(("[*]", "{*}")) and not node.get("description")
    ]
    assert undocumented == []


@pytest.mark.parametrize("kind", KINDS)
def test_preserve_unknown_fields_only_on_free_form_json(kind: str) -> None:
    preserved = {
        path
        for path, node in crdgen.schema_nodes(openapi_schema(kind))
        if node.get("x-kubernetes-preserve-unknown-fields")
    }
    assert preserved == PRESERVE_UNKNOWN_FIELDS[kind]


@pytest.mark.parametrize("kind", KINDS)
def test_strings_arrays_and_maps_are_bounded(kind: str) -> None:
    for path, node in crdgen.schema_nodes(openapi_schema(kind)):
        if node.get("type") == "array":
            assert "maxItems" in node, path
        if "additionalProperties" in node:
            assert "maxProperties" in node, path
        if node.get("type") == "string" and path not in (".apiVersion", ".kind"):
            assert "maxLength" in node or node.get("format") == "date-time", path


@pytest.mark.parametrize("kind", KINDS)
def test_crd_names_scope_and_subresources(kind: str) -> None:
    crd = CRDS[kind]
    plural, short_name = NAMES[kind]
    assert crd["metadata"]["name"] == f"{plural}.agentrun.dev"
    assert crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"] == {
        "kind": kind,
        "listKind": f"{kind}List",
        "plural": plural,
        "singular": kind.lower(),
        "shortNames": [short_name],
        "categories": ["agentrun"],
    }
    (version,) = crd["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}


@pytest.mark.parametrize("kind", KINDS)
def test_printer_columns_tell_the_story(kind: str) -> None:
    columns = CRDS[kind]["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [column["name"] for column in columns if not column.get("priority")] == PRINTER_COLUMNS[kind]
    schema = openapi_schema(kind)
    for column in columns:
        assert column["description"]
        if column["jsonPath"] != ".metadata.creationTimestamp":
            field = node_at(schema, column["jsonPath"])
            expected = {"integer": "integer", "string": "string"}[column["type"]]
            assert field["type"] == expected, column


# --- CEL rules ----------------------------------------------------------------------------------------


def rules(kind: str) -> list[tuple[str, dict[str, str]]]:
    return [
        (path, rule)
        for path, node in crdgen.schema_nodes(openapi_schema(kind))
        for rule in node.get("x-kubernetes-validations", [])
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_rules_explain_what_to_fix(kind: str) -> None:
    for path, rule in rules(kind):
        assert len(rule["message"]) > 30, (path, rule)
        assert rule.get("reason", "FieldValueInvalid") in {
            "FieldValueInvalid",
            "FieldValueForbidden",
            "FieldValueRequired",
            "FieldValueDuplicate",
        }


@pytest.mark.parametrize("kind", KINDS)
def test_transition_rules_sit_where_old_and_new_values_correlate(kind: str) -> None:
    # The API server only evaluates oldSelf where it can pair old and new values: never inside
    # atomic lists or maps.
    for path, rule in rules(kind):
        if "oldSelf" in rule["rule"]:
            assert "[*]" not in path and "{*}" not in path, (path, rule)


@pytest.mark.parametrize(
    ("kind", "path", "fragment"),
    [
        ("Run", "", "size(self.metadata.name) <= 48"),
        ("Run", "", "self.spec.cancelEpoch == oldSelf.spec.cancelEpoch"),
        ("Run", "", "self.status.committedBy.cancelEpoch == self.spec.cancelEpoch"),
        ("Run", "", "self.status.committedBy.leaseEpoch == self.status.leaseEpoch"),
        ("Run", ".spec.cancelEpoch", "self >= oldSelf"),
        ("Run", ".spec.lease", "self.renewSeconds < self.durationSeconds"),
        ("Run", ".spec.resume", "self.idempotencyKey != oldSelf.idempotencyKey || self == oldSelf"),
        ("Run", ".spec.retryRequest", "self.idempotencyKey != oldSelf.idempotencyKey || self == oldSelf"),
        ("Run", ".spec.pause", "self.requestId != oldSelf.requestId || self == oldSelf"),
        ("Attempt", ".spec", "self == oldSelf"),
        ("Attempt", "", "has(self.status) && has(self.status.phase)"),
        ("Checkpoint", ".spec", "self == oldSelf"),
        ("SideEffect", ".spec", "self == oldSelf"),
        ("SideEffect", ".status.state", "(oldSelf == 'Confirmed' && self in ['Compensated'])"),
        ("SideEffect", ".status", "has(self.resolvedBy)"),
    ],
)
def test_rule_is_attached(kind: str, path: str, fragment: str) -> None:
    assert any(fragment in rule["rule"] for at, rule in rules(kind) if at == path)


# --- defaults -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "default"),
    [
        (".spec.lease", {"durationSeconds": 100, "renewSeconds": 60}),
        (".spec.lease.durationSeconds", 100),
        (".spec.lease.renewSeconds", 60),
        (
            ".spec.retry",
            {
                "maxAttempts": 3,
                "backoff": {"initialSeconds": 5, "factor": 2.0, "maxSeconds": 300},
                "retryOn": ["transient", "rate_limited", "infrastructure", "lease_lost"],
                "sameErrorLimit": 2,
            },
        ),
        (".spec.retry.maxAttempts", 3),
        (".spec.retry.backoff", {"initialSeconds": 5, "factor": 2.0, "maxSeconds": 300}),
        (".spec.retry.backoff.initialSeconds", 5),
        (".spec.retry.backoff.factor", 2.0),
        (".spec.retry.backoff.maxSeconds", 300),
        (".spec.retry.retryOn", ["transient", "rate_limited", "infrastructure", "lease_lost"]),
        (".spec.retry.sameErrorLimit", 2),
        (".spec.cancelEpoch", 0),
        (".spec.checkpointRetention", 20),
    ],
)
def test_run_defaults_are_in_the_schema(path: str, default: Any) -> None:
    assert node_at(openapi_schema("Run"), path)["default"] == default


def apply_schema_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """Defaulting as the API server does it: missing properties of present objects get their default."""
    if not isinstance(value, dict) or "properties" not in schema:
        return value
    result = dict(value)
    for name, sub in schema["properties"].items():
        if name not in result and "default" in sub:
            result[name] = copy.deepcopy(sub["default"])
        if name in result:
            result[name] = apply_schema_defaults(result[name], sub)
    return result


def test_server_defaulting_matches_the_python_defaults() -> None:
    minimal = load_yaml(EXAMPLES / "run-minimal.yaml")
    defaulted_by_server = apply_schema_defaults(minimal, openapi_schema("Run"))["spec"]
    defaulted_by_python = Run.model_validate(minimal).to_api()["spec"]
    assert defaulted_by_server == defaulted_by_python


# --- examples and bad input, against the OpenAPI schema -----------------------------------------------


def schema_errors(kind: str, instance: Any) -> list[str]:
    validator = jsonschema.Draft202012Validator(openapi_schema(kind))
    return [error.message for error in validator.iter_errors(instance)]


def test_there_is_an_example_per_control_operation() -> None:
    assert {path.name for path in PATCH_EXAMPLES} == {
        "cancel.patch.yaml",
        "resume.patch.yaml",
        "retry.patch.yaml",
        "pause.patch.yaml",
        "compensate.patch.yaml",
    }
    assert {path.name for path in RUN_EXAMPLES} == {
        "run-minimal.yaml",
        "run-with-retry-and-lease.yaml",
        "run-langgraph-agent.yaml",
        "run-pydantic-ai-agent.yaml",
    }


@pytest.mark.parametrize("example", RUN_EXAMPLES, ids=lambda path: path.name)
def test_run_example_is_valid(example: Path) -> None:
    run = load_yaml(example)
    assert schema_errors("Run", run) == []
    command = Run.model_validate(run).spec.agent.command
    assert command is not None
    assert command[:2] == ["python", "-m"]
    assert command[2].startswith("agentrun.examples.")
    assert importlib.util.find_spec(command[2]) is not None  # an example agent that exists


@pytest.mark.parametrize("patch", PATCH_EXAMPLES, ids=lambda path: path.name)
def test_patch_example_applies_to_the_minimal_run(patch: Path) -> None:
    text = patch.read_text()
    assert f"kubectl patch run -n agents echo --type merge --patch-file examples/{patch.name}" in text
    patched = merge_patch(load_yaml(EXAMPLES / "run-minimal.yaml"), yaml.safe_load(text))
    assert schema_errors("Run", patched) == []
    Run.model_validate(patched)


BAD_RUN_IDS = [f"{path}={value!r:.20}" for path, value in BAD_RUNS]


@pytest.mark.parametrize(("path", "value"), BAD_RUNS, ids=BAD_RUN_IDS)
def test_bad_run_is_refused_by_the_schema_and_the_model(path: str, value: Any) -> None:
    run = load_yaml(EXAMPLES / "run-minimal.yaml")
    set_path(run, path, value)
    assert schema_errors("Run", run) != []
    with pytest.raises(pydantic.ValidationError):
        Run.model_validate(run)


@pytest.mark.parametrize("kind", sorted(VALID_OBJECTS))
def test_valid_object_is_accepted(kind: str) -> None:
    assert schema_errors(kind, VALID_OBJECTS[kind]) == []
    MODELS[kind].model_validate(VALID_OBJECTS[kind])


@pytest.mark.parametrize(
    ("kind", "path", "value"), BAD_OBJECTS, ids=[bad_input_id(*case) for case in BAD_OBJECTS]
)
def test_bad_object_is_refused_by_the_schema_and_the_model(kind: str, path: str, value: Any) -> None:
    obj = with_changes(VALID_OBJECTS[kind], {path: value})
    assert schema_errors(kind, obj) != []
    with pytest.raises(pydantic.ValidationError):
        MODELS[kind].model_validate(obj)
