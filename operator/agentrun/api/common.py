"""Building blocks shared by the four agentrun.dev kinds.

The pydantic models in this package are the single source of the CRD schemas: descriptions become
`kubectl explain` text, field constraints become OpenAPI bounds, and CEL rules attached with
`validation_rules` become `x-kubernetes-validations` that the API server enforces.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, WithJsonSchema
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

GROUP: Final = "agentrun.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = "agentrun.dev/v1alpha1"

# --- string formats ---------------------------------------------------------------------------------
# Patterns are RE2- and Python-compatible: the API server checks them with Go's regexp, pydantic with
# Rust's. Every string gets a maxLength too, which also keeps the CEL cost estimator's size bounds small.

DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# Ids and idempotency keys: printable, no spaces, start and end with an alphanumeric character.
IDENTIFIER_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._:/@=+-]*[A-Za-z0-9])?$"
# Machine-readable reasons, CamelCase like every Kubernetes reason.
CAMEL_CASE_PATTERN = r"^[A-Z][A-Za-z0-9]*$"
DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"

MAX_RUN_NAME_LENGTH = 48
MAX_NAME_LENGTH = 253
MAX_ATTEMPT_NAME_LENGTH = 63
MAX_IDENTIFIER_LENGTH = 128
MAX_REASON_LENGTH = 128
MAX_MESSAGE_LENGTH = 1024  # every writer cuts its messages here; longer ones would crowd the byte budgets
MAX_FINGERPRINT_LENGTH = 128
# Longest key of a map (a qualified name: a 253-character prefix, '/', a 63-character name).
MAX_MAP_KEY_LENGTH = 317
# Epochs and counters fit an int32, like the Lease's leaseTransitions that carries the lease epoch.
MAX_EPOCH = 2147483647

RunName = Annotated[str, Field(min_length=1, max_length=MAX_RUN_NAME_LENGTH, pattern=DNS_SUBDOMAIN_PATTERN)]
ObjectName = Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=DNS_SUBDOMAIN_PATTERN)]
AttemptName = Annotated[
    str, Field(min_length=1, max_length=MAX_ATTEMPT_NAME_LENGTH, pattern=DNS_SUBDOMAIN_PATTERN)
]
Identifier = Annotated[str, Field(min_length=1, max_length=MAX_IDENTIFIER_LENGTH, pattern=IDENTIFIER_PATTERN)]
Reason = Annotated[str, Field(min_length=1, max_length=MAX_REASON_LENGTH, pattern=CAMEL_CASE_PATTERN)]
Message = Annotated[str, Field(max_length=MAX_MESSAGE_LENGTH)]
Digest = Annotated[str, Field(max_length=71, pattern=DIGEST_PATTERN)]
Fingerprint = Annotated[str, Field(min_length=1, max_length=MAX_FINGERPRINT_LENGTH)]
Epoch = Annotated[int, Field(ge=0, le=MAX_EPOCH)]
# A person as the API server knows them: request.userInfo.username (what `kubectl auth whoami` shows).
MAX_USER_NAME_LENGTH = 128
UserName = Annotated[str, Field(min_length=1, max_length=MAX_USER_NAME_LENGTH)]

# Free-form JSON (any value) that the API server stores as sent. Such a field is invisible to CEL
# rules, but whole-object equality (`self == oldSelf`) still compares it exactly.
FreeJson = Annotated[JsonValue, WithJsonSchema({"x-kubernetes-preserve-unknown-fields": True})]
# A free-form JSON object, typed `object` so that CEL rules can test its presence with has(). CEL
# equality on it is weaker: the API server compares only the keys both sides have.
FreeJsonObject = Annotated[
    dict[str, JsonValue],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]


# --- CEL ----------------------------------------------------------------------------------------------

CelReason = Literal["FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate"]


def cel(
    rule: str,
    message: str,
    *,
    reason: CelReason | None = None,
    field_path: str | None = None,
    message_expression: str | None = None,
) -> JsonDict:
    """One `x-kubernetes-validations` entry. A rule that mentions `oldSelf` only runs on updates.
    `message_expression` (CEL yielding a string) words the refusal with the object's values; `message` is
    what the API server says when that expression cannot be evaluated."""
    entry: JsonDict = {"rule": rule, "message": message}
    if message_expression is not None:
        entry["messageExpression"] = message_expression
    if reason is not None:
        entry["reason"] = reason
    if field_path is not None:
        entry["fieldPath"] = field_path
    return entry


def cel_list(values: Iterable[str]) -> str:
    """A sorted CEL list literal of strings, e.g. ['Cancelled', 'Succeeded']."""
    return "[" + ", ".join(f"'{value}'" for value in sorted(values)) + "]"


def validation_rules(*rules: JsonDict) -> JsonDict:
    """The `json_schema_extra` that attaches CEL rules to a model or a field."""
    return {"x-kubernetes-validations": list(rules)}


def bounded_keys(max_length: int = MAX_MAP_KEY_LENGTH) -> JsonDict:
    """The `json_schema_extra` of a map whose keys are at most max_length characters long.

    A CRD schema cannot bound map keys; CEL can, and the byte budgets count on it."""
    return validation_rules(
        cel(
            f"self.all(key, size(key) <= {max_length})",
            f"a key of this map has at most {max_length} characters",
            reason="FieldValueInvalid",
        )
    )


def defaulted_object(factory: Callable[[], BaseModel], description: str) -> Any:
    """A nested object that exists, with its defaults, even when the user leaves it out.

    The schema default is the complete default object, so that the API server fills it in for an
    omitted field. (A `{}` default is not enough: the server checks a default against the CEL rules
    before its own nested defaults apply.)
    """

    def with_default(schema: JsonDict) -> None:
        # when a schema is made, not at import: building the object builds its model's validator
        schema["default"] = factory().model_dump(mode="json", by_alias=True)

    return Field(default_factory=factory, description=description, json_schema_extra=with_default)


# --- enums --------------------------------------------------------------------------------------------


class ConditionStatus(StrEnum):
    """Whether a condition holds: True, False or Unknown."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class FailureClass(StrEnum):
    """Why something failed, which decides whether a retry can help."""

    TRANSIENT = "transient"
    RATE_LIMITED = "rate_limited"
    INFRASTRUCTURE = "infrastructure"
    LEASE_LOST = "lease_lost"
    DETERMINISTIC = "deterministic"
    CANCELLED = "cancelled"
    UNKNOWN_SIDE_EFFECT = "unknown_side_effect"
    INPUT_EXPIRED = "input_expired"


