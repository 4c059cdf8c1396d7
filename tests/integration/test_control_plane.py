"""The local control plane is the real thing: upstream API server, controllers, scheduler, RBAC, and a
node agent that runs Pods as processes the way a kubelet would."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import V1Pod

from support.kube import Kube, wait_for

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]


def python_pod(name: str, script: str, *, restart: str = "Never", **spec: Any) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": "agentrun/none",
        "command": ["python", "-c", textwrap.dedent(script)],
        **spec.pop("container", {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **spec.pop("metadata", {})},
        "spec": {"restartPolicy": restart, "containers": [container], **spec},
    }


def pinned_kubernetes_version() -> str:
    out = subprocess.run(
        ["bash", str(REPO / "hack/build-control-plane.sh"), "print-versions"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    match = re.search(r"kubernetes=(\S+)", out)
    assert match, out
    return match.group(1)


def test_version_is_the_pinned_release(kube: Kube) -> None:
    reported = json.loads(kube.kubectl("version", "-o", "json").stdout)["serverVersion"]
    assert reported["gitVersion"] == pinned_kubernetes_version()
    assert reported["major"] == "1"


def test_node_is_ready_with_a_heartbeat_lease(kube: Kube) -> None:
    node = kube.core.list_node().items[0]
    ready = next(c for c in node.status.conditions if c.type == "Ready")
    assert ready.status == "True"
    lease = kube.coordination.read_namespaced_lease(node.metadata.name, "kube-node-lease")
    assert lease.spec.holder_identity == node.metadata.name
    assert lease.spec.renew_time is not None


CRD_WITH_RULE = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.cel.test.dev}
spec:
  group: cel.test.dev
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              min: {type: integer}
              max: {type: integer}
            x-kubernetes-validations:
            - rule: self.min <= self.max
              message: spec.min must not exceed spec.max
"""


def test_cel_validation_refuses_a_bad_object_with_the_rule_message(kube: Kube, namespace: str) -> None:
    kube.kubectl("apply", "-f", "-", input=CRD_WITH_RULE)
    wait_for(
        lambda: "Established" in kube.kubectl("get", "crd", "widgets.cel.test.dev", "-o", "yaml").stdout,
        what="CRD established",
    )
    good = "apiVersion: cel.test.dev/v1\nkind: Widget\nmetadata: {name: ok}\nspec: {min: 1, max: 2}\n"
    bad = "apiVersion: cel.test.dev/v1\nkind: Widget\nmetadata: {name: bad}\nspec: {min: 5, max: 2}\n"
    # the CRD's schema may take a moment to reach the validating handler after Established
    wait_for(
        lambda: kube.kubectl("apply", "-f", "-", input=good, namespace=namespace, check=False).returncode == 0
    )
    refused = kube.kubectl("apply", "-f", "-", input=bad, namespace=namespace, check=False)
    assert refused.returncode != 0
    assert "spec.min must not exceed spec.max" in refused.stderr
    assert kube.get("widget", "bad", namespace) is None


def test_garbage_collector_deletes_an_owned_child(kube: Kube, namespace: str) -> None:
    owner = kube.core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    kube.core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "child", "ownerReferences": [ref]}}
    )
    kube.core.delete_namespaced_config_map("owner", namespace)
    wait_for(lambda: kube.get("configmap", "child", namespace) is None, timeout=120, what="child collected")


def test_failed_pod_reports_exit_code_and_termination_message(kube: Kube, namespace: str) -> None:
    script = """
        import os, sys
        with open(os.environ["TERMINATION_MESSAGE_PATH"], "w") as f:
            f.write('{"class": "deterministic", "message": "bad input"}')
        sys.exit(3)
    """
    kube.core.create_namespaced_pod(namespace, python_pod("fails", script))
    pod = kube.wait_pod_phase("fails", namespace, ("Succeeded", "Failed"))
    assert pod["status"]["phase"] == "Failed"
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 3
    assert terminated["reason"] == "Error"
    assert json.loads(terminated["message"]) == {"class": "deterministic", "message": "bad input"}


def test_env_resolves_downward_api_secrets_and_config_maps(kube: Kube, namespace: str) -> None:
    kube.core.create_namespaced_secret(
        namespace, {"metadata": {"name": "s"}, "stringData": {"token": "s3cret"}}
    )
    kube.core.create_namespaced_config_map(namespace, {"metadata": {"name": "c"}, "data": {"mode": "fast"}})
    script = """
        import json, os
        keys = ["POD", "NS", "ATTEMPT", "TIER", "SA", "TOKEN", "MODE", "GREETING"]
        with open(os.environ["TERMINATION_MESSAGE_PATH"], "w") as f:
            json.dump({k: os.environ.get(k) for k in keys}, f)
    """
    env = [
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {
            "name": "ATTEMPT",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['agentrun.dev/attempt']"}},
        },
        {"name": "TIER", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['tier']"}}},
        {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "token"}}},
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "mode"}}},
        {"name": "GREETING", "value": "hello $(POD)"},
    ]
    pod = python_pod(
        "env",
        script,
        container={"env": env},
        metadata={"annotations": {"agentrun.dev/attempt": "r-a1"}, "labels": {"tier": "gold"}},
    )
    kube.core.create_namespaced_pod(namespace, pod)
    done = kube.wait_pod_phase("env", namespace, ("Succeeded", "Failed"))
    assert done["status"]["phase"] == "Succeeded"
    seen = json.loads(done["status"]["containerStatuses"][0]["state"]["terminated"]["message"])
    assert seen == {
        "POD": "env",
        "NS": namespace,
        "ATTEMPT": "r-a1",
        "TIER": "gold",
        "SA": "default",
        "TOKEN": "s3cret",
        "MODE": "fast",
        "GREETING": "hello env",
    }


