"""ValidatingAdmissionPolicies: the single source of who may write what, for the chart, the plain
manifests, the tests and the demo (like agentrun.rbac for RBAC).

RBAC cannot tell one attempt Pod from another (they share their namespace's ServiceAccount), so these
policies make the API server check the identity inside the request: a Pod-bound service-account token
carries the Pod's name in the user's extra (`authentication.kubernetes.io/pod-name`), and an Attempt's
Pod is named after the Attempt (`<run>-a<number>`). Every rule compares with `oldObject`, what is stored,
never with what the same request writes. The policies apply to ServiceAccounts other than the operator's
(people are governed by RBAC); the Pod rule applies to everyone but the operator.

Each refusal starts with its cause (agentrun.api.causes.RefusalCause), so the SDK classifies a refused
write without reading the Run.

Who decided is checked the same way: a field that names a person (spec.resume.answeredBy, requestedBy
of the cancel, retry and compensate requests, a SideEffect's resolvedBy and approval.approvedBy) must be
the requesting user's own name whenever it differs from what is stored, so a colleague's later write, or
a `kubectl apply` of the manifest, is never refused for someone else's earlier decision.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

from agentrun.api import GROUP, RUN_LABEL, AttemptStatus, PendingRequest, RunPhase, RunStatus
from agentrun.api.causes import RefusalCause
from agentrun.api.common import ApiModel

Manifest = dict[str, Any]

ADMISSION_API: Final = "admissionregistration.k8s.io/v1"
POD_NAME_EXTRA: Final = "authentication.kubernetes.io/pod-name"
# The garbage collector rewrites ownerReferences of dependents (orphaning) as its own ServiceAccount
# when kube-controller-manager runs with --use-service-account-credentials.
TRUSTED_CONTROLLERS: Final = ("system:serviceaccount:kube-system:generic-garbage-collector",)

# The Run status fields an attempt Pod writes (docs/security.md: the fenced commit fields); every other one is
# the operator's. pendingRequest.expiresAt is the operator's too: it derives it on its own clock.
WORKER_RUN_FIELDS: Final = ("result", "resultRef", "committedBy", "latestCheckpoint", "pendingRequest")
WORKER_ATTEMPT_FIELDS: Final = ("rejectedCommit", "usage", "traceId", "sdkReads")
# The phases in which the current Attempt's worker runs and may write.
WORKER_PHASES: Final = (RunPhase.RUNNING,)
# The phases in which a Run waits for an answer: the Attempt that holds the request (hold_seconds,
# pendingRequest.heldBy) may write then, only to release it (clear heldBy).
HOLD_PHASES: Final = (RunPhase.INPUT_REQUIRED, RunPhase.AUTH_REQUIRED, RunPhase.PAUSED)

POD_NAME: Final = (
    f"'{POD_NAME_EXTRA}' in request.userInfo.extra ? request.userInfo.extra['{POD_NAME_EXTRA}'][0] : ''"
)


def _quoted(values: Iterable[str]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _json_fields(model: type[ApiModel]) -> list[str]:
    return [field.alias or name for name, field in model.model_fields.items()]


def present(path: str) -> str:
    """CEL: every field along `path` (e.g. oldObject.status.pendingRequest) is set. has() of a field
    whose parent is missing is an error, not false: a SideEffect's stored status may not exist yet."""
    parts = path.split(".")
    return " && ".join(f"has({'.'.join(parts[:i])})" for i in range(2, len(parts) + 1))


def unchanged(new: str, old: str, field: str) -> str:
    """CEL: `field` of `new` is exactly what it is in `old` (present in both and equal, or in neither)."""
    a, b = f"{new}.{field}", f"{old}.{field}"
    return f"(({present(a)}) == ({present(b)}) && (!({present(a)}) || {a} == {b}))"


def _changed_fields_message(new: str, old: str, fields: Sequence[str], prefix: str) -> str:
    """CEL message: `prefix` followed by the names of `fields` that the request changes."""
    names = ", ".join(f"({unchanged(new, old, f)} ? '' : '{f} ')" for f in fields)
    return f"'{prefix}' + [{names}].join('')"


def _variable(name: str, expression: str) -> dict[str, str]:
    return {"name": name, "expression": expression}


