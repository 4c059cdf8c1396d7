"""Generates the CustomResourceDefinitions of agentrun.dev from the pydantic models.

    python -m agentrun.api.crdgen                  # write crds/<plural>.agentrun.dev.yaml
    python -m agentrun.api.crdgen --check          # exit 1 and list the files that are out of date
    python -m agentrun.api.crdgen --output-dir crds --output-dir charts/agentrun/crds

pydantic emits JSON Schema 2020-12; the API server wants a structural OpenAPI v3 schema. The
conversion inlines every `$ref`, turns `anyOf: [X, null]` into `X` with `nullable: true`, drops
titles and null defaults, turns `const` into a one-value `enum`, and then checks the result against
the rules below, so a model change that would produce an invalid CRD fails here and not on apply.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from agentrun.api.attempt import Attempt
from agentrun.api.checkpoint import Checkpoint
from agentrun.api.common import GROUP, VERSION, KubernetesObject, PrinterColumn
from agentrun.api.run import Run
from agentrun.api.sideeffect import SideEffect

Schema = dict[str, Any]

KINDS: tuple[type[KubernetesObject], ...] = (Run, Attempt, Checkpoint, SideEffect)
CATEGORY = "agentrun"
DEFAULT_OUTPUT_DIR = Path("crds")
FILE_SUFFIX = f".{GROUP}.yaml"

# JSON Schema keywords a structural CRD schema cannot contain (or that this generator never emits:
# their presence means a model uses a construct the conversion does not handle).
FORBIDDEN_KEYWORDS = frozenset(
    {
        "$ref",
        "$defs",
        "title",
        "anyOf",
        "oneOf",
        "allOf",
        "not",
        "const",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "uniqueItems",
        "propertyNames",
        "discriminator",
    }
)
PRESERVE_UNKNOWN = "x-kubernetes-preserve-unknown-fields"
INT_OR_STRING = "x-kubernetes-int-or-string"
VALIDATIONS = "x-kubernetes-validations"

ROOT_PROPERTIES: Schema = {
    "apiVersion": {
        "type": "string",
        "description": "The versioned schema of this representation of an object. Servers convert "
        "recognised schemas to the latest internal value and may reject unrecognised values.",
    },
    "kind": {
        "type": "string",
        "description": "The REST resource this object represents, in CamelCase. Servers infer it from "
        "the endpoint the client submits requests to.",
    },
    # The API server owns the metadata schema: a CRD may only restrict name and generateName.
    "metadata": {"type": "object"},
}


class SchemaError(ValueError):
    """A model produced a schema that is not a valid structural CRD schema."""


# --- JSON Schema -> structural schema -----------------------------------------------------------------


def structural_schema(model: type[KubernetesObject]) -> Schema:
    """The openAPIV3Schema of a kind: structural, fully inlined, with descriptions and CEL rules."""
    raw = model.model_json_schema(by_alias=True)
    definitions = raw.pop("$defs", {})
    schema = _convert(raw, definitions, resolving=())
    schema["properties"].update(copy.deepcopy(ROOT_PROPERTIES))
    schema["required"] = [name for name in schema.get("required", []) if name not in ROOT_PROPERTIES]
    problems = structural_problems(schema)
    if problems:
        raise SchemaError(f"{model.__name__}: " + "; ".join(problems))
    return schema


def _convert(node: Schema, definitions: Schema, resolving: tuple[str, ...]) -> Schema:
    if "$ref" in node:
        name = node["$ref"].removeprefix("#/$defs/")
        if name in resolving:
            raise SchemaError(f"recursive model {name} cannot be inlined into a structural schema")
        target = _convert(definitions[name], definitions, (*resolving, name))
        siblings = {key: value for key, value in node.items() if key != "$ref"}
        return _merge(target, _convert(siblings, definitions, resolving))
    if "anyOf" in node:
        options = node["anyOf"]
        present = [option for option in options if option != {"type": "null"}]
        if len(options) != 2 or len(present) != 1:
            raise SchemaError(f"only X | None unions are supported, not {options}")
        rest = {key: value for key, value in node.items() if key != "anyOf"}
        converted = _merge(
            _convert(present[0], definitions, resolving), _convert(rest, definitions, resolving)
        )
        converted["nullable"] = True
        return converted

    converted = {}
    for key, value in node.items():
        if key == "title" or (key == "default" and value is None):
            continue
        if key == "const":
            converted["enum"] = [value]
        elif key == "description":
            converted[key] = _reflow(value)
        elif key == "properties":
            if value:
                converted[key] = {name: _convert(sub, definitions, resolving) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            converted[key] = _convert(value, definitions, resolving)
        else:
            converted[key] = copy.deepcopy(value)
    if converted.get("type") == "string" and "enum" in converted and "maxLength" not in converted:
        # Redundant for validation, but without it the CEL cost estimator assumes megabyte strings.
        converted["maxLength"] = max(len(value) for value in converted["enum"])
    return converted


def _merge(base: Schema, overrides: Schema) -> Schema:
    """A referenced schema with the referring field's keywords on top; CEL rules of both apply."""
    merged = dict(base)
    for key, value in overrides.items():
        merged[key] = [*base.get(key, []), *value] if key == VALIDATIONS else value
    return merged


def _reflow(text: str) -> str:
    """Joins wrapped docstring lines, keeping blank-line paragraph breaks."""
    paragraphs = (" ".join(paragraph.split()) for paragraph in text.split("\n\n"))
    return "\n\n".join(paragraph for paragraph in paragraphs if paragraph)


# --- structural checks --------------------------------------------------------------------------------


