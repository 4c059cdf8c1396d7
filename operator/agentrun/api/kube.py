"""Minimal structural models of the core/v1 types a Run embeds in `spec.agent`.

They cover what the operator copies into the attempt Pod. The API server validates the Pod itself
when the operator creates it; these schemas exist so that mistakes are refused when the Run is
applied, not minutes later when its first Attempt starts.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field, JsonValue, WithJsonSchema

from agentrun.api.budgets import KIB, POD_SPEC_BUDGET
from agentrun.api.common import (
    MAX_NAME_LENGTH,
    ApiModel,
    ObjectName,
    bounded_keys,
    cel,
    validation_rules,
)

# A resource.Quantity ("500m", "2Gi", 1): an int-or-string with the Kubernetes quantity syntax.
_DECIMAL = r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
QUANTITY_PATTERN = rf"^(\+|-)?{_DECIMAL}(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?{_DECIMAL}))?$"
Quantity = Annotated[
    int | Annotated[str, Field(max_length=64, pattern=QUANTITY_PATTERN)],
    WithJsonSchema({"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN}),
]
ENV_VAR_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"


class KeySelector(ApiModel):
    """Selects one key of a ConfigMap or Secret in the Run's namespace."""

    name: ObjectName = Field(description="Name of the ConfigMap or Secret.")
    key: str = Field(
        min_length=1,
        max_length=MAX_NAME_LENGTH,
        pattern=r"^[-._a-zA-Z0-9]+$",
        description="The key whose value becomes the variable's value.",
    )
    optional: bool | None = Field(
        None, description="Start the attempt even when the object or the key does not exist."
    )


class ObjectFieldSelector(ApiModel):
    """Selects a field of the attempt Pod (downward API), e.g. metadata.name or status.podIP."""

    api_version: str | None = Field(
        None, max_length=64, description="Version of the schema the fieldPath is written in; default v1."
    )
    field_path: str = Field(
        min_length=1, max_length=256, description="Path of the Pod field to expose, e.g. metadata.namespace."
    )


class ResourceFieldSelector(ApiModel):
    """Selects a resource limit or request of a container, e.g. limits.memory."""

    container_name: str | None = Field(
        None, max_length=63, description="The container whose resources are read; default the agent's."
    )
    resource: str = Field(
        min_length=1, max_length=MAX_NAME_LENGTH, description="The resource to expose, e.g. limits.cpu."
    )
    divisor: Quantity | None = Field(
        None, description="Unit the value is expressed in, e.g. 1m or 1Mi; default 1."
    )


class EnvVarSource(ApiModel):
    """Where an environment variable's value comes from; exactly one source."""

    model_config = ConfigDict(
        json_schema_extra=validation_rules(
            cel(
                "(has(self.configMapKeyRef) ? 1 : 0) + (has(self.secretKeyRef) ? 1 : 0)"
                " + (has(self.fieldRef) ? 1 : 0) + (has(self.resourceFieldRef) ? 1 : 0) == 1",
                "valueFrom needs exactly one of configMapKeyRef, secretKeyRef, fieldRef or resourceFieldRef",
            )
        )
    )

    config_map_key_ref: KeySelector | None = Field(None, description="A key of a ConfigMap.")
    secret_key_ref: KeySelector | None = Field(None, description="A key of a Secret.")
    field_ref: ObjectFieldSelector | None = Field(None, description="A field of the attempt Pod.")
    resource_field_ref: ResourceFieldSelector | None = Field(
        None, description="A resource limit or request of a container of the attempt Pod."
    )