def _validation(expression: str, message_expression: str, reason: str = "Forbidden") -> dict[str, str]:
    return {"expression": expression, "messageExpression": message_expression, "reason": reason}


def _is_attempt_of(run: str) -> str:
    """CEL: the requesting Pod's name is `<run>-a<number>`, i.e. an Attempt of that Run."""
    return (
        f"variables.podName.startsWith({run} + '-a')"
        f" && variables.podName.substring(size({run}) + 2).matches('^[0-9]+$')"
    )


def _pod_bound(what: str) -> dict[str, str]:
    return _validation(
        "variables.podName != ''",
        f"'{RefusalCause.NOT_POD_BOUND}: {what} is written by the agentrun operator or by an attempt Pod; '"
        " + request.userInfo.username + ' presented a token that is not bound to a Pod'",
    )


def _own_run(run: str, what: str) -> dict[str, str]:
    return _validation(
        "variables.ownRun",
        f"'{RefusalCause.NOT_OWN_RUN}: Pod ' + variables.podName + ' is not an Attempt of Run ' + {run}"
        f" + ': it may not write {what}'",
    )


def _policy(
    name: str,
    description: str,
    *,
    rules: list[dict[str, Any]],
    variables: list[dict[str, str]],
    validations: list[dict[str, str]],
    match_conditions: list[dict[str, str]],
    object_selector: dict[str, Any] | None = None,
) -> list[Manifest]:
    constraints: dict[str, Any] = {"resourceRules": rules}
    if object_selector is not None:
        constraints["objectSelector"] = object_selector
    policy = {
        "apiVersion": ADMISSION_API,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "annotations": {f"{GROUP}/description": description}},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": constraints,
            "matchConditions": match_conditions,
            "variables": variables,
            "validations": validations,
        },
    }
    binding = {
        "apiVersion": ADMISSION_API,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    return [policy, binding]


def _rule(group: str, resources: list[str], operations: list[str]) -> dict[str, Any]:
    return {"apiGroups": [group], "apiVersions": ["*"], "resources": resources, "operations": operations}


def _service_accounts_but(operator: str) -> list[dict[str, str]]:
    exempt = _quoted((operator, *TRUSTED_CONTROLLERS))
    return [
        {
            "name": "service-account",
            "expression": "request.userInfo.username.startsWith('system:serviceaccount:')",
        },
        {"name": "not-the-operator", "expression": f"!(request.userInfo.username in {exempt})"},
    ]


HOLD_KEPT_FIELDS: Final = tuple(f for f in WORKER_RUN_FIELDS if f != "pendingRequest")


def _held_request_fields() -> list[str]:
    return [f for f in _json_fields(PendingRequest) if f != "heldBy"]


def _run_status(operator: str) -> list[Manifest]:
    stored = "oldObject.status"
    operator_fields = [f for f in _json_fields(RunStatus) if f not in WORKER_RUN_FIELDS]
    request = "object.status.pendingRequest"
    old_request = "oldObject.status.pendingRequest"
    committed = "object.status.committedBy"
    return _policy(
        f"run-status.{GROUP}",
        "Run status: only the Pod of the stored current Attempt writes, only while no cancel is pending "
        "and the Run is Running, and only the worker's fields.",
        rules=[_rule(GROUP, ["runs/status"], ["UPDATE"])],
        variables=[
            _variable("podName", POD_NAME),
            _variable(
                "attempt",
                f"{present(stored + '.currentAttempt')}"
                f" ? object.metadata.name + '-a' + string({stored}.currentAttempt) : ''",
            ),
            _variable("ownRun", _is_attempt_of("object.metadata.name")),
            _variable(
                "observedCancelEpoch",
                f"{present(stored + '.observedCancelEpoch')} ? {stored}.observedCancelEpoch : 0",
            ),
            _variable("leaseEpoch", f"{present(stored + '.leaseEpoch')} ? {stored}.leaseEpoch : 0"),
            _variable("phase", f"{present(stored + '.phase')} ? {stored}.phase : ''"),
            _variable(
                "holds",
                f"{present(old_request + '.heldBy')} && {old_request}.heldBy == variables.podName",
            ),
        ],
        validations=[
            _pod_bound("Run status"),
            _own_run("object.metadata.name", "its status"),
            _validation(
                "variables.podName == variables.attempt",
                f"'{RefusalCause.NOT_CURRENT_ATTEMPT}: Pod ' + variables.podName + ' may not write Run '"
                " + object.metadata.name + ': its current Attempt is '"
                " + (variables.attempt == '' ? 'none' : variables.attempt)",
            ),
            _validation(
                "oldObject.spec.cancelEpoch == variables.observedCancelEpoch",
                f"'{RefusalCause.STALE_AFTER_CANCEL}:"
                " Run ' + object.metadata.name + ' has a cancel pending (cancelEpoch '"
                " + string(oldObject.spec.cancelEpoch) + '): no worker write is accepted any more'",
            ),
            _validation(
                f"variables.phase in {_quoted(WORKER_PHASES)}"
                f" || (variables.phase in {_quoted(HOLD_PHASES)} && variables.holds)",
                f"'{RefusalCause.STALE_WORKER}: Run ' + object.metadata.name + ' is '"
                " + (variables.phase == '' ? 'not started' : variables.phase)"
                " + ': its worker writes only while it is Running (or holds the pending request)'",
            ),
            _validation(
                f"!(variables.phase in {_quoted(HOLD_PHASES)})"
                f" || ({' && '.join(unchanged('object.status', stored, f) for f in HOLD_KEPT_FIELDS)}"
                f" && {present(request)} && !has({request}.heldBy)"
                f" && {' && '.join(unchanged(request, old_request, f) for f in _held_request_fields())})",
                f"'{RefusalCause.NOT_WORKER_FIELD}:"
                " while the Run waits, the Attempt holding its request only releases it "
                "(clears pendingRequest.heldBy)'",
            ),
            _validation(
                f"!({present(request + '.heldBy')}) || {request}.heldBy == variables.podName"
                f" || {unchanged(request, old_request, 'heldBy')}",
                f"'{RefusalCause.NOT_CURRENT_ATTEMPT}:"
                " pendingRequest.heldBy names the Attempt that holds it ('"
                " + variables.podName + ')'",
            ),
            _validation(
                f"!({present(committed)}) || {unchanged('object.status', stored, 'committedBy')}"
                f" || ({committed}.attempt == variables.podName"
                f" && {committed}.leaseEpoch == variables.leaseEpoch"
                f" && {committed}.cancelEpoch == oldObject.spec.cancelEpoch)",
                f"'{RefusalCause.STALE_WORKER}: committedBy must name this Attempt (' + variables.podName"
                " + '), the stored lease epoch (' + string(variables.leaseEpoch)"
                " + ') and cancel epoch (' + string(oldObject.spec.cancelEpoch) + ')'",
            ),
            _validation(
                " && ".join(unchanged("object.status", stored, f) for f in operator_fields),
                _changed_fields_message(
                    "object.status",
                    stored,
                    operator_fields,
                    f"{RefusalCause.NOT_WORKER_FIELD}:"
                    f" an attempt Pod writes only {', '.join(WORKER_RUN_FIELDS)}; "
                    "this request changes ",
                ),
            ),
            _validation(
                f"!({present(request + '.expiresAt')})"
                f" || ({present(old_request + '.expiresAt')}"
                f" && {request}.expiresAt == {old_request}.expiresAt)",
                f"'{RefusalCause.NOT_WORKER_FIELD}:"
                " pendingRequest.expiresAt is derived by the operator on its own clock; "
                "a worker sets expiresInSeconds'",
            ),
        ],
        match_conditions=_service_accounts_but(operator),
    )


def _attempt_status(operator: str) -> list[Manifest]:
    operator_fields = [f for f in _json_fields(AttemptStatus) if f not in WORKER_ATTEMPT_FIELDS]
    return _policy(
        f"attempt-status.{GROUP}",
        "Attempt status: a Pod writes only its own Attempt, and only rejectedCommit, usage, traceId and "
        "sdkReads.",
        rules=[_rule(GROUP, ["attempts/status"], ["UPDATE"])],
        variables=[
            _variable("podName", POD_NAME),
            _variable("ownRun", _is_attempt_of("oldObject.spec.runName")),
        ],
        validations=[
            _pod_bound("Attempt status"),
            _own_run("oldObject.spec.runName", "its Attempts"),
            _validation(
                "variables.podName == object.metadata.name",
                f"'{RefusalCause.NOT_CURRENT_ATTEMPT}:"
                " Pod ' + variables.podName + ' may write only its own Attempt, not '"
                " + object.metadata.name",
            ),
            _validation(
                " && ".join(unchanged("object.status", "oldObject.status", f) for f in operator_fields),
                _changed_fields_message(
                    "object.status",
                    "oldObject.status",
                    operator_fields,
                    f"{RefusalCause.NOT_WORKER_FIELD}:"
                    f" an attempt Pod writes only {', '.join(WORKER_ATTEMPT_FIELDS)} of "
                    "its Attempt (the operator derives the phase); this request changes ",
                ),
            ),
        ],
        match_conditions=_service_accounts_but(operator),
    )


def _owned_by_run(run: str) -> str:
    """CEL: the new object is labelled with and owned by the Run named `run` (by name: a policy cannot
    read the Run's uid; the SDK checks the uid on every object it did not create itself)."""
    return (
        f"has(object.metadata.labels) && '{RUN_LABEL}' in object.metadata.labels"
        f" && object.metadata.labels['{RUN_LABEL}'] == {run}"
        " && has(object.metadata.ownerReferences) && size(object.metadata.ownerReferences) > 0"
        f" && object.metadata.ownerReferences.all(o, o.kind == 'Run' && o.name == {run})"
    )


def _ledger_create(kind: str, plural: str, operator: str, names_attempt: str | None) -> list[Manifest]:
    validations = [
        _pod_bound(f"a {kind}"),
        _own_run("object.spec.runName", f"a {kind} for it"),
        _validation(
            _owned_by_run("object.spec.runName"),
            f"'{RefusalCause.NOT_OWN_RUN}: a {kind} carries the label {RUN_LABEL}=' + object.spec.runName"
            " + ' and that Run as its only owner'",
        ),
    ]
    if names_attempt:
        validations.append(
            _validation(
                f"{names_attempt} == variables.podName",
                f"'{RefusalCause.NOT_CURRENT_ATTEMPT}:"
                f" a {kind} names the Attempt that writes it (' + variables.podName + ')'",
            )
        )
    return _policy(
        f"{plural}-create.{GROUP}",
        f"{kind} create: only an attempt Pod of spec.runName, for its own Run.",
        rules=[_rule(GROUP, [plural], ["CREATE"])],
        variables=[
            _variable("podName", POD_NAME),
            _variable("ownRun", _is_attempt_of("object.spec.runName")),
        ],
        validations=validations,
        match_conditions=_service_accounts_but(operator),
    )


def _side_effect_status(operator: str) -> list[Manifest]:
    return _policy(
        f"sideeffects-status.{GROUP}",
        "SideEffect status: only an attempt Pod of its Run, naming itself; approvals are written by the "
        "operator or by people, never by a Pod; resolvedBy by a Pod only as the lookup it made.",
        rules=[_rule(GROUP, ["sideeffects/status"], ["UPDATE"])],
        variables=[
            _variable("podName", POD_NAME),
            _variable("ownRun", _is_attempt_of("oldObject.spec.runName")),
        ],
        validations=[
            _pod_bound("SideEffect status"),
            _own_run("oldObject.spec.runName", "its SideEffects"),
            _validation(
                f"!({present('object.status.attempt')}) || object.status.attempt == variables.podName"
                f" || {unchanged('object.status', 'oldObject.status', 'attempt')}",
                f"'{RefusalCause.NOT_CURRENT_ATTEMPT}: status.attempt names the Attempt that writes it ('"
                " + variables.podName + ')'",
            ),
            _validation(
                unchanged("object.status", "oldObject.status", "approval"),
                f"'{RefusalCause.NOT_WORKER_FIELD}:"
                " an approval is recorded by the operator or by a person, never by an "
                "attempt Pod'",
            ),
            _validation(
                unchanged("object.status", "oldObject.status", "inheritedFrom"),
                f"'{RefusalCause.NOT_WORKER_FIELD}:"
                " inheritedFrom marks the record a fork inherited from its source Run; the operator writes "
                "it, never an attempt Pod'",
            ),
            *[
                _validation(
                    unchanged("object.status", "oldObject.status", field),
                    f"'{RefusalCause.NOT_WORKER_FIELD}:"
                    f" {field} records a verdict of a person, never of an attempt Pod'",
                )
                for field in ("resolution", "resolutionMessage", "resolvedSends")
            ],
            _validation(
                unchanged("object.status", "oldObject.status", "resolvedBy")
                + " || object.status.resolvedBy == 'lookup by ' + variables.podName",
                f"'{RefusalCause.NOT_WORKER_FIELD}:"
                " resolvedBy names a person, or the lookup that resolved the record: an "
                "attempt Pod may write only \"lookup by ' + variables.podName + '\"'",
            ),
        ],
        match_conditions=_service_accounts_but(operator),
    )


# The Run's control requests that name who sent them: (field of spec, the field naming the person).
RUN_PERSON_FIELDS: Final = (
    ("resume", "answeredBy"),
    ("cancelRequest", "requestedBy"),
    ("retryRequest", "requestedBy"),
    ("compensateRequest", "requestedBy"),
)
APPROVAL_PREFIX: Final = "approve-"  # the request ids of approvals (agentrun.core.interrupts: the same)
WHOAMI: Final = "your user name as `kubectl auth whoami` shows it"
USER: Final = "request.userInfo.username"


def _stored_equal(path: str) -> str:
    """CEL: the request keeps `path` (below object.) as stored: an update, present in both and equal."""
    new, old = f"object.{path}", f"oldObject.{path}"
    return f"(request.operation == 'UPDATE' && {present(old)} && {present(new)} && {new} == {old})"


def _names_the_sender(path: str, request: str | None = None) -> dict[str, str]:
    """object.`path` is the requesting user's name unless the request that holds it (object.`request`,
    by default the field itself) is exactly what is stored: a new request under someone else's name is
    refused, an earlier one kept as it is is not."""
    field = f"object.{path}"
    return _validation(
        f"!({present(field)}) || {field} == {USER} || {_stored_equal(request or path)}",
        f"'{RefusalCause.NOT_THE_SENDER}: {path} names ' + {field}"
        f" + ' but this request comes from ' + {USER}"
        f" + ': set {path} to ' + {USER} + ', {WHOAMI} (a bot acts for a person by impersonating them)'",
    )


def _not_operator(operator: str) -> list[dict[str, str]]:
    exempt = _quoted((operator, *TRUSTED_CONTROLLERS))
    return [{"name": "not-the-operator", "expression": f"!({USER} in {exempt})"}]


def _run_requests(operator: str) -> list[Manifest]:
    resume = "object.spec.resume"
    return _policy(
        f"run-requests.{GROUP}",
        "A Run's control requests name who sent them: answeredBy and requestedBy are the requesting "
        "user's own name whenever they differ from what is stored; an answer to an approval names who "
        "approves.",
        rules=[_rule(GROUP, ["runs"], ["CREATE", "UPDATE"])],
        variables=[],
        validations=[
            *(
                _names_the_sender(f"spec.{request}.{field}", f"spec.{request}")
                for request, field in RUN_PERSON_FIELDS
            ),
            _validation(
                f"!({present(resume)}) || !{resume}.requestId.startsWith('{APPROVAL_PREFIX}')"
                f" || has({resume}.answeredBy) || {_stored_equal('spec.resume')}",
                f"'{RefusalCause.NOT_NAMED}: an answer to an approval names who approves: "
                "set spec.resume.answeredBy to '"
                f" + {USER} + ', {WHOAMI}'",
            ),
        ],
        match_conditions=_not_operator(operator),
    )


def _side_effect_decisions(operator: str) -> list[Manifest]:
    status = "object.status"
    return _policy(
        f"sideeffects-decisions.{GROUP}",
        "SideEffect status written by people (not by a Pod, nor the operator): a resolution names its "
        "resolver, and resolvedBy and approval.approvedBy are the requesting user's own name whenever "
        "they differ from what is stored.",
        rules=[_rule(GROUP, ["sideeffects/status"], ["UPDATE"])],
        variables=[],
        validations=[
            _names_the_sender("status.resolvedBy"),
            _names_the_sender("status.approval.approvedBy", "status.approval"),
            _validation(
                f"!({present(status + '.resolution')}) || {_stored_equal('status.resolution')}"
                f" || ({present(status + '.resolvedBy')} && {status}.resolvedBy == {USER})",
                f"'{RefusalCause.NOT_NAMED}: a resolution names who made it: "
                "set status.resolvedBy to ' + " + USER + f" + ', {WHOAMI}'",
            ),
            _validation(
                f"!({present(status + '.approval')}) || {_stored_equal('status.approval')}"
                f" || has({status}.approval.approvedBy)",
                f"'{RefusalCause.NOT_NAMED}: an approval names who gave it: "
                "set status.approval.approvedBy to ' + " + USER + f" + ', {WHOAMI}'",
            ),
        ],
        match_conditions=[
            *_not_operator(operator),
            {
                "name": "not-a-pod",
                "expression": "!has(request.userInfo.extra)"
                f" || !('{POD_NAME_EXTRA}' in request.userInfo.extra)",
            },
        ],
    )


LEASE_SPEC_FIELDS: Final = (
    "holderIdentity",
    "leaseDurationSeconds",
    "acquireTime",
    "leaseTransitions",
    "preferredHolder",
    "strategy",
)
METADATA_FIELDS: Final = ("labels", "annotations", "ownerReferences", "finalizers")


def _lease(operator: str) -> list[Manifest]:
    holder = "oldObject.spec.holderIdentity"
    run = f"oldObject.metadata.labels['{RUN_LABEL}']"
    return _policy(
        f"run-lease.{GROUP}",
        "A Run's Lease: the operator creates and takes over; the Pod named in the stored holderIdentity "
        "renews it (renewTime only).",
        rules=[_rule("coordination.k8s.io", ["leases"], ["CREATE", "UPDATE"])],
        variables=[
            _variable("podName", POD_NAME),
            _variable(
                "ownRun",
                f"request.operation == 'UPDATE' && has(oldObject.metadata.labels)"
                f" && '{RUN_LABEL}' in oldObject.metadata.labels && {_is_attempt_of(run)}",
            ),
        ],
        validations=[
            _validation(
                "request.operation == 'UPDATE'",
                f"'{RefusalCause.NOT_OPERATOR}: only the agentrun operator creates the Lease of a Run'",
            ),
            _pod_bound("The Lease of a Run"),
            _validation(
                "variables.ownRun",
                f"'{RefusalCause.NOT_OWN_RUN}:"
                " Pod ' + variables.podName + ' is not an Attempt of the Run of Lease '"
                " + object.metadata.name",
            ),
            _validation(
                f"has({holder}) && {holder} == variables.podName",
                f"'{RefusalCause.NOT_CURRENT_ATTEMPT}: Lease ' + object.metadata.name + ' is held by '"
                f" + (has({holder}) ? {holder} : 'nobody') + ', not by ' + variables.podName",
            ),
            _validation(
                " && ".join(
                    [
                        *(unchanged("object.spec", "oldObject.spec", f) for f in LEASE_SPEC_FIELDS),
                        *(unchanged("object.metadata", "oldObject.metadata", f) for f in METADATA_FIELDS),
                    ]
                ),
                f"'{RefusalCause.NOT_WORKER_FIELD}:"
                " the holder of the Lease of a Run changes only spec.renewTime'",
            ),
        ],
        match_conditions=_service_accounts_but(operator),
        object_selector={"matchExpressions": [{"key": RUN_LABEL, "operator": "Exists"}]},
    )


def _attempt_pods(operator: str) -> list[Manifest]:
    label = f"'{RUN_LABEL}'"
    return _policy(
        f"attempt-pods.{GROUP}",
        f"Pods labelled {RUN_LABEL} (attempt Pods, whose tokens may write a Run) are created only by the "
        "agentrun operator.",
        rules=[_rule("", ["pods"], ["CREATE", "UPDATE"])],
        variables=[],
        validations=[
            _validation(
                "request.operation == 'UPDATE' && has(oldObject.metadata.labels)"
                f" && {label} in oldObject.metadata.labels",
                f"'{RefusalCause.NOT_OPERATOR}:"
                f" only the agentrun operator creates Pods labelled {RUN_LABEL} ('"
                " + request.userInfo.username + ' may not)'",
            ),
        ],
        match_conditions=[
            {"name": "not-the-operator", "expression": f"request.userInfo.username != '{operator}'"}
        ],
        object_selector={"matchExpressions": [{"key": RUN_LABEL, "operator": "Exists"}]},
    )


def _operator_scope(operator: str) -> list[Manifest]:
    """The operator's own least privilege: in cluster mode RBAC lets it write every Pod and Lease of the
    cluster; this confines those writes to the objects agentrun creates (labelled with their Run)."""
    label = f"'{RUN_LABEL}'"
    return _policy(
        f"operator-scope.{GROUP}",
        f"The agentrun operator creates, changes and deletes only Pods and Leases labelled {RUN_LABEL}.",
        rules=[
            _rule("", ["pods"], ["CREATE", "UPDATE", "DELETE"]),
            _rule("coordination.k8s.io", ["leases"], ["CREATE", "UPDATE", "DELETE"]),
        ],
        variables=[_variable("subject", "request.operation == 'DELETE' ? oldObject : object")],
        validations=[
            _validation(
                f"has(variables.subject.metadata.labels) && {label} in variables.subject.metadata.labels",
                f"'{RefusalCause.NOT_OWN_RUN}:"
                f" the agentrun operator writes only Pods and Leases labelled {RUN_LABEL}; '"
                " + request.resource.resource + ' ' + request.name + ' is not one'",
            )
        ],
        match_conditions=[
            {"name": "the-operator", "expression": f"request.userInfo.username == '{operator}'"}
        ],
    )


def _operator_records(operator: str) -> list[Manifest]:
    """RBAC lets the operator patch the main resource of agentrun's objects for one thing only: clearing
    a finished Run's managedFields (core.runs.compaction). Its writes there change nothing else."""
    kept = ("labels", "annotations", "finalizers", "ownerReferences")
    same_metadata = " && ".join(
        f"(has(object.metadata.{f}) == has(oldObject.metadata.{f}))"
        f" && (!has(object.metadata.{f}) || object.metadata.{f} == oldObject.metadata.{f})"
        for f in kept
    )
    return _policy(
        f"operator-records.{GROUP}",
        "The agentrun operator's writes to the main resource of Runs, Attempts, Checkpoints and "
        "SideEffects change only metadata.managedFields: never a spec, a label, an annotation, a "
        "finalizer or an owner.",
        # the main resources only: a rule names a subresource (runs/status) to match it
        rules=[_rule(GROUP, ["runs", "attempts", "checkpoints", "sideeffects"], ["UPDATE"])],
        variables=[],
        validations=[
            _validation(
                "(has(object.spec) == has(oldObject.spec))"
                " && (!has(object.spec) || object.spec == oldObject.spec)"
                f" && {same_metadata}",
                f"'{RefusalCause.NOT_OPERATOR_FIELD}: the agentrun operator changes only"
                " metadata.managedFields of ' + request.resource.resource + ' ' + request.name",
            )
        ],
        match_conditions=[
            {"name": "the-operator", "expression": f"request.userInfo.username == '{operator}'"},
        ],
    )


def admission_policies(operator: str) -> list[Manifest]:
    """Every ValidatingAdmissionPolicy with its binding; `operator` is the operator's user name (for the
    chart, `system:serviceaccount:<namespace>:<name>`)."""
    return [
        *_run_status(operator),
        *_attempt_status(operator),
        *_ledger_create("Checkpoint", "checkpoints", operator, "object.spec.attempt"),
        *_ledger_create("SideEffect", "sideeffects", operator, None),
        *_side_effect_status(operator),
        *_run_requests(operator),
        *_side_effect_decisions(operator),
        *_lease(operator),
        *_attempt_pods(operator),
        *_operator_scope(operator),
        *_operator_records(operator),
    ]


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


# ---- what the operator checks at start-up (agentrun.operator.policies) --------------------------------

POLICY_GROUP: Final = "admissionregistration.k8s.io"


def policy_names() -> list[str]:
    """The policies' names; each has a binding of the same name. The operator refuses to start without
    them, and docs/security.md lists them (a test keeps the list in sync)."""
    return [d["metadata"]["name"] for d in admission_policies("") if d["kind"] == "ValidatingAdmissionPolicy"]


def policy_reader_rules() -> list[dict[str, Any]]:
    """RBAC for the operator to read the policies and their bindings by name (cluster-scoped objects:
    granted by a ClusterRole installed with the policies)."""
    return [
        {
            "apiGroups": [POLICY_GROUP],
            "resources": ["validatingadmissionpolicies", "validatingadmissionpolicybindings"],
            "resourceNames": policy_names(),
            "verbs": ["get"],
        }
    ]
