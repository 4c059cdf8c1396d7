"""The byte budgets: every kind's declared maxima fit etcd's request limit, and the size checks.

The declared worst case of an object is computed from its generated CRD schema: every string at its
maxLength, every list at maxItems, every map at maxProperties (keys at the length their CEL rule
allows), every integer at its maximum, of a group of members its CEL rules make exclusive the largest
one only, and every free-form field at its budget in agentrun.api.budgets. A character counts one byte:
the bounds are in characters, and the free-form budgets, which the writers measure in real bytes, take
the bulk of each object.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from agentrun.api import budgets, crdgen

Schema = dict[str, Any]
SCHEMAS = {
    crd["spec"]["names"]["kind"]: crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for crd in crdgen.custom_resource_definitions()
}
DATE_TIME_BYTES = len('"2006-01-02T15:04:05.999999999+07:00"')
NUMBER_BYTES = len("-1.7976931348623157e+308")
INTEGER_BYTES = len(str(-(2**63)))
KEY_BOUND = re.compile(r"^self\.all\(key, size\(key\) <= (\d+)\)$")
# Rules that let an object hold at most one member of a group (agentrun.api.kube's env sources): the
# worst case of such an object holds the group's largest member, not all of them.
AT_MOST_ONE = re.compile(r"^!\(has\(self\.(\w+)\) && has\(self\.(\w+)\)\)$")
EXACTLY_ONE = re.compile(r"^\(has\(self\.\w+\) \? 1 : 0\)( \+ \(has\(self\.\w+\) \? 1 : 0\))* == 1$")
HAS = re.compile(r"has\(self\.(\w+)\)")


def exclusive_groups(node: Schema) -> list[set[str]]:
    """The groups of members of which an object may hold one at most, by its CEL rules."""
    groups = []
    for rule in node.get(crdgen.VALIDATIONS, []):
        text = " ".join(rule["rule"].split())
        if AT_MOST_ONE.match(text) or EXACTLY_ONE.match(text):
            groups.append(set(HAS.findall(text)))
    return groups


def map_key_length(node: Schema, path: str) -> int:
    for rule in node.get(crdgen.VALIDATIONS, []):
        if match := KEY_BOUND.match(rule["rule"]):
            return int(match.group(1))
    raise AssertionError(f"{path}: a map needs a CEL rule bounding its keys (common.bounded_keys)")


def string_bytes(node: Schema, path: str) -> int:
    if "enum" in node:
        return 2 + max(len(value) for value in node["enum"])
    if node.get("format") == "date-time":
        return DATE_TIME_BYTES
    assert "maxLength" in node, f"{path}: unbounded string"
    return 2 + int(node["maxLength"])


def worst_case(node: Schema, path: str, free: dict[str, int]) -> int:
    """The most bytes of compact JSON a value of this schema node can take."""
    if path in free:  # measured whole by its writer, declared parts included (e.g. podTemplate.spec)
        return free[path]
    if node.get(crdgen.PRESERVE_UNKNOWN) and "properties" not in node:
        raise AssertionError(f"{path}: a free-form field needs a budget in agentrun.api.budgets")
    if node.get(crdgen.INT_OR_STRING):
        return max(INTEGER_BYTES, string_bytes({"maxLength": 64, **node}, path))
    match node.get("type"):
        case "object" if "additionalProperties" in node:
            key = map_key_length(node, path) + 3  # quotes and colon
            value = worst_case(node["additionalProperties"], f"{path}{{*}}", free)
            return 2 + int(node["maxProperties"]) * (key + value + 1)
        case "object":
            members = {
                name: len(name) + 3 + worst_case(sub, f"{path}.{name}", free) + 1
                for name, sub in node.get("properties", {}).items()
            }
            for group in exclusive_groups(node):
                largest = max(members[name] for name in group)
                members = {name: size for name, size in members.items() if name not in group}
                members[" | ".join(sorted(group))] = largest
            return 2 + sum(members.values())
        case "array":
            return 2 + int(node["maxItems"]) * (worst_case(node["items"], f"{path}[*]", free) + 1)
        case "string":
            return string_bytes(node, path)
        case "integer":
            return len(str(node["maximum"])) if "maximum" in node else INTEGER_BYTES
        case "number":
            return NUMBER_BYTES
        case "boolean":
            return len("false")
    raise AssertionError(f"{path}: no worst case for {node}")


def declared(kind: str, part: str) -> int:
    return worst_case(SCHEMAS[kind]["properties"][part], f".{part}", budgets.FREE_JSON_BUDGETS[kind])


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_the_declared_maxima_of_each_kind_fit_etcd(kind: str) -> None:
    status = budgets.RUN_STATUS_BUDGET if kind == "Run" else declared(kind, "status")
    envelope = len('{"apiVersion":"agentrun.dev/v1alpha1","kind":"SideEffect","metadata":,"spec":,"status":}')
    total = envelope + budgets.METADATA_ALLOWANCE + declared(kind, "spec") + status

    assert total <= budgets.ETCD_REQUEST_LIMIT, f"{kind}: {total} bytes declared"


def test_the_run_status_fits_its_budget_with_result_and_schema_at_theirs() -> None:
    assert declared("Run", "status") <= budgets.RUN_STATUS_BUDGET


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_every_budget_names_a_free_form_field(kind: str) -> None:
    nodes = dict(crdgen.schema_nodes(SCHEMAS[kind]))
    budgeted = set(budgets.FREE_JSON_BUDGETS[kind])
    assert all(nodes[path].get(crdgen.PRESERVE_UNKNOWN) for path in budgeted)

    def inside_a_budget(path: str) -> bool:
        return any(path == b or path.startswith((f"{b}.", f"{b}[", f"{b}{{")) for b in budgeted)

    unbudgeted = {
        path
        for path, node in nodes.items()
        if node.get(crdgen.PRESERVE_UNKNOWN) and "properties" not in node and not inside_a_budget(path)
    }
    assert unbudgeted == set()


@pytest.mark.parametrize(
    ("value", "size"),
    [
        (None, 4),
        ({"a": [1, 2.5, True]}, len('{"a":[1,2.5,true]}')),
        ("é", len('"é"'.encode())),
        ("<&>", len('"\\u003c\\u0026\\u003e"')),  # the API server escapes HTML characters
        ("\u2028", len('"\\u2028"')),
        ("\n", len('"\\n"')),
        ("\x00", len('"\\u0000"')),
        ({"<": "x"}, len('{"\\u003c":"x"}')),
    ],
    ids=["null", "compact", "utf-8", "html", "line-separator", "newline", "control", "key"],
)
def test_stored_size_counts_json_as_the_api_server_stores_it(value: Any, size: int) -> None:
    assert budgets.stored_size(value) == size


@pytest.mark.parametrize(
    ("value", "budget", "fits"),
    [
        ("x" * 8, 10, True),
        ("x" * 9, 10, False),
        ({"blob": "x" * 1000}, 1011, True),
        ({"blob": "x" * 1000}, 1010, False),
    ],
    ids=["at-the-budget", "one-over", "object-at", "object-one-over"],
)
def test_over_budget(value: Any, budget: int, fits: bool) -> None:
    message = budgets.over_budget("the result", value, budget)

    if fits:
        assert message is None
    else:
        assert message == (
            f"the result is {budgets.stored_size(value)} bytes of JSON, over its budget of {budget} bytes: "
            f"{budgets.STORE_ELSEWHERE}"
        )


EPOCHS = {
    "Run": [
        ".spec.cancelEpoch",
        ".status.leaseEpoch",
        ".status.observedCancelEpoch",
        ".status.attempts",
        ".status.currentAttempt",
        ".status.committedBy.leaseEpoch",
        ".status.committedBy.cancelEpoch",
    ],
    "Attempt": [".spec.leaseEpoch", ".spec.cancelEpoch"],
    "Checkpoint": [".spec.leaseEpoch", ".spec.sequence"],
    "SideEffect": [".status.leaseEpoch"],
}


@pytest.mark.parametrize(("kind", "path"), [(kind, path) for kind, paths in EPOCHS.items() for path in paths])
def test_epochs_and_counters_fit_an_int32(kind: str, path: str) -> None:
    node = dict(crdgen.schema_nodes(SCHEMAS[kind]))[path]
    assert (node["type"], node["maximum"]) == ("integer", 2147483647)


def test_exclusive_members_are_read_from_the_rules_that_make_them_so() -> None:
    env = SCHEMAS["Run"]["properties"]["spec"]["properties"]["agent"]["properties"]["env"]["items"]
    assert exclusive_groups(env) == [{"value", "valueFrom"}]
    assert exclusive_groups(env["properties"]["valueFrom"]) == [
        {"configMapKeyRef", "secretKeyRef", "fieldRef", "resourceFieldRef"}
    ]
