"""Test-side access to the agentrun.dev API on the local control plane: installing the CRDs, reading
and writing objects of the four kinds, and the messages of the CRDs' validation rules."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import yaml
from kubernetes.client.exceptions import ApiException

from support.corpus import CRD_DIR, valid_object
from support.kube import Kube, wait_for

GROUP: Final = "agentrun.dev"
VERSION: Final = "v1alpha1"
PLURALS: Final = {
    "Run": "runs",
    "Attempt": "attempts",
    "Checkpoint": "checkpoints",
    "SideEffect": "sideeffects",
}
KINDS: Final = tuple(PLURALS)
CRD_NAMES: Final = tuple(f"{plural}.{GROUP}" for plural in PLURALS.values())


# --- the CRDs as committed in crds/ -------------------------------------------------------------------


def crd_documents() -> dict[str, dict[str, Any]]:
    """The CRDs in crds/, by kind."""
    crds = [yaml.safe_load(path.read_text()) for path in sorted(CRD_DIR.glob("*.yaml"))]
    return {crd["spec"]["names"]["kind"]: crd for crd in crds}


def _schema_nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from _schema_nodes(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _schema_nodes(node["items"], f"{path}[*]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _schema_nodes(node["additionalProperties"], f"{path}{{*}}")


@dataclass(frozen=True)
class Rule:
    """One x-kubernetes-validations entry of a CRD: its kind, the schema path it sits at, the rule."""

    kind: str
    path: str
    rule: str
    message: str
    # The CEL expression that writes the refusal's message instead of `message`, when the rule has one.
    message_expression: str | None = None

    def __str__(self) -> str:
        return f"{self.kind}{self.path or ' (root)'}: {self.rule}"


def crd_rules() -> list[Rule]:
    """Every CEL rule of the committed CRDs."""
    return [
        Rule(kind, path, entry["rule"], entry["message"], entry.get("messageExpression"))
        for kind, crd in crd_documents().items()
        for path, node in _schema_nodes(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
        for entry in node.get("x-kubernetes-validations", [])
    ]


_RULES: Final = crd_rules()


def rule(kind: str, path: str, fragment: str = "") -> Rule:
    """The one CEL rule of kind at schema path (e.g. .spec.lease; "" for the root) whose rule text
    contains fragment; tests assert its message rather than repeating the text."""
    found = [r for r in _RULES if r.kind == kind and r.path == path and fragment in r.rule]
    assert len(found) == 1, f"expected one rule of {kind} at {path!r} containing {fragment!r}: {found}"
    return found[0]


# --- installing ---------------------------------------------------------------------------------------


def install_crds(kube: Kube, timeout: float = 120) -> None:
    """Applies crds/ (idempotent: server-side apply with a field manager of its own) and waits until every
    CRD is Established and actually serves: a valid object of each kind is accepted, and a CEL rule is
    enforced (a dry-run create, so nothing is stored)."""
    kube.kubectl(
        "apply", "--server-side", "--force-conflicts", "--field-manager=agentrun-tests", "-f", str(CRD_DIR)
    )

    def established() -> bool:
        for name in CRD_NAMES:
            crd = kube.extensions.read_custom_resource_definition(name)
            conditions = {c.type: c.status for c in (crd.status.conditions or [])}
            if conditions.get("Established") != "True" or conditions.get("NamesAccepted") != "True":
                return False
        return True

    wait_for(established, timeout, what="the agentrun.dev CRDs Established")
    api = Api(kube, "default")
    lease_rule = rule("Run", ".spec.lease")

    def serving() -> bool:
        try:
            for kind in KINDS:
                api.create(valid_object(kind, "probe"), dry_run=True)
        except ApiException:
            return False
        bad = valid_object("Run", "probe", {".spec.lease": {"durationSeconds": 10, "renewSeconds": 10}})
        try:
            api.create(bad, dry_run=True)
        except ApiException as error:
            return lease_rule.message in error_message(error)
        return False

    wait_for(serving, timeout, interval=0.2, what="the agentrun.dev kinds served and validated")


# --- reading and writing ------------------------------------------------------------------------------


def error_message(error: ApiException) -> str:
    """The API server's message of a refused request (what kubectl prints after `error:`)."""
    try:
        message: str = json.loads(error.body)["message"]
    except (TypeError, ValueError, KeyError):
        return str(error.body)
    return message


class Refused(AssertionError):
    pass


@dataclass
class Api:
    """The four kinds in one namespace, through the Python client (merge patches, as kubectl --type merge)."""

    kube: Kube
    namespace: str

    def create(self, body: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        extra = {"dry_run": "All"} if dry_run else {}
        created: dict[str, Any] = self.kube.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURALS[body["kind"]], body, **extra
        )
        return created

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self.kube.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURALS[kind], name
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return obj

    def patch(self, kind: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch of the object (spec and metadata; status is ignored here)."""
        patched: dict[str, Any] = self.kube.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURALS[kind], name, patch
        )
        return patched

    def patch_status(self, kind: str, name: str, status: dict[str, Any] | None) -> dict[str, Any]:
        """A JSON merge patch of the status subresource, as the operator writes it: {"status": status}.

        (This client sends application/merge-patch+json for custom objects; a strategic merge patch,
        which CRDs refuse, is never sent.)"""
        patched: dict[str, Any] = self.kube.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, self.namespace, PLURALS[kind], name, {"status": status}
        )
        return patched

    def refusal(self, request: Callable[[], object]) -> str:
        """Runs request, which must be refused as invalid (422); returns the server's message."""
        try:
            request()
        except ApiException as error:
            if error.status != 422:
                raise
            return error_message(error)
        raise Refused("the API server accepted the request")