class EnvVar(ApiModel):
    """An environment variable of the agent's container: a literal value or a reference."""

    model_config = ConfigDict(
        json_schema_extra=validation_rules(
            cel(
                "!(has(self.value) && has(self.valueFrom))",
                "an environment variable takes either value or valueFrom, not both",
            )
        )
    )

    name: str = Field(
        min_length=1,
        max_length=MAX_NAME_LENGTH,
        pattern=ENV_VAR_NAME_PATTERN,
        description="Name of the variable (letters, digits, '_', '-' and '.'; not starting with a digit).",
    )
    value: str | None = Field(
        None,
        max_length=2048,
        description="The literal value (at most 2048 characters: put larger values in a ConfigMap).",
    )
    value_from: EnvVarSource | None = Field(
        None, description="Read the value from a ConfigMap, a Secret or the Pod instead of a literal."
    )


class ResourceRequirements(ApiModel):
    """Compute resources of the agent's container, as in a Pod."""

    limits: dict[str, Quantity] | None = Field(
        None,
        max_length=16,
        description="The most the container may use per resource name, e.g. {cpu: '2', memory: 4Gi}.",
        json_schema_extra=bounded_keys(),
    )
    requests: dict[str, Quantity] | None = Field(
        None,
        max_length=16,
        description="What the scheduler reserves per resource name, e.g. {cpu: 500m, memory: 1Gi}.",
        json_schema_extra=bounded_keys(),
    )


class PodTemplateMetadata(ApiModel):
    """Labels and annotations added to every attempt Pod."""

    labels: dict[str, Annotated[str, Field(max_length=63)]] | None = Field(
        None,
        max_length=32,
        description="Labels for the attempt Pods, next to the ones agentrun sets.",
        json_schema_extra=bounded_keys(),
    )
    annotations: dict[str, Annotated[str, Field(max_length=2048)]] | None = Field(
        None,
        max_length=32,
        description="Annotations for the attempt Pods, next to the ones agentrun sets (values of at most "
        "2048 characters).",
        json_schema_extra=bounded_keys(),
    )


# A PodSpec is a large, versioned core/v1 type. Mirroring it here would copy hundreds of fields
# that drift with every Kubernetes release, so it is stored as sent and the API server validates
# it when the operator creates the attempt Pod from it. It is not an embedded resource
# (x-kubernetes-embedded-resource): a PodSpec carries no apiVersion, kind or metadata.
#
# What would let an attempt Pod borrow an identity or the node is refused at admission, though: CEL sees
# only declared fields of a preserve-unknown-fields object, so those few are declared (the rest of the
# PodSpec stays as sent) and the rules below read them.
MAX_POD_CONTAINERS = 64
MAX_POD_VOLUMES = 256


def _preserved(description: str, **properties: Any) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    node["description"] = description
    if properties:
        node["properties"] = properties
    return node


def _flag(description: str) -> dict[str, Any]:
    return {"type": "boolean", "description": description}


def _containers(field: str) -> dict[str, Any]:
    privileged = _flag("A privileged container: refused for attempt Pods.")
    security = _preserved("The container's security context.", privileged=privileged)
    container = _preserved(f"A core/v1 {field[:-1]} as in a PodSpec.", securityContext=security)
    container["x-kubernetes-validations"] = [
        cel(
            "!has(self.securityContext) || !has(self.securityContext.privileged)"
            " || !self.securityContext.privileged",
            f"an attempt Pod's {field} cannot be privileged: remove securityContext.privileged (or set "
            "it false); grant the capabilities the agent needs instead",
            reason="FieldValueForbidden",
        )
    ]
    return {
        "type": "array",
        "maxItems": MAX_POD_CONTAINERS,
        "description": f"The Pod's {field}, as in a PodSpec.",
        "items": container,
    }


def _host_namespace(field: str, what: str) -> dict[str, Any]:
    return cel(
        f"!has(self.{field}) || !self.{field}",
        f"podTemplate.spec.{field} is not allowed: an attempt Pod never shares the node's {what}; "
        f"remove {field} (or set it false)",
        reason="FieldValueForbidden",
        field_path=f".{field}",
    )


