"""The Helm chart and manifests/: generated parts in sync with their Python sources, and what the chart
renders (with `helm template`, no cluster) for each mode. tests/e2e installs it on a real control plane."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from agentrun import priorities
from agentrun.admission import admission_policies, policy_names, policy_reader_rules
from agentrun.deploy import generate
from agentrun.deploy.values import Values
from agentrun.rbac import (
    ATTEMPT_POD_RULES,
    OPERATOR_RULES,
    STATE_STORE_NAMESPACE_RULES,
    STATE_STORE_PROVISION_RULES,
    STATE_STORE_SECRET,
    Rule,
)
from agentrun.statestore import versitygw
from devcluster.objectstore import ObjectStoreProcess
from support.corpus import REPO

CHART = REPO / "charts" / "agentrun"
HELM = generate.find_helm(REPO)
SCHEMA = generate.values_schema()
# The values that are Kubernetes objects passed through unchanged: the only open objects of the schema.
FREE_FORM_VALUES = {
    "affinity",
    "global",
    "podSecurityContext",
    "resources",
    "securityContext",
    "imagePullSecrets[*]",
    "tolerations[*]",
    "topologySpreadConstraints[*]",
    "operator.extraEnv[*]",
    "console.resources",
    "stateStore.bundled.resources",
    "stateStore.bundled.tolerations[*]",
}
NAMESPACED_RESOURCES = {
    ("agentrun.dev", "runs"),
    ("agentrun.dev", "attempts"),
    ("agentrun.dev", "checkpoints"),
    ("agentrun.dev", "sideeffects"),
    ("", "pods"),
    ("", "serviceaccounts"),
    ("", "events"),
    ("events.k8s.io", "events"),
    ("coordination.k8s.io", "leases"),
    ("kopf.dev", "kopfpeerings"),
    ("authorization.k8s.io", "localsubjectaccessreviews"),
    ("", "secrets"),
}


# The bundled state store is on by default: tests of other matters that compare whole grants turn it off.
NO_BUNDLED = "stateStore.bundled.enabled=false"


def template(*set_values: str, check: bool = True) -> list[dict[str, Any]]:
    argv = [HELM, "template", "rel", str(CHART), "--namespace=ops", f"--kube-version={generate.KUBE_VERSION}"]
    argv += [f"--set={value}" for value in set_values]
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check:
        assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def template_error(*set_values: str) -> str:
    argv = [HELM, "template", "rel", str(CHART), f"--kube-version={generate.KUBE_VERSION}"]
    out = subprocess.run(
        [*argv, *(f"--set={v}" for v in set_values)], capture_output=True, text=True, check=False
    )
    assert out.returncode != 0, "helm template accepted the values"
    return out.stderr


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    found = [
        doc
        for doc in by_kind(docs, kind)
        if doc["metadata"]["name"] == name and doc["metadata"].get("namespace") == namespace
    ]
    assert len(found) == 1, f"{kind} {namespace}/{name}: {len(found)} rendered"
    return found[0]


def grants(rules: list[Rule]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    container: dict[str, Any] = one(docs, "Deployment", "rel-agentrun", "ops")["spec"]["template"]["spec"][
        "containers"
    ][0]
    return container


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {var["name"]: var.get("value", var.get("valueFrom")) for var in container["env"]}


# --- generated files ----------------------------------------------------------------------------------


def test_generated_files_match_their_sources() -> None:
    drifted = generate.drifted(REPO, generate.rendered_files(REPO, HELM))
    assert drifted == [], f"out of date (run `make manifests`): {[str(path) for path in drifted]}"


def test_check_lists_changed_and_stale_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for part in ("charts", "manifests"):
        shutil.copytree(REPO / part, tmp_path / part)
    args = ["--root", str(tmp_path), "--helm", HELM]
    assert generate.main(["--check", *args]) == 0

    (tmp_path / "charts/agentrun/templates/_rules.tpl").write_text("{{/* edited by hand */}}\n")
    (tmp_path / "manifests/rbac.yaml").write_text("# edited by hand\n")
    (tmp_path / "manifests/old.yaml").write_text("# no longer generated\n")
    capsys.readouterr()
    assert generate.main(["--check", *args]) == 1
    err = capsys.readouterr().err
    for name in ("_rules.tpl", "manifests/rbac.yaml", "manifests/old.yaml"):
        assert name in err
    assert "operator.yaml" not in err

    assert generate.main(args) == 0
    assert generate.main(["--check", *args]) == 0
    assert not (tmp_path / "manifests/old.yaml").exists()


@pytest.mark.parametrize("path", sorted(generate.chart_files()))
def test_generated_chart_file_says_so(path: str) -> None:
    text = (CHART / path).read_text()
    assert "Generated by `python -m agentrun.deploy.generate`" in text
    assert "Do not edit" in text or "do not edit" in text


# --- RBAC rules ---------------------------------------------------------------------------------------


def test_rule_sets_split_the_operator_rules_without_loss() -> None:
    sets = generate.rule_sets()
    # the bundled store's rule set is rendered only with it (test_the_operator_may_create_...)
    others = ("agentrun.rules.attempt", "agentrun.rules.operator.provision")
    operator_sets = [rules for name, rules in sets.items() if name not in others]
    assert set().union(*(grants(rules) for rules in operator_sets)) == grants(OPERATOR_RULES)
    assert grants(sets["agentrun.rules.attempt"]) == grants(ATTEMPT_POD_RULES)
    assert grants(sets["agentrun.rules.operator.provision"]) == grants(STATE_STORE_PROVISION_RULES)
    for name, rules in sets.items():
        scopes = {
            (group, resource.split("/")[0]) in generate.CLUSTER_SCOPED for group, resource, _ in grants(rules)
        }
        assert scopes == {name.endswith(".cluster")}, name


def test_every_resource_in_the_rules_has_a_known_scope() -> None:
    resources = {
        (group, resource.split("/")[0]) for group, resource, _ in grants(OPERATOR_RULES + ATTEMPT_POD_RULES)
    }
    assert resources <= NAMESPACED_RESOURCES | generate.CLUSTER_SCOPED


def test_attempt_pods_get_no_secrets_pods_or_deletes() -> None:
    attempt = grants(ATTEMPT_POD_RULES)
    assert not {resource for _, resource, _ in attempt} & {"secrets", "pods", "configmaps", "serviceaccounts"}
    assert not {verb for _, _, verb in attempt} & {"delete", "deletecollection", "update", "*", "escalate"}
    assert ("agentrun.dev", "runs", "patch") not in attempt  # the spec is the user's


# --- values and their schema --------------------------------------------------------------------------


def schema_objects(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if "$ref" in node:
        node = SCHEMA["$defs"][node["$ref"].removeprefix("#/$defs/")]
    if node.get("type") == "object":
        yield path, node
    for name, child in node.get("properties", {}).items():
        yield from schema_objects(child, f"{path}.{name}".lstrip("."))
    if isinstance(node.get("items"), dict):
        yield from schema_objects(node["items"], f"{path}[*]")


def test_values_schema_refuses_unknown_keys_everywhere_but_kubernetes_objects() -> None:
    # closed: additionalProperties false (records) or a schema (maps of strings: labels, annotations)
    open_objects = {
        path for path, node in schema_objects(SCHEMA) if node.get("additionalProperties", True) is True
    }
    assert open_objects == FREE_FORM_VALUES
    records = {path for path, node in schema_objects(SCHEMA) if node.get("additionalProperties") is False}
    assert records == {
        "",
        "image",
        "crds",
        "admission",
        "apiPriority",
        "peering",
        "health",
        "metrics",
        "metrics.serviceMonitor",
        "operator",
        "serviceAccount",
        "agents",
        "agents.serviceAccount",
        "rbac",
        "podDisruptionBudget",
        "stateStore",
        "stateStore.bundled",
        "stateStore.bundled.image",
        "stateStore.bundled.storage",
        "console",
        "console.service",
    }


def test_values_yaml_is_the_model_defaults_and_valid() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values == Values().model_dump(by_alias=True)
    jsonschema.Draft202012Validator(SCHEMA).validate(values)


@pytest.mark.parametrize(
    "bad",
    [
        "replicaCount=-1",
        "unknownKey=1",
        "peering.unknown=1",
        "image.pullPolicy=Sometimes",
        "health.port=80",
        "metrics.port=80",
        "metrics.serviceMonitor.interval=soon",
        "logFormat=xml",
        "stateStore.url=s3://key:secret@bucket/prefix",
        "stateStore.url=http://bucket",
        "stateStore.agentSecretName=Not_A_Name",
        "stateStore.bundled.unknown=1",
        "stateStore.bundled.bucket=Not_A_Bucket",
        "stateStore.bundled.storage.size=lots",
        "stateStore.bundled.port=80",
    ],
)
def test_bad_values_are_refused_by_the_schema(bad: str) -> None:
    assert "agentrun" in template_error(bad)


def test_without_a_state_store_the_operator_is_told_it_was_chosen() -> None:
    """No URL and the bundled server turned off: no store, which the operator is told is meant (it says so
    at its start, never falling back to inline state silently)."""
    container = operator_container(template(NO_BUNDLED))
    env = env_of(container)
    assert not {
        "AGENTRUN_STATE_STORE_URL",
        "AGENTRUN_STATE_STORE_SECRET",
        "AGENTRUN_STATE_STORE_PROVISION",
    } & set(env)
    assert env["AGENTRUN_STATE_STORE_INLINE"] == "true"
    assert "envFrom" not in container


def test_a_state_store_reaches_the_operator_with_its_own_credentials() -> None:
    url = "s3://agent-state/prod?endpoint=https://s3.example.com&region=eu-west-1"
    container = operator_container(
        template(
            f"stateStore.url={url}",
            "stateStore.credentialsSecret=operator-store",
            "stateStore.agentSecretName=team-store",
            NO_BUNDLED,
        )
    )
    env = env_of(container)
    assert not {"AGENTRUN_STATE_STORE_INLINE", "AGENTRUN_STATE_STORE_PROVISION"} & set(env)
    assert (env["AGENTRUN_STATE_STORE_URL"], env["AGENTRUN_STATE_STORE_SECRET"]) == (url, "team-store")
    assert container["envFrom"] == [{"secretRef": {"name": "operator-store"}}]


def test_several_replicas_need_peering() -> None:
    assert "replicaCount > 1 needs peering.enabled" in template_error(
        "replicaCount=2", "peering.enabled=false"
    )


# --- what the chart renders ---------------------------------------------------------------------------


def test_default_install_is_cluster_wide_and_highly_available() -> None:
    docs = template(NO_BUNDLED)  # the bundled store's grant: test_the_operator_may_create_the_namespaces_...
    role = one(docs, "ClusterRole", "rel-agentrun")
    assert grants(role["rules"]) == grants(OPERATOR_RULES) - grants(
        generate.split_rules(OPERATOR_RULES, cluster=False, peering=True)
    )
    binding = one(docs, "ClusterRoleBinding", "rel-agentrun")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rel-agentrun", "namespace": "ops"}]
    assert grants(one(docs, "ClusterRole", "rel-agentrun-attempt")["rules"]) == grants(ATTEMPT_POD_RULES)
    agent_binding = one(docs, "RoleBinding", "rel-agentrun-attempt", "ops")
    assert agent_binding["roleRef"]["kind"] == "ClusterRole"
    assert agent_binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "agentrun-agent", "namespace": "ops"}
    ]
    one(docs, "ServiceAccount", "agentrun-agent", "ops")
    assert not by_kind(docs, "Role")

    deployment = one(docs, "Deployment", "rel-agentrun", "ops")
    assert deployment["spec"]["replicas"] == 2
    env = env_of(operator_container(docs))
    assert env["AGENTRUN_PEERING"] == "agentrun"
    assert env["AGENTRUN_PRIORITY"] == "auto"
    assert env["POD_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert one(docs, "PodDisruptionBudget", "rel-agentrun", "ops")["spec"]["maxUnavailable"] == 1
    assert "--namespace" not in " ".join(operator_container(docs)["args"])


def test_operator_pod_is_hardened() -> None:
    docs = template()
    pod = one(docs, "Deployment", "rel-agentrun", "ops")["spec"]["template"]["spec"]
    container = operator_container(docs)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["serviceAccountName"] == "rel-agentrun"
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert {"cpu", "memory"} <= set(container["resources"]["limits"])
    assert container["command"] == ["python", "-m", "agentrun.operator"]
    assert "--liveness=http://0.0.0.0:8080/healthz" in container["args"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["ports"] == [
        {"name": "health", "containerPort": 8080, "protocol": "TCP"},
        {"name": "metrics", "containerPort": 8000, "protocol": "TCP"},
    ]


def test_health_endpoint_can_be_turned_off() -> None:
    container = operator_container(template("health.enabled=false"))
    assert not {"livenessProbe", "readinessProbe", "startupProbe"} & set(container)
    assert [port["name"] for port in container["ports"]] == ["metrics"]
    assert "args" not in container
    bare = operator_container(template("health.enabled=false", "metrics.enabled=false"))
    assert "ports" not in bare


def test_metrics_are_served_and_exposed_by_a_service() -> None:
    docs = template()
    env = env_of(operator_container(docs))
    assert env["AGENTRUN_METRICS_PORT"] == "8000"
    assert env["AGENTRUN_LOG_FORMAT"] == "json"
    service = one(docs, "Service", "rel-agentrun-metrics", "ops")
    assert service["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "8000",
        "prometheus.io/path": "/metrics",
    }
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 8000, "targetPort": "metrics", "protocol": "TCP"}
    ]
    pod_labels = one(docs, "Deployment", "rel-agentrun", "ops")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "operator"
    assert not by_kind(docs, "ServiceMonitor"), "a ServiceMonitor needs the Prometheus Operator: opt-in"


def test_service_monitor_is_opt_in() -> None:
    docs = template("metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.labels.release=prom")
    monitor = one(docs, "ServiceMonitor", "rel-agentrun", "ops")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "30s"}]
    service = one(docs, "Service", "rel-agentrun-metrics", "ops")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["ops"]}


def test_metrics_can_be_turned_off() -> None:
    docs = template("metrics.enabled=false", "logFormat=text", NO_BUNDLED)
    assert not by_kind(docs, "Service")
    env = env_of(operator_container(docs))
    assert env["AGENTRUN_METRICS_PORT"] == "0"
    assert env["AGENTRUN_LOG_FORMAT"] == "text"
    assert "metrics.serviceMonitor.enabled needs metrics.enabled" in template_error(
        "metrics.enabled=false", "metrics.serviceMonitor.enabled=true"
    )
    assert "health.port and metrics.port must differ" in template_error("metrics.port=8080")


def cluster_scoped(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(doc["kind"], doc["metadata"]["name"]) for doc in docs if "namespace" not in doc["metadata"]}


def test_namespace_scoped_mode_creates_nothing_cluster_scoped_unless_asked() -> None:
    docs = template("watchNamespaces={team-a,team-b}", NO_BUNDLED)
    assert cluster_scoped(docs) == set(), "a namespace administrator can install it"
    asked = template(
        "watchNamespaces={team-a}",
        "crds.install=true",
        "peering.installCrds=true",
        "admission.install=true",
        "apiPriority.install=true",
    )
    assert {kind for kind, _ in cluster_scoped(asked)} == {
        "CustomResourceDefinition",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ClusterRole",
        "ClusterRoleBinding",
        "PriorityLevelConfiguration",
        "FlowSchema",
    }
    assert {name for kind, name in cluster_scoped(asked) if kind.startswith("ClusterRole")} == {
        "rel-agentrun-admission-reader"
    }
    assert operator_container(docs)["args"][:2] == ["--namespace=team-a", "--namespace=team-b"]
    expected = grants(generate.split_rules(OPERATOR_RULES, cluster=False, peering=False)) | grants(
        generate.split_rules(OPERATOR_RULES, cluster=False, peering=True)
    )
    for namespace in ("team-a", "team-b"):
        assert grants(one(docs, "Role", "rel-agentrun", namespace)["rules"]) == expected
        binding = one(docs, "RoleBinding", "rel-agentrun", namespace)
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rel-agentrun", "namespace": "ops"}]
        assert grants(one(docs, "Role", "rel-agentrun-attempt", namespace)["rules"]) == grants(
            ATTEMPT_POD_RULES
        )
        agent_binding = one(docs, "RoleBinding", "rel-agentrun-attempt", namespace)
        assert agent_binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "rel-agentrun-attempt",
        }
        one(docs, "ServiceAccount", "agentrun-agent", namespace)
    without_peering = template("watchNamespaces={team-a}", "peering.enabled=false", "replicaCount=1")
    role = one(without_peering, "Role", "rel-agentrun", "team-a")
    assert "kopf.dev" not in {group for group, _, _ in grants(role["rules"])}


def test_cluster_mode_installs_the_policies_and_lets_the_operator_read_them() -> None:
    docs = template()
    assert {d["metadata"]["name"] for d in by_kind(docs, "ValidatingAdmissionPolicy")} == set(policy_names())
    assert {d["metadata"]["name"] for d in by_kind(docs, "ValidatingAdmissionPolicyBinding")} == set(
        policy_names()
    )
    reader = one(docs, "ClusterRole", "rel-agentrun-admission-reader")
    assert reader["rules"] == policy_reader_rules()
    binding = one(docs, "ClusterRoleBinding", "rel-agentrun-admission-reader")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rel-agentrun", "namespace": "ops"}]
    assert binding["roleRef"]["name"] == "rel-agentrun-admission-reader"
    assert not by_kind(template("admission.install=false"), "ValidatingAdmissionPolicy")


def test_cluster_mode_sends_the_operator_and_lease_renewals_before_agents_steps() -> None:
    """API Priority and Fairness: the release's operator ServiceAccount and every ServiceAccount's Lease
    renewals go to agentrun-control, what Pods write to agentrun.dev to agentrun-steps, both matched
    before the API server's own service-accounts schema (9000) would put them into workload-low."""
    docs = template("serviceAccount.name=bot")
    levels = {d["metadata"]["name"]: d["spec"] for d in by_kind(docs, "PriorityLevelConfiguration")}
    assert set(levels) == {priorities.CONTROL_LEVEL, priorities.STEPS_LEVEL}
    assert all(level["limited"]["limitResponse"]["type"] == "Queue" for level in levels.values())
    schemas = {d["metadata"]["name"]: d["spec"] for d in by_kind(docs, "FlowSchema")}
    assert {name: s["priorityLevelConfiguration"]["name"] for name, s in schemas.items()} == {
        "agentrun-operator": priorities.CONTROL_LEVEL,
        "agentrun-lease-renewals": priorities.CONTROL_LEVEL,
        "agentrun-steps": priorities.STEPS_LEVEL,
    }
    assert all(100 < s["matchingPrecedence"] < 9000 for s in schemas.values())
    (operator_rule,) = schemas["agentrun-operator"]["rules"]
    assert operator_rule["subjects"] == [
        {"kind": "ServiceAccount", "serviceAccount": {"name": "bot", "namespace": "ops"}}
    ]
    (renewals,) = schemas["agentrun-lease-renewals"]["rules"]
    assert renewals["resourceRules"][0]["resources"] == ["leases"]
    assert not by_kind(template("watchNamespaces={team-a}"), "FlowSchema")
    assert not by_kind(template("apiPriority.install=false"), "FlowSchema")