# The failure reason of a state that cannot be read back and verified (a blob or an ancestor missing, a
# digest that does not match): the Run stops for a person (NeedsReconciliation), never retried on its own.
STATE_UNVERIFIABLE: Final = "StateUnverifiable"
# The failure reason of an Attempt whose Run's state may be in the state store and whose SDK did not state
# that it reads references (Attempt status.sdkReads): an image whose SDK predates the store. The Run stops
# for a person (NeedsReconciliation) until spec.agent names a newer image and a retry is asked for.
AGENT_SDK_TOO_OLD: Final = "AgentSDKTooOld"
# The failure reasons of an attempt Pod whose agent container never started, as its kubelet reported it:
# an image that can never be pulled (not retried), a pull that kept failing, and a Secret or ConfigMap the
# Pod needs that stayed missing (both after spec.startTimeoutSeconds).
IMAGE_NOT_FOUND: Final = "ImageNotFound"
IMAGE_PULL_FAILED: Final = "ImagePullFailed"
CONFIG_MISSING: Final = "ConfigMissing"


# --- shared models ------------------------------------------------------------------------------------


class ApiModel(BaseModel):
    """Base of every agentrun.dev model: camelCase on the wire, snake_case in Python.

    Unknown fields are ignored (not forbidden) so that objects read back from the API server parse
    even when a newer server or another writer added fields; such a model is for reading and for
    building new objects or patches, not for round-tripping a full object back in an update.

    A model's validator is built when it is first used (defer_build), not at import: an attempt Pod
    uses a few of the models (its import was a third model building); a long-running program builds
    them all at start-up (`build_models`).
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="ignore",
        defer_build=True,
    )

    @classmethod
    def build_models(cls) -> int:
        """Builds the validator of every model of agentrun.dev imported so far (the operator does, before
        it freezes what it holds at start-up); returns how many models there are."""
        models, pending = [], list(cls.__subclasses__())
        while pending:
            model = pending.pop()
            models.append(model)
            pending.extend(model.__subclasses__())
        for model in models:
            model.model_rebuild()
        return len(models)

    def to_api(self) -> dict[str, Any]:
        """The object as JSON for a create or a replace: camelCase, unset optional fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    def to_patch(self) -> dict[str, Any]:
        """A JSON merge patch holding exactly the fields set explicitly; a field set to None deletes it."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


class Condition(ApiModel):
    """One observation of the object's state, following the Kubernetes API conventions."""

    type: str = Field(
        min_length=1,
        max_length=316,
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
        r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
        description="The aspect this condition describes, in CamelCase, e.g. Succeeded or LeaseHeld.",
    )
    status: ConditionStatus = Field(description="Whether the condition holds: True, False or Unknown.")
    observed_generation: int | None = Field(
        None,
        ge=0,
        description="The metadata.generation the condition was computed from; older than the object's "
        "generation means the condition may be stale.",
    )
    last_transition_time: datetime = Field(
        description="When the status last changed (RFC 3339), not when the condition was last checked."
    )
    reason: str = Field(
        min_length=1,
        max_length=MAX_REASON_LENGTH,
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        description="A CamelCase word that tools can match on, explaining the last transition.",
    )
    message: str = Field(
        "", max_length=MAX_MESSAGE_LENGTH, description="A human-readable explanation of the last transition."
    )