def test_deleting_a_running_pod_sends_sigterm_then_the_pod_disappears(
    kube: Kube, namespace: str, tmp_path: Path
) -> None:
    marker = tmp_path / "sigterm"
    ready = tmp_path / "ready"
    script = f"""
        import signal, sys, time
        def stop(*_):
            open({str(marker)!r}, "w").write("SIGTERM")
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        open({str(ready)!r}, "w").write("ready")
        while True:
            time.sleep(0.05)
    """
    kube.core.create_namespaced_pod(
        namespace, python_pod("graceful", script, terminationGracePeriodSeconds=3600)
    )
    pod = kube.wait_pod_phase("graceful", namespace, ("Running",))
    assert pod["status"]["containerStatuses"][0]["state"]["running"]
    # Running is reported once the process is started, not once its handler is in place.
    wait_for(ready.exists, timeout=120, what="the SIGTERM handler installed")
    kube.core.delete_namespaced_pod("graceful", namespace)
    # Gone long before its hour of grace: the agent saw the process stop on SIGTERM and did not wait.
    wait_for(lambda: kube.pod("graceful", namespace) is None, timeout=120, what="pod gone")
    assert marker.read_text() == "SIGTERM"


def test_process_ignoring_sigterm_is_killed_after_the_grace_period(
    kube: Kube, namespace: str, tmp_path: Path
) -> None:
    ready = tmp_path / "ready"
    script = f"""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open({str(ready)!r}, "w").write("ready")
        while True:
            time.sleep(0.05)
    """
    kube.core.create_namespaced_pod(
        namespace, python_pod("stubborn", script, terminationGracePeriodSeconds=2)
    )
    kube.wait_pod_phase("stubborn", namespace, ("Running",))
    # Running is reported once the process is started: a SIGTERM before SIG_IGN is in place kills it at once.
    wait_for(ready.exists, timeout=120, what="SIGTERM ignored")
    began = time.monotonic()
    kube.core.delete_namespaced_pod("stubborn", namespace)
    wait_for(lambda: kube.pod("stubborn", namespace) is None, timeout=120, what="pod gone")
    # Killed, and not before its grace: a lower bound, which a loaded machine cannot break.
    assert time.monotonic() - began >= 1.5


def test_deployment_pod_runs_and_is_restarted_when_its_process_exits(kube: Kube, namespace: str) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "worker"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "worker"}},
            "template": {
                "metadata": {"labels": {"app": "worker"}},
                "spec": python_pod("x", "import time; time.sleep(1)", restart="Always")["spec"],
            },
        },
    }
    kube.apps.create_namespaced_deployment(namespace, deployment)

    def restarted() -> V1Pod | None:
        pods = kube.core.list_namespaced_pod(namespace, label_selector="app=worker").items
        statuses = [s for p in pods for s in (p.status.container_statuses or [])]
        return next((p for p in pods for s in statuses if s.restart_count >= 1), None)

    pod = wait_for(restarted, timeout=120, what="deployment pod restarted")
    assert pod.status.phase == "Running"
    wait_for(
        lambda: (
            (kube.apps.read_namespaced_deployment("worker", namespace).status.available_replicas or 0) >= 1
        ),
        timeout=120,
        what="deployment available",
    )


def test_pod_service_account_is_subject_to_rbac(kube: Kube, namespace: str) -> None:
    kube.core.create_namespaced_service_account(namespace, {"metadata": {"name": "reader"}})
    kube.rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "read-config"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}],
        },
    )
    kube.rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "reader-reads-config"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-config"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
    )
    script = f"""
        import json, os
        from kubernetes import client, config
        from kubernetes.client.rest import ApiException
        config.load_kube_config()
        core = client.CoreV1Api()
        outcome = {{}}
        calls = [("configmaps", core.list_namespaced_config_map), ("secrets", core.list_namespaced_secret)]
        for kind, call in calls:
            try:
                call({namespace!r})
                outcome[kind] = 200
            except ApiException as e:
                outcome[kind] = e.status
        with open(os.environ["TERMINATION_MESSAGE_PATH"], "w") as f:
            json.dump(outcome, f)
    """
    kube.core.create_namespaced_pod(namespace, python_pod("rbac", script, serviceAccountName="reader"))
    pod = kube.wait_pod_phase("rbac", namespace, ("Succeeded", "Failed"))
    outcome = json.loads(pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"])
    assert outcome == {"configmaps": 200, "secrets": 403}


def test_a_burst_of_short_pods_all_report_their_final_phase(kube: Kube, namespace: str) -> None:
    # Regression: a status update still in flight could land after the final one and leave a finished
    # Pod Running forever.
    names = [f"burst-{i}" for i in range(20)]
    for name in names:
        kube.core.create_namespaced_pod(namespace, python_pod(name, "pass"))

    def all_succeeded() -> bool:
        pods = kube.core.list_namespaced_pod(namespace).items
        return len(pods) == len(names) and all(p.status.phase == "Succeeded" for p in pods)

    wait_for(all_succeeded, timeout=120, what="every burst pod Succeeded")
    time.sleep(1.0)  # and they stay that way: no late update regresses them
    assert {p.status.phase for p in kube.core.list_namespaced_pod(namespace).items} == {"Succeeded"}