def test_a_cluster_admin_installs_the_policies_of_a_namespaced_release_alone() -> None:
    argv = [HELM, "template", "rel", str(CHART), "--namespace=ops", f"--kube-version={generate.KUBE_VERSION}"]
    values = [
        "--set=watchNamespaces={team-a}",
        "--set=admission.install=true",
        "--set=serviceAccount.name=bot",
    ]
    out = subprocess.run(
        [*argv, *values, "--show-only=templates/admission.yaml"], capture_output=True, text=True, check=True
    )
    docs = [doc for doc in yaml.safe_load_all(out.stdout) if doc]
    assert {doc["kind"] for doc in docs} == {
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ClusterRole",
        "ClusterRoleBinding",
    }
    (binding,) = by_kind(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "bot", "namespace": "ops"}]
    for policy in by_kind(docs, "ValidatingAdmissionPolicy"):
        conditions = " ".join(c["expression"] for c in policy["spec"]["matchConditions"])
        assert "system:serviceaccount:ops:bot" in conditions


def test_the_plain_manifests_carry_the_policies_with_their_reader_in_one_file() -> None:
    docs = [doc for doc in yaml.safe_load_all((REPO / "manifests" / "admission.yaml").read_text()) if doc]
    names = {(doc["kind"], doc["metadata"]["name"]) for doc in docs}
    assert {name for kind, name in names if kind == "ValidatingAdmissionPolicy"} == set(policy_names())
    assert ("ClusterRole", "agentrun-admission-reader") in names
    assert ("ClusterRoleBinding", "agentrun-admission-reader") in names