# Conditions are a map keyed on `type`: one entry per aspect, merged per entry by server-side apply.
CONDITIONS_SCHEMA: JsonDict = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}
MAX_CONDITIONS = 8


class FailureInfo(ApiModel):
    """A classified failure: the class decides the retry, the fingerprint detects repeats."""

    failure_class: FailureClass = Field(
        alias="class",
        description="The failure class: transient, rate_limited, infrastructure, lease_lost, "
        "deterministic, cancelled, unknown_side_effect or input_expired. Only classes listed in "
        "spec.retry.retryOn are retried.",
    )
    message: Message | None = Field(None, description="What went wrong, in the words of whoever saw it.")
    fingerprint: Fingerprint | None = Field(
        None,
        description="A stable digest of the error (class and normalised message). Consecutive failures "
        "with the same fingerprint count towards spec.retry.sameErrorLimit.",
    )


# --- object wrappers ----------------------------------------------------------------------------------


class OwnerReference(ApiModel):
    """A reference to the object that owns this one; the garbage collector deletes dependents with it."""

    api_version: str = Field(description="API version of the owner.")
    kind: str = Field(description="Kind of the owner.")
    name: str = Field(description="Name of the owner.")
    uid: str = Field(description="UID of the owner.")
    controller: bool | None = Field(None, description="Whether the owner is the managing controller.")
    block_owner_deletion: bool | None = Field(
        None, description="Whether foreground deletion of the owner waits for this object."
    )


class ObjectMeta(ApiModel):
    """The part of Kubernetes object metadata agentrun reads and writes."""

    name: str | None = Field(None, description="Name of the object, unique in its namespace.")
    generate_name: str | None = Field(None, description="Prefix for a server-generated name.")
    namespace: str | None = Field(None, description="Namespace of the object.")
    uid: str | None = Field(None, description="Server-assigned unique id.")
    resource_version: str | None = Field(None, description="Opaque version for optimistic concurrency.")
    generation: int | None = Field(None, description="Sequence number of spec changes.")
    creation_timestamp: datetime | None = Field(None, description="When the object was created.")
    deletion_timestamp: datetime | None = Field(None, description="When deletion was requested.")
    # Collections stay None when absent: an empty list in a merge patch would clear them.
    labels: dict[str, str] | None = Field(None, description="Labels of the object.")
    annotations: dict[str, str] | None = Field(None, description="Annotations of the object.")
    owner_references: list[OwnerReference] | None = Field(None, description="Owners of the object.")
    finalizers: list[str] | None = Field(None, description="Finalizers that block deletion.")


@dataclass(frozen=True)
class PrinterColumn:
    """An `additionalPrinterColumns` entry of a CRD (`kubectl get` output)."""

    name: str
    json_path: str
    type: Literal["string", "integer", "number", "boolean", "date"]
    description: str
    priority: int = 0


class KubernetesObject(ApiModel):
    """Base of the four top-level kinds: apiVersion, kind, metadata, plus CRD naming metadata.

    crdgen replaces the schemas of apiVersion, kind and metadata by the ones the API server
    requires at the root of a custom resource.
    """

    plural: ClassVar[str]
    short_name: ClassVar[str]
    printer_columns: ClassVar[tuple[PrinterColumn, ...]]

    api_version: Literal["agentrun.dev/v1alpha1"] = Field(
        API_VERSION, description="The versioned schema of this object: agentrun.dev/v1alpha1."
    )
    kind: str = Field(description="The kind of this object.")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta, description="Standard object metadata.")

    def owner_reference(self) -> OwnerReference:
        """The ownerReference that makes an object a dependent of this one (requires metadata.uid)."""
        if not self.metadata.name or not self.metadata.uid:
            raise ValueError("an owner needs metadata.name and metadata.uid: read the object from the server")
        return OwnerReference(
            api_version=API_VERSION,
            kind=self.kind,
            name=self.metadata.name,
            uid=self.metadata.uid,
            controller=True,
            block_owner_deletion=True,
        )


# --- helpers ------------------------------------------------------------------------------------------


def json_digest(value: JsonValue) -> str:
    """The digest of a JSON value as recorded in status (`sha256:<hex>` of its canonical JSON).

    Canonical means sorted keys and no insignificant whitespace, so equal values give equal digests
    whoever computes them (operator, SDK or CLI).
    """
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