_ACCOUNT_FIXES = "set spec.agent.serviceAccountName to a ServiceAccount labelled agentrun.dev/agent=true"
POD_SPEC_SCHEMA: dict[str, Any] = _preserved(
    "A core/v1 PodSpec, stored as sent (the API server checks it when the attempt Pod is created), but "
    "for what would let the Pod borrow an identity or the node: serviceAccountName, nodeName, host "
    "namespaces, privileged containers and hostPath volumes are refused.",
    serviceAccountName={
        "type": "string",
        "maxLength": MAX_NAME_LENGTH,
        "description": "Refused here: the ServiceAccount is spec.agent.serviceAccountName.",
    },
    serviceAccount={
        "type": "string",
        "maxLength": MAX_NAME_LENGTH,
        "description": "The deprecated alias of serviceAccountName: refused here too.",
    },
    nodeName={
        "type": "string",
        "maxLength": MAX_NAME_LENGTH,
        "description": "Refused: attempt Pods are placed by the scheduler (use nodeSelector or affinity).",
    },
    hostNetwork=_flag("Refused when true: attempt Pods never use the node's network namespace."),
    hostPID=_flag("Refused when true: attempt Pods never use the node's PID namespace."),
    hostIPC=_flag("Refused when true: attempt Pods never use the node's IPC namespace."),
    containers=_containers("containers"),
    initContainers=_containers("initContainers"),
    ephemeralContainers=_containers("ephemeralContainers"),
    volumes={
        "type": "array",
        "maxItems": MAX_POD_VOLUMES,
        "description": "The Pod's volumes, as in a PodSpec; hostPath volumes are refused.",
        "items": _preserved(
            "A core/v1 Volume as in a PodSpec.",
            hostPath=_preserved("A directory of the node: refused for attempt Pods."),
        ),
    },
)
POD_SPEC_SCHEMA["x-kubernetes-validations"] = [
    cel(
        "!has(self.serviceAccountName)",
        f"podTemplate.spec.serviceAccountName is not allowed: {_ACCOUNT_FIXES}",
        reason="FieldValueForbidden",
        field_path=".serviceAccountName",
    ),
    cel(
        "!has(self.serviceAccount)",
        f"podTemplate.spec.serviceAccount is not allowed: {_ACCOUNT_FIXES}",
        reason="FieldValueForbidden",
        field_path=".serviceAccount",
    ),
    cel(
        "!has(self.nodeName)",
        "podTemplate.spec.nodeName is not allowed: attempt Pods are placed by the scheduler; remove "
        "nodeName and use nodeSelector or affinity",
        reason="FieldValueForbidden",
        field_path=".nodeName",
    ),
    _host_namespace("hostNetwork", "network"),
    _host_namespace("hostPID", "process IDs"),
    _host_namespace("hostIPC", "IPC"),
    cel(
        "!has(self.volumes) || self.volumes.all(v, !has(v.hostPath))",
        "podTemplate.spec.volumes cannot mount a hostPath (a directory of the node): use an emptyDir, a "
        "configMap, a secret or a persistentVolumeClaim",
        reason="FieldValueForbidden",
        field_path=".volumes",
    ),
]
PodSpecJson = Annotated[dict[str, JsonValue], WithJsonSchema(POD_SPEC_SCHEMA)]


class PodTemplate(ApiModel):
    """A full Pod template for attempts that need more than image, command, env and resources."""

    metadata: PodTemplateMetadata | None = Field(
        None, description="Labels and annotations for the attempt Pods."
    )
    spec: PodSpecJson = Field(
        description="A core/v1 PodSpec. The container named 'agent' (else the first container) runs "
        "the agent; spec.agent's image, command, args, env and resources override its fields, and "
        "agentrun adds its own environment, annotations and restartPolicy Never. Checked by the API "
        f"server when the attempt Pod is created. At most {POD_SPEC_BUDGET // KIB} KiB of JSON: the "
        "operator fails a Run with a larger one.",
        json_schema_extra={"maxProperties": 64},
    )