def test_replicas_can_listen_on_their_own_pod_ip() -> None:
    plain = operator_container(template())
    assert "--liveness=http://0.0.0.0:8080/healthz" in plain["args"]
    assert env_of(plain)["AGENTRUN_METRICS_ADDRESS"] == "0.0.0.0"
    container = operator_container(template("listenAddress=$(POD_IP)", "health.port=18080"))
    assert "--liveness=http://$(POD_IP):18080/healthz" in container["args"]
    names = [var["name"] for var in container["env"]]
    assert names.index("POD_IP") < names.index("AGENTRUN_METRICS_ADDRESS"), "defined before it is used"
    assert env_of(container)["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env_of(container)["AGENTRUN_METRICS_ADDRESS"] == "$(POD_IP)"


def test_crds_are_kept_on_uninstall_and_optional() -> None:
    crds = by_kind(template(), "CustomResourceDefinition")
    assert sorted(crd["metadata"]["name"] for crd in crds) == [
        "attempts.agentrun.dev",
        "checkpoints.agentrun.dev",
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
        "runs.agentrun.dev",
        "sideeffects.agentrun.dev",
    ]
    for crd in crds:
        assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        assert crd["metadata"]["labels"]["app.kubernetes.io/part-of"] == "agentrun"
    names = {
        crd["metadata"]["name"] for crd in by_kind(template("crds.install=false"), "CustomResourceDefinition")
    }
    assert names == {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}
    assert not by_kind(
        template("crds.install=false", "peering.installCrds=false"), "CustomResourceDefinition"
    )


def test_single_replica_has_no_disruption_budget() -> None:
    assert not by_kind(template("replicaCount=1"), "PodDisruptionBudget")


def test_helm_test_hook_checks_the_api_as_the_operator() -> None:
    argv = [HELM, "template", "rel", str(CHART), "--namespace=ops", f"--kube-version={generate.KUBE_VERSION}"]
    out = subprocess.run(
        [*argv, "--show-only=templates/tests/test-api.yaml"], capture_output=True, text=True, check=True
    )
    pod = yaml.safe_load(out.stdout)
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["serviceAccountName"] == "rel-agentrun"
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "agentrun.deploy.selftest"]
    assert container["args"] == ["--namespace=ops", "--peering=agentrun", "--cluster-peering", "--timeout=60"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_charts_policies_exempt_its_operators_service_account() -> None:
    docs = template("serviceAccount.name=robot")
    policies = by_kind(docs, "ValidatingAdmissionPolicy")
    assert {p["metadata"]["name"] for p in policies} == {
        d["metadata"]["name"] for d in admission_policies("x") if d["kind"] == "ValidatingAdmissionPolicy"
    }
    for policy in policies:
        conditions = " ".join(c["expression"] for c in policy["spec"]["matchConditions"])
        assert "'system:serviceaccount:ops:robot'" in conditions


def test_the_operator_reads_one_secret_by_name_only() -> None:
    """The state store's credentials Secret of each agent namespace, and no other Secret (no list, no watch:
    those would read every Secret of the cluster)."""
    rules = [rule for rule in OPERATOR_RULES if "secrets" in rule["resources"]]
    assert rules == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "verbs": ["get"],
            "resourceNames": [STATE_STORE_SECRET, f"{STATE_STORE_SECRET}-read"],
        }
    ]