def schema_nodes(schema: Schema, path: str = "") -> Iterator[tuple[str, Schema]]:
    """Every schema node with its path, e.g. `.spec.agent.env[*].name` or `.metadata.labels{*}`."""
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from schema_nodes(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from schema_nodes(schema["items"], f"{path}[*]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from schema_nodes(schema["additionalProperties"], f"{path}{{*}}")


def structural_problems(schema: Schema) -> list[str]:
    """What makes a schema unfit for a CRD: not structural, unbounded, or undocumented."""
    problems = []
    for path, node in schema_nodes(schema):
        where = path or "<root>"
        problems += [f"{where}: forbidden keyword {key}" for key in FORBIDDEN_KEYWORDS & node.keys()]
        schema_type = node.get("type")
        if schema_type is None and not (node.get(PRESERVE_UNKNOWN) or node.get(INT_OR_STRING)):
            problems.append(f"{where}: no type")
        if "additionalProperties" in node and (
            not isinstance(node["additionalProperties"], dict) or "properties" in node
        ):
            problems.append(f"{where}: additionalProperties must be a schema and exclude properties")
        if schema_type == "array" and ("items" not in node or "maxItems" not in node):
            problems.append(f"{where}: an array needs items and maxItems")
        if "additionalProperties" in node and "maxProperties" not in node:
            problems.append(f"{where}: a map needs maxProperties")
        bounded = {"maxLength", "enum"} & node.keys() or node.get("format") == "date-time"
        if schema_type == "string" and not bounded and path.lstrip(".") not in ROOT_PROPERTIES:
            problems.append(f"{where}: a string needs maxLength or enum")
        is_property = path.count(".") >= 1 and not path.endswith(("[*]", "{*}"))
        if is_property and path != ".metadata" and not node.get("description"):
            problems.append(f"{where}: no description")
        for rule in node.get(VALIDATIONS, []):
            if not rule.get("message"):
                problems.append(f"{where}: CEL rule {rule['rule']!r} has no message")
    return problems


# --- CRDs ---------------------------------------------------------------------------------------------


def _printer_column(column: PrinterColumn) -> Schema:
    rendered: Schema = {
        "name": column.name,
        "type": column.type,
        "jsonPath": column.json_path,
        "description": column.description,
    }
    if column.priority:
        rendered["priority"] = column.priority
    return rendered


def printer_columns(model: type[KubernetesObject]) -> list[Schema]:
    """The kind's columns with Age after the default ones (kubectl drops Age once columns are set)."""
    age = PrinterColumn("Age", ".metadata.creationTimestamp", "date", "Time since the object was created.")
    default = [column for column in model.printer_columns if column.priority == 0]
    wide = [column for column in model.printer_columns if column.priority != 0]
    return [_printer_column(column) for column in (*default, age, *wide)]


def custom_resource_definition(model: type[KubernetesObject]) -> Schema:
    """The CustomResourceDefinition of one kind, as a dict ready for YAML or the API server."""
    kind: str = model.model_fields["kind"].default
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{model.plural}.{GROUP}", "labels": {"app.kubernetes.io/part-of": "agentrun"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": model.plural,
                "singular": kind.lower(),
                "shortNames": [model.short_name],
                "categories": [CATEGORY],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": printer_columns(model),
                    "schema": {"openAPIV3Schema": structural_schema(model)},
                }
            ],
        },
    }


def custom_resource_definitions() -> list[Schema]:
    """The CRDs of all four kinds, for crds/, the Helm chart or a test's API server."""
    return [custom_resource_definition(model) for model in KINDS]


def render(model: type[KubernetesObject]) -> str:
    """The YAML file of one kind's CRD, with a header naming its source."""
    source = "operator/" + model.__module__.replace(".", "/") + ".py"
    header = (
        "# Generated by `python -m agentrun.api.crdgen` (make crds)\n"
        f"# from {model.__module__}.{model.__name__} in {source}.\n"
        "# Do not edit: change the model and regenerate.\n"
    )
    body = yaml.safe_dump(custom_resource_definition(model), sort_keys=True, width=110, allow_unicode=True)
    return header + body


def rendered_files() -> dict[str, str]:
    """File name -> content of every generated CRD file."""
    return {f"{model.plural}{FILE_SUFFIX}": render(model) for model in KINDS}


def drifted_files(output_dir: Path, files: dict[str, str]) -> list[Path]:
    """Files in output_dir that differ from the generated ones, are missing, or are stale leftovers."""
    stale = [path for path in sorted(output_dir.glob(f"*{FILE_SUFFIX}")) if path.name not in files]
    changed = [
        output_dir / name
        for name, content in files.items()
        if not (output_dir / name).is_file() or (output_dir / name).read_text() != content
    ]
    return changed + stale


def write(output_dir: Path, files: dict[str, str]) -> list[Path]:
    """Brings output_dir up to date; returns the files written or removed."""
    output_dir.mkdir(parents=True, exist_ok=True)
    touched = drifted_files(output_dir, files)
    for path in touched:
        if path.name in files:
            path.write_text(files[path.name])
        else:
            path.unlink()
    return touched


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agentrun.api.crdgen", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--output-dir",
        action="append",
        type=Path,
        help=f"directory to write the CRDs to (repeatable; default {DEFAULT_OUTPUT_DIR})",
    )
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is out of date")
    args = parser.parse_args(argv)
    output_dirs: list[Path] = args.output_dir or [DEFAULT_OUTPUT_DIR]
    files = rendered_files()

    if args.check:
        drifted = [path for output_dir in output_dirs for path in drifted_files(output_dir, files)]
        for path in drifted:
            print(f"out of date: {path}", file=sys.stderr)
        if drifted:
            print("run `make crds` to regenerate", file=sys.stderr)
        return 1 if drifted else 0

    for output_dir in output_dirs:
        for path in write(output_dir, files):
            print(f"wrote {path}" if path.exists() else f"removed {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