@pytest.mark.parametrize(
    ("values", "name"),
    [((), STATE_STORE_SECRET), (("stateStore.agentSecretName=team-store",), "team-store")],
)
def test_the_charts_operator_reads_the_agents_store_secrets_by_their_configured_name(
    values: tuple[str, ...], name: str
) -> None:
    role = one(template(*values, NO_BUNDLED), "ClusterRole", "rel-agentrun")
    rules = [rule for rule in role["rules"] if "secrets" in rule["resources"]]
    names = [name, f"{name}-read"]
    assert rules == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"], "resourceNames": names}]


# --- the bundled state store --------------------------------------------------------------------------

BUNDLED = "stateStore.bundled.enabled=true"
STORE = "rel-agentrun-store"


def test_the_bundled_store_is_on_by_default_and_off_only_when_asked() -> None:
    docs = template()
    assert [d["metadata"]["name"] for d in by_kind(docs, "StatefulSet")] == [STORE]
    [claim] = one(docs, "StatefulSet", STORE, "ops")["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    env = env_of(operator_container(docs))
    assert env["AGENTRUN_STATE_STORE_PROVISION"] == "versitygw"
    assert env["AGENTRUN_STATE_STORE_URL"].startswith(
        "s3://agentrun?endpoint=http://rel-agentrun-store.ops.svc:"
    )
    assert "AGENTRUN_STATE_STORE_INLINE" not in env

    docs = template(NO_BUNDLED)
    assert not by_kind(docs, "StatefulSet")
    assert not [d for d in docs if d["metadata"]["name"].startswith(STORE)]
    assert "AGENTRUN_STATE_STORE_PROVISION" not in env_of(operator_container(docs))
    role = one(docs, "ClusterRole", "rel-agentrun")
    assert ("", "secrets", "create") not in grants(role["rules"])


def test_a_bundled_server_that_runs_elsewhere_is_administered_but_not_installed() -> None:
    """stateStore.bundled.install=false (the local control plane's object store, `make cluster`): the
    operator administers the server stateStore.url names with the root credentials of existingSecret; the
    chart renders no server."""
    url = "s3://agentrun?endpoint=http://127.0.0.1:7070&region=us-east-1"
    docs = template(
        "stateStore.bundled.install=false", f"stateStore.url={url}", "stateStore.bundled.existingSecret=root"
    )
    assert not by_kind(docs, "StatefulSet")
    assert not [d for d in docs if d["metadata"]["name"].startswith(STORE)]
    container = operator_container(docs)
    env = env_of(container)
    assert (env["AGENTRUN_STATE_STORE_URL"], env["AGENTRUN_STATE_STORE_PROVISION"]) == (url, "versitygw")
    assert container["envFrom"] == [{"secretRef": {"name": "root"}}]
    assert "needs stateStore.url" in template_error("stateStore.bundled.install=false")


def test_the_bundled_store_runs_the_server_the_local_control_plane_runs() -> None:
    """One replica of the pinned versitygw, started with the arguments the local control plane starts its
    own with (agentrun.statestore.versitygw), its data on the claim a volumeClaimTemplate makes."""
    docs = template(BUNDLED)
    sts = one(docs, "StatefulSet", STORE, "ops")
    assert sts["spec"]["replicas"] == 1
    assert sts["spec"]["serviceName"] == STORE
    retained = {"whenDeleted": "Retain", "whenScaled": "Retain"}
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == retained
    pod = sts["spec"]["template"]["spec"]
    (server,) = pod["containers"]
    image = f"{versitygw.IMAGE}:{versitygw.VERSION}"
    assert (server["image"], versitygw.VERSION) == ("ghcr.io/versity/versitygw:v1.8.0", "v1.8.0")
    assert server["command"] == ["versitygw"]
    assert server["args"] == versitygw.server_args(listen=f":{versitygw.PORT}", data_dir="/data")
    assert "--versioning-dir=/data/versions" in server["args"]
    assert "--iam-dir=/data/iam" in server["args"]
    assert server["ports"] == [{"name": "s3", "containerPort": 7070, "protocol": "TCP"}]
    for probe in ("readinessProbe", "livenessProbe"):
        assert server[probe]["httpGet"] == {"path": versitygw.HEALTH_PATH, "port": "s3"}
    root = {var["name"]: var["valueFrom"]["secretKeyRef"] for var in server["env"]}
    assert root == {
        "ROOT_ACCESS_KEY_ID": {"name": f"{STORE}-root", "key": "AWS_ACCESS_KEY_ID"},
        "ROOT_SECRET_ACCESS_KEY": {"name": f"{STORE}-root", "key": "AWS_SECRET_ACCESS_KEY"},
    }
    assert {"name": "data", "mountPath": "/data"} in server["volumeMounts"]
    (dirs,) = pod["initContainers"]
    assert dirs["image"] == image
    assert dirs["command"] == ["mkdir", "-p", *(f"/data/{d}" for d in versitygw.DATA_DIRS)]
    assert {"name": "data", "mountPath": "/data"} in dirs["volumeMounts"]
    # restricted Pod Security Standard, like the operator's
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    assert pod["automountServiceAccountToken"] is False
    for container in (server, dirs):
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"] == {"requests": {"storage": "10Gi"}}
    assert "storageClassName" not in claim["spec"]  # the cluster's default StorageClass
    service = one(docs, "Service", STORE, "ops")
    assert service["spec"]["ports"] == [{"name": "s3", "port": 7070, "targetPort": "s3", "protocol": "TCP"}]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "state-store"


def test_the_bundled_stores_volume_image_and_port_are_values() -> None:
    docs = template(
        BUNDLED,
        "stateStore.bundled.storage.size=50Gi",
        "stateStore.bundled.storage.storageClassName=fast",
        "stateStore.bundled.image.repository=mirror.example.com/versitygw",
        "stateStore.bundled.port=9000",
        "stateStore.bundled.bucket=agent-state",
    )
    sts = one(docs, "StatefulSet", STORE, "ops")
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "fast"
    assert claim["spec"]["resources"] == {"requests": {"storage": "50Gi"}}
    (server,) = sts["spec"]["template"]["spec"]["containers"]
    assert server["image"] == f"mirror.example.com/versitygw:{versitygw.VERSION}"
    assert server["args"] == versitygw.server_args(listen=":9000", data_dir="/data")
    env = env_of(operator_container(docs))
    assert env["AGENTRUN_STATE_STORE_URL"] == (
        "s3://agent-state?endpoint=http://rel-agentrun-store.ops.svc:9000&region=us-east-1"
    )
    static = one(
        template(BUNDLED, "stateStore.bundled.storage.storageClassName="), "StatefulSet", STORE, "ops"
    )
    assert static["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] == ""


def test_the_operator_administers_the_bundled_store_with_its_root_credentials() -> None:
    """The operator is pointed at the Service, told it provisions the namespaces' principals, and holds the
    root credentials the chart made (random, both keys) from the Secret the server reads them from."""
    docs = template(BUNDLED)
    container = operator_container(docs)
    env = env_of(container)
    assert env["AGENTRUN_STATE_STORE_URL"] == (
        f"s3://{versitygw.BUCKET}?endpoint=http://{STORE}.ops.svc:7070&region={versitygw.REGION}"
    )
    assert env["AGENTRUN_STATE_STORE_PROVISION"] == "versitygw"
    assert env["AGENTRUN_STATE_STORE_SECRET"] == STATE_STORE_SECRET
    assert container["envFrom"] == [{"secretRef": {"name": f"{STORE}-root"}}]
    secret = one(docs, "Secret", f"{STORE}-root", "ops")
    assert set(secret["data"]) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    again = one(template(BUNDLED), "Secret", f"{STORE}-root", "ops")
    assert again["data"] != secret["data"], "made afresh by each helm template (an install: once)"
    # an uninstall keeps it, as it keeps the server's volume (a StatefulSet's claim): a second install
    # finds the buckets owned by the credentials it reads back, not by new ones the server would refuse
    assert secret["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}


def test_the_bundled_store_takes_the_root_credentials_from_a_given_secret() -> None:
    docs = template(BUNDLED, "stateStore.bundled.existingSecret=store-root")
    assert not [d for d in by_kind(docs, "Secret") if d["metadata"]["name"] == f"{STORE}-root"]
    assert operator_container(docs)["envFrom"] == [{"secretRef": {"name": "store-root"}}]
    (server,) = one(docs, "StatefulSet", STORE, "ops")["spec"]["template"]["spec"]["containers"]
    assert {var["valueFrom"]["secretKeyRef"]["name"] for var in server["env"]} == {"store-root"}


def test_the_bundled_store_may_be_reached_at_another_url() -> None:
    url = "s3://agentrun/prod?endpoint=http://127.0.0.1:7070&region=us-east-1"
    env = env_of(operator_container(template(BUNDLED, f"stateStore.url={url}")))
    assert env["AGENTRUN_STATE_STORE_URL"] == url
    assert env["AGENTRUN_STATE_STORE_PROVISION"] == "versitygw"


def test_the_bundled_store_refuses_other_operator_credentials() -> None:
    assert "credentialsSecret must be empty" in template_error(BUNDLED, "stateStore.credentialsSecret=other")


@pytest.mark.parametrize("mode", ["cluster-wide", "namespace-scoped"])
def test_the_operator_may_create_the_namespaces_store_secrets_only_with_the_bundled_store(mode: str) -> None:
    scoped = ("watchNamespaces={team-a}",) if mode == "namespace-scoped" else ()
    kind, namespace = ("Role", "team-a") if scoped else ("ClusterRole", None)
    create = grants(STATE_STORE_PROVISION_RULES)
    assert create == {("", "secrets", "create")}
    assert not create & grants(one(template(NO_BUNDLED, *scoped), kind, "rel-agentrun", namespace)["rules"])
    assert create <= grants(one(template(BUNDLED, *scoped), kind, "rel-agentrun", namespace)["rules"])
    assert create <= grants(one(template(*scoped), kind, "rel-agentrun", namespace)["rules"])  # the default


def test_a_namespaced_operator_reads_its_namespaces_for_the_bundled_store_only_when_asked() -> None:
    """Its sweep of the server's principals reads each watched namespace (cluster-scoped): a ClusterRole
    limited to their names, rendered only when asked, as every cluster-scoped part of that mode."""
    scoped = ("watchNamespaces={team-a,team-b}", BUNDLED)
    assert not cluster_scoped(template(*scoped))
    docs = template(*scoped, "stateStore.bundled.readNamespaces=true")
    assert cluster_scoped(docs) == {
        ("ClusterRole", "rel-agentrun-namespaces"),
        ("ClusterRoleBinding", "rel-agentrun-namespaces"),
    }
    role = one(docs, "ClusterRole", "rel-agentrun-namespaces")
    (rule,) = role["rules"]
    assert rule == {
        "apiGroups": [""],
        "resources": ["namespaces"],
        "verbs": ["get"],
        "resourceNames": ["team-a", "team-b"],
    }
    assert grants(role["rules"]) == grants(STATE_STORE_NAMESPACE_RULES)
    binding = one(docs, "ClusterRoleBinding", "rel-agentrun-namespaces")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rel-agentrun", "namespace": "ops"}]
    # cluster-wide, the operator's ClusterRole already reads namespaces: nothing more
    wide = template(BUNDLED, "stateStore.bundled.readNamespaces=true")
    assert not [d for d in wide if d["metadata"]["name"] == "rel-agentrun-namespaces"]
    assert ("", "namespaces", "get") in grants(one(wide, "ClusterRole", "rel-agentrun")["rules"])


def test_the_local_control_plane_starts_the_same_server(tmp_path: Path) -> None:
    """hack/ builds the version the chart runs (the pin has one source) and starts it with the same
    arguments and directories."""
    out = subprocess.run(
        ["bash", str(REPO / "hack" / "build-versitygw.sh"), "print-version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == versitygw.VERSION
    binary = Path(shutil.which("true") or "/bin/true")
    local = ObjectStoreProcess(data_dir=tmp_path, log_path=tmp_path / "log", port=17070, binary=binary)
    same = versitygw.server_args(listen="127.0.0.1:17070", data_dir=str(tmp_path))
    assert local.argv() == [str(binary), *same]
    local.make_dirs()
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == sorted(versitygw.DATA_DIRS)
    assert set(local.process_env()) >= {versitygw.ROOT_ACCESS_KEY_ENV, versitygw.ROOT_SECRET_KEY_ENV}


# --- the console in the cluster -----------------------------------------------------------------------


def test_the_console_is_off_by_default() -> None:
    docs = template()
    assert not [d for d in docs if d["metadata"]["name"].endswith("-console")]
    assert "AGENTRUN_CONSOLE_URL" not in env_of(operator_container(docs))


def test_the_console_acts_with_the_proxys_tokens_and_a_service_account_bound_to_nothing() -> None:
    docs = template(
        "console.enabled=true",
        "console.hosts={agentrun.example.com}",
        "console.url=https://agentrun.example.com",
        "console.namespaces={team-a,team-b}",
    )
    deployment = one(docs, "Deployment", "rel-agentrun-console", "ops")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"] == ["python", "-m", "agentrun.cli", "console"]
    assert container["args"] == [
        "--proxy-token-header=X-Forwarded-Access-Token",
        "--address=0.0.0.0",
        "--port=8080",
        "--allow-host=agentrun.example.com",
        "--namespaces=team-a,team-b",
    ]
    assert pod["serviceAccountName"] == "rel-agentrun-console"
    one(docs, "ServiceAccount", "rel-agentrun-console", "ops")
    bound = [
        subject
        for binding in by_kind(docs, "RoleBinding") + by_kind(docs, "ClusterRoleBinding")
        for subject in binding.get("subjects") or []
    ]
    assert "rel-agentrun-console" not in {s["name"] for s in bound}, "no permission of its own"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    service = one(docs, "Service", "rel-agentrun-console", "ops")
    assert service["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert env_of(operator_container(docs))["AGENTRUN_CONSOLE_URL"] == "https://agentrun.example.com"


def test_the_console_needs_its_host_names_and_a_header_name() -> None:
    assert "console.enabled needs console.hosts" in template_error("console.enabled=true")
    assert "tokenHeader" in template_error(
        "console.enabled=true", "console.hosts={a.example.com}", "console.tokenHeader=X Bad"
    )
    authorization = template(
        "console.enabled=true", "console.hosts={a.example.com}", "console.tokenHeader=Authorization"
    )
    args = one(authorization, "Deployment", "rel-agentrun-console", "ops")["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    assert "--proxy-token-header=Authorization" in args
