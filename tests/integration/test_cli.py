"""`kubectl agentrun` against the real control plane and operator, run as the user runs it: a process."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from agentrun.api.causes import RefusalCause
from agentrun.cli.cluster import Cluster
from agentrun.cli.commands.cancel import Swap, compare_and_swap
from agentrun.cli.errors import ADVICE
from agentrun.kubeapi import KubeApi, load_configuration
from devcluster.cluster import LocalCluster
from devcluster.operator import OperatorProcess
from devcluster.pki import ADMIN as ADMIN_IDENTITY
from support.kube import Kube, wait_for
from support.runs import GROUP, PRIORITY, VERSION, create_run, get_run, scenario_run, wait_phase

pytestmark = pytest.mark.cluster

ADMIN = ADMIN_IDENTITY.common_name  # who the CLI says answered: the user the API server knows


def env_for(kubeconfig: Path) -> dict[str, str]:
    return {**os.environ, "KUBECONFIG": str(kubeconfig)}


def argv(namespace: str | None, *args: str) -> list[str]:
    return [sys.executable, "-m", "agentrun.cli", *(["-n", namespace] if namespace else []), *args]


# How long a command that waits for the operator's verdict (resume, retry, compensate) may wait, in the
# tests: the CLI's default (30 s) is a person's patience on a quiet cluster, not a loaded test machine's.
VERDICT = "120"


def cli(
    kube: Kube, namespace: str | None, *args: str, kubeconfig: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Runs `kubectl agentrun ARGS` with the test cluster's kubeconfig (or the given one)."""
    return subprocess.run(
        argv(namespace, *args),
        env=env_for(kubeconfig or kube.kubeconfig),
        capture_output=True,
        text=True,
        timeout=300,  # an upper bound: a command that follows a Run (--wait) waits for a whole Attempt
        check=False,
    )


def cli_many(kube: Kube, namespace: str, *commands: list[str]) -> list[subprocess.CompletedProcess[str]]:
    """Several commands at the same time (as two people, or a double click, would run them)."""
    processes = [
        subprocess.Popen(
            argv(namespace, *args),
            env=env_for(kube.kubeconfig),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in commands
    ]
    results = []
    for args, process in zip(commands, processes, strict=True):
        out, err = process.communicate(timeout=120)
        results.append(subprocess.CompletedProcess(args, process.returncode, out, err))
    return results


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (
        f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    )
    return result.stdout


def status_of(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    status: dict[str, Any] = get_run(kube, namespace, name).get("status", {})
    return status


def test_get_describe_effects_report_and_watch_of_a_finished_run(
    kube: Kube, local_cluster: LocalCluster, run_namespace: str, operator: OperatorProcess
) -> None:
    ns = run_namespace
    create_run(kube, ns, scenario_run("done", {"steps": 2}))
    assert wait_phase(kube, ns, "done", {"Succeeded", "Failed"})["status"]["phase"] == "Succeeded", (
        operator.log_tail()
    )

    header, row = ok(cli(kube, ns, "get")).splitlines()
    headers = ["NAME", "PHASE", "ATTEMPT", "LEASE-EPOCH", "CANCEL-EPOCH", "WAITING-FOR", "HELD-BY", "AGE"]
    assert header.split() == headers
    assert row.split()[:6] == ["done", "Succeeded", "1", "1", "0", "-"]
    assert ok(cli(kube, ns, "get", "done")).splitlines()[1].split()[:2] == ["done", "Succeeded"]
    listed = json.loads(ok(cli(kube, ns, "get", "-o", "json")))
    assert [item["metadata"]["name"] for item in listed["items"]] == ["done"]
    one = yaml.safe_load(ok(cli(kube, ns, "get", "done", "-o", "yaml")))
    assert (one["kind"], one["status"]["phase"]) == ("Run", "Succeeded")

    # A finished Run is compacted: its superseded Checkpoints are read from its index in the state store.
    reader = {**env_for(kube.kubeconfig), "AGENTRUN_STATE_STORE_URL": local_cluster.state_store_url}
    reader |= local_cluster.state_store_env()
    described = subprocess.run(
        argv(ns, "describe", "done"), env=reader, capture_output=True, text=True, timeout=120, check=False
    )
    text = ok(described)
    assert "Phase:         Succeeded: done-a1 committed the result" in text
    # the session's operator is given the cluster's store by URL (its namespaces' Secrets made by the tests)
    assert "State store:   External (the object store the operator is configured with)" in text
    assert '"steps": 2' in text.split("Result:")[1].splitlines()[0]
    story = text.split("Timeline (UTC):\n")[1].split("\n\n")[0]
    # each line: the time (with the date when the timeline spans midnight), two spaces, the event
    events = [
        re.sub(r"^(\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}:\d{2}  ", "", line.strip()) for line in story.splitlines()
    ]
    events = [event.split("  ")[0] for event in events]
    assert events[0] == "run created" and events[-2:] == ["attempt 1 Succeeded", "run Succeeded"]
    assert {"attempt 1 started", "checkpoint 1", "checkpoint 2"} <= set(events)
    assert "initial, lease epoch 1" in story and "done-a1-s2 at step-2 by done-a1" in story
    conditions = [line.split() for line in text.split("Conditions:\n")[1].split("\n\n")[0].splitlines()]
    assert conditions[1][:3] == ["Succeeded", "True", "Succeeded"], conditions
    everything = json.loads(ok(cli(kube, ns, "describe", "done", "-o", "json")))
    assert sorted({item["kind"] for item in everything["items"]}) == ["Attempt", "Checkpoint", "Run"]

    effects = cli(kube, ns, "effects", "done")
    assert (effects.returncode, effects.stdout) == (0, "")
    assert "No side effects recorded for run done" in effects.stderr
    report = ok(cli(kube, ns, "report", "done"))
    assert report.splitlines()[0] == "Run done: Succeeded: done-a1 committed the result"
    assert "No external side effects: nothing to compensate, nothing that cannot be undone." in report

    watched = ok(cli(kube, ns, "watch", "done"))
    assert "Succeeded" in watched.splitlines()[0] and "kubectl agentrun report done" in watched

    # an ended Run cannot be cancelled: the API server says so, and the plugin shows its words
    refused = cli(kube, ns, "cancel", "done")
    assert refused.returncode == 1, refused.stdout
    assert "cannot cancel run done: invalid:" in refused.stderr
    assert "cannot change once the Run is Succeeded or Cancelled" in refused.stderr
    assert get_run(kube, ns, "done")["spec"]["cancelEpoch"] == 0


def test_watch_until_it_waits_then_resume_checked_locally_and_idempotent(
    kube: Kube, run_namespace: str, operator: OperatorProcess
) -> None:
    ns = run_namespace
    scenario = {"steps": 2, "ask": {"atStep": 2, "prompt": "Which priority?", "schema": PRIORITY}}
    create_run(kube, ns, scenario_run("ask", scenario))

    watched = cli(kube, ns, "watch", "ask", "--timeout", "180")
    assert watched.returncode == 0, watched.stderr + operator.log_tail()
    assert "InputRequired" in watched.stdout.splitlines()[-3]
    assert "waiting for request ask-r1: Which priority?" in watched.stdout
    assert "kubectl agentrun resume ask --value JSON" in watched.stdout
    waiting = ok(cli(kube, ns, "describe", "ask")).split("Waiting for:\n")[1]
    assert "Prompt:  Which priority?" in waiting and '"enum": ["low", "high"]' in waiting

    # a value the schema refuses never leaves the machine
    before = get_run(kube, ns, "ask")
    refused = cli(kube, ns, "resume", "ask", "--value", '{"priority": "urgent"}')
    assert refused.returncode == 1
    assert "does not match the schema of request ask-r1" in refused.stderr
    assert "'urgent' is not one of ['low', 'high']" in refused.stderr and "nothing sent" in refused.stderr
    after = get_run(kube, ns, "ask")
    assert "resume" not in after["spec"] and "controls" not in after["status"]
    assert after["metadata"]["generation"] == before["metadata"]["generation"]

    # an answer to another request goes to the operator, which refuses it and records why
    other = ["--request-id", "other", "--checkpoint", "ask-a1-s1", "--key", "k-other"]
    wrong = cli(kube, ns, "resume", "ask", "--value", '{"priority": "low", "note": "x"}', *other)
    assert wrong.returncode == 1
    assert (
        f"run ask: Resume k-other by {ADMIN}: Rejected, UnknownRequest: request other is not the pending one"
        in wrong.stdout
    )

    # the next answer replaces that one whole (merged, its value would carry "note" and miss the schema)
    accepted = ok(cli(kube, ns, "resume", "ask", "--value", '{"priority": "high"}', "--timeout", VERDICT))
    assert (
        accepted.startswith("run ask: Resume cli-resume-")
        and f" by {ADMIN}: Accepted (answer to ask-r1 accepted)" in accepted
    )
    sent = get_run(kube, ns, "ask")
    key = sent["spec"]["resume"]["idempotencyKey"]

    again = ok(cli(kube, ns, "resume", "ask", "--value", '{"priority": "high"}'))
    assert f"already recorded: Resume {key} by {ADMIN}: Accepted" in again
    done = wait_phase(kube, ns, "ask", {"Succeeded", "Failed"})
    assert done["status"]["phase"] == "Succeeded", operator.log_tail()
    assert done["status"]["result"]["answer"] == {"priority": "high"}
    assert done["metadata"]["generation"] == sent["metadata"]["generation"], "the repeat wrote nothing"
    assert [c["idempotencyKey"] for c in done["status"]["controls"]] == ["k-other", key]
    assert [i["idempotencyKey"] for i in done["status"]["inputs"]] == [key]

    story = ok(cli(kube, ns, "describe", "ask")).split("Timeline (UTC):\n")[1]
    assert (
        "resume Accepted" in story
        and f"input recorded         request ask-r1 at ask-a1-s1, key {key}" in story
    )


def test_cancel_is_a_compare_and_swap_so_a_double_click_cancels_once(
    kube: Kube, run_namespace: str, operator: OperatorProcess
) -> None:
    ns = run_namespace
    create_run(kube, ns, scenario_run("stop", {"steps": 1, "fail": {"how": "hang"}}))
    wait_for(lambda: (kube.pod("stop-a1", ns) or {}).get("status", {}).get("phase") == "Running", timeout=120)

    first, second = cli_many(kube, ns, ["cancel", "stop"], ["cancel", "stop"])
    outputs = sorted([ok(first), ok(second)])
    assert len([o for o in outputs if "cancel requested (cancel epoch 0 -> 1)" in o]) == 1, outputs
    assert len([o for o in outputs if "already cancelled" in o]) == 1, outputs
    assert get_run(kube, ns, "stop")["spec"]["cancelEpoch"] == 1

    # a third, waiting: nothing more is sent, and it returns once the Run is Cancelled
    waited = ok(cli(kube, ns, "cancel", "stop", "--wait", "--timeout", "60"))
    assert "already cancelled" in waited and "run stop: Cancelled: cancelled (cancel epoch 1)" in waited
    assert get_run(kube, ns, "stop")["spec"]["cancelEpoch"] == 1

    # a writer that read epoch 0 before all this loses the swap and is told who won
    async def stale_swap() -> Swap:
        api = KubeApi(load_configuration(str(kube.kubeconfig)))
        try:
            return await compare_and_swap(Cluster(api, ns), "stop", 0, None)
        finally:
            api.close()

    assert asyncio.run(stale_swap()) == Swap(ours=False, epoch=1)
    assert get_run(kube, ns, "stop")["spec"]["cancelEpoch"] == 1


def test_pause_then_resume_and_a_manual_retry(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    ns, gate = run_namespace, tmp_path / "gate"
    # The agent waits before its second step until the gate opens: the pause is sure to find it Running.
    create_run(kube, ns, scenario_run("nap", {"steps": 3, "gate": {"file": str(gate), "atStep": 2}}))
    wait_phase(kube, ns, "nap", {"Running"})
    paused = ok(cli(kube, ns, "pause", "nap", "--reason", "lunch", "--timeout", "5"))
    assert ": Accepted" in paused or "the agent pauses at its next step boundary" in paused
    gate.touch()
    status = wait_phase(kube, ns, "nap", {"Paused", "Succeeded", "Failed"})["status"]
    assert status["phase"] == "Paused", operator.log_tail()
    again = ok(cli(kube, ns, "pause", "nap", "--reason", "lunch"))
    assert f"already paused (request {status['pendingRequest']['requestId']})" in again
    assert "Accepted" in ok(cli(kube, ns, "resume", "nap", "--timeout", VERDICT))
    assert wait_phase(kube, ns, "nap", {"Succeeded", "Failed"})["status"]["phase"] == "Succeeded"

    create_run(kube, ns, scenario_run("redo", {"steps": 1, "fail": {"attempts": [1], "how": "permanent"}}))
    assert wait_phase(kube, ns, "redo", {"Failed", "Succeeded"})["status"]["phase"] == "Failed"
    retry = ["retry", "redo", "--reason", "fixed the input", "--wait", "--timeout", VERDICT]
    retried = ok(cli(kube, ns, *retry))
    assert ": Accepted (manual retry from" in retried and "Succeeded" in retried.splitlines()[-2]
    assert "already recorded: Retry cli-retry-" in ok(
        cli(kube, ns, "retry", "redo", "--reason", "fixed the input")
    )
    refused = cli(kube, ns, "retry", "redo")
    assert (
        refused.returncode == 1 and "only Failed or NeedsReconciliation Runs can be retried" in refused.stderr
    )
    assert len(status_of(kube, ns, "redo")["controls"]) == 1


def test_effects_report_and_resolving_an_unknown_effect(
    kube: Kube, run_namespace: str, operator: OperatorProcess
) -> None:
    ns = run_namespace
    create_run(kube, ns, scenario_run("ledger", {"steps": 1, "fail": {"how": "hang"}}))
    effect = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SideEffect",
        "metadata": {"name": "sfx-ticket", "labels": {"agentrun.dev/run": "ledger"}},
        "spec": {
            "runName": "ledger",
            "tool": "create_ticket",
            "idempotencyKey": "ticket-1",
            "target": "project-a",
        },
    }
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, ns, "sideeffects", effect)
    for state in ("Pending", "Unknown"):
        kube.custom.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            ns,
            "sideeffects",
            "sfx-ticket",
            {"status": {"state": state, "attempt": "ledger-a1"}},
        )

    rows = [line.split() for line in ok(cli(kube, ns, "effects", "ledger")).splitlines()]
    assert rows == [
        ["NAME", "TOOL", "STATE", "REFERENCE", "REVERSIBLE", "ATTEMPT", "SENDS"],
        ["sfx-ticket", "create_ticket", "Unknown", "-", "no", "ledger-a1", "0/3"],
    ]
    report = ok(cli(kube, ns, "report", "ledger"))
    assert (
        "Unknown: nobody knows whether it happened (1):" in report and "create_ticket on project-a" in report
    )
    assert "kubectl agentrun resolve-effect sfx-ticket" in report

    resolved = ok(
        cli(
            kube,
            ns,
            "resolve-effect",
            "sfx-ticket",
            "--confirmed",
            "--reference",
            "T-9",
            "--result",
            '{"id": "T-9"}',
        )
    )
    assert "side effect sfx-ticket: Unknown -> Confirmed (T-9), resolved by" in resolved
    status = kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, "sideeffects", "sfx-ticket")[
        "status"
    ]
    assert (status["state"], status["externalReference"], status["result"]) == (
        "Confirmed",
        "T-9",
        {"id": "T-9"},
    )
    assert status["resolvedBy"] and status["resolvedBy"] != "kubectl-agentrun", (
        "the API server told us who we are"
    )
    again = cli(kube, ns, "resolve-effect", "sfx-ticket", "--failed")
    assert again.returncode == 1 and "sfx-ticket is Confirmed: only an Unknown (or Pending)" in again.stderr
    assert "What cannot be undone (1):" in ok(cli(kube, ns, "report", "ledger"))
    ok(cli(kube, ns, "cancel", "ledger"))


def test_clear_errors_for_what_is_missing_or_forbidden(
    kube: Kube, namespace: str, agentrun_crds: None, tmp_path: Path
) -> None:
    ns = namespace
    commands = [
        ["get", "nope"],
        ["describe", "nope"],
        ["cancel", "nope"],
        ["resume", "nope", "--value", "1"],
        ["retry", "nope"],
        ["pause", "nope"],
        ["effects", "nope"],
        ["report", "nope"],
        ["watch", "nope"],
    ]
    archived = (
        f"; a Run that finished and was archived is read with `kubectl agentrun describe --archived nope "
        f"-n {ns}` (its namespace's archives: `kubectl agentrun history -n {ns}`)"
    )
    for args, result in zip(commands, cli_many(kube, ns, *commands), strict=True):
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        # describe points to the archive, where a Run past its time to live went
        hint = archived if args[0] == "describe" else ""
        assert result.stderr == f'error: run "nope" not found in namespace "{ns}"{hint}\n', (
            args,
            result.stderr,
        )
        assert result.stdout == ""
    missing = cli(kube, ns, "resolve-effect", "nope", "--failed")
    assert (missing.returncode, missing.stderr) == (
        1,
        f'error: side effect "nope" not found in namespace "{ns}"\n',
    )
    bad = cli(kube, ns, "resume", "nope", "--value", "{nope")
    assert bad.returncode == 2 and "--value is not valid JSON" in bad.stderr
    assert cli(kube, ns, "frobnicate").returncode == 2

    # found by kubectl as a plugin: any executable named kubectl-agentrun on the PATH
    shim = tmp_path / "kubectl-agentrun"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m agentrun.cli "$@"\n')
    shim.chmod(0o755)
    env = {**env_for(kube.kubeconfig), "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    plugin = subprocess.run(
        [str(kube.kubectl_path), "agentrun", "get", "nope", "-n", ns],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert (plugin.returncode, plugin.stderr) == (1, f'error: run "nope" not found in namespace "{ns}"\n')

    # someone without rights: a service account token, its namespace taken from the kubeconfig context
    kube.core.create_namespaced_service_account(ns, {"metadata": {"name": "nobody"}})
    path = kube.account_kubeconfig(ns, "nobody")
    try:
        forbidden = cli(kube, None, "get", kubeconfig=path)
        # a watch refused is an answer too: said at once, not tried again until its timeout
        watch_forbidden = cli(kube, None, "watch", "nope", "--timeout", "3600", kubeconfig=path)
    finally:
        path.unlink()
    for refused in (forbidden, watch_forbidden):
        assert refused.returncode == 1
        assert refused.stderr.startswith("error: forbidden: ")
        assert f'User "system:serviceaccount:{ns}:nobody" cannot list resource "runs"' in refused.stderr
        assert f'in the namespace "{ns}"' in refused.stderr


def two_contexts(kube: Kube, namespace: str, path: Path) -> Path:
    """The test cluster's kubeconfig with a second context, "team", whose namespace is `namespace`; the
    current context stays the first one (namespace default)."""
    config = yaml.safe_load(kube.kubeconfig.read_text())
    first = config["contexts"][0]
    config["contexts"].append({"name": "team", "context": {**first["context"], "namespace": namespace}})
    path.write_text(yaml.safe_dump(config))
    return path


def test_hints_act_where_the_command_acted_and_keys_are_checked_before_sending(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    ns = run_namespace
    scenario = {"steps": 1, "ask": {"atStep": 1, "prompt": "Which priority?", "schema": PRIORITY}}
    create_run(kube, ns, scenario_run("hinted", scenario))
    config = two_contexts(kube, ns, tmp_path / "two-contexts.kubeconfig")

    watched = cli(kube, None, "--context", "team", "watch", "hinted", "--timeout", "90", kubeconfig=config)
    assert watched.returncode == 0, watched.stderr + operator.log_tail()
    hint = f"kubectl agentrun resume hinted --value JSON -n {ns} --context team"
    assert hint in watched.stdout, watched.stdout
    described = ok(cli(kube, ns, "describe", "hinted"))
    assert f"Answer:  kubectl agentrun resume hinted --value JSON -n {ns}" in described
    assert "--context" not in described, "the current context is not named"

    # a key the API server would refuse is refused here, before anything is sent
    before = get_run(kube, ns, "hinted")
    bad = cli(kube, ns, "resume", "hinted", "--value", '{"priority": "high"}', "--key", "not a key")
    assert bad.returncode == 2 and "'not a key' is not a valid idempotency key" in bad.stderr
    assert get_run(kube, ns, "hinted")["metadata"]["generation"] == before["metadata"]["generation"]

    # -o yaml hides managedFields as kubectl does, unless asked
    shown = yaml.safe_load(ok(cli(kube, ns, "get", "hinted", "-o", "yaml")))
    assert "managedFields" not in shown["metadata"] and shown["metadata"]["name"] == "hinted"
    kept = json.loads(ok(cli(kube, ns, "get", "hinted", "-o", "json", "--show-managed-fields")))
    assert kept["metadata"]["managedFields"]

    # the hint, pasted with the answer filled in, answers this Run (in its namespace, through the context)
    words = hint.split()[2:]
    words[words.index("JSON")] = '{"priority": "high"}'
    answered = subprocess.run(
        [sys.executable, "-m", "agentrun.cli", *words],
        env=env_for(config),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert answered.returncode == 0 and ": Accepted (answer to" in answered.stdout, answered.stderr
    assert wait_phase(kube, ns, "hinted", {"Succeeded", "Failed"})["status"]["phase"] == "Succeeded"


def test_a_failed_side_effect_can_be_resolved_absent_and_the_run_retried(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    """The dead end of a failed call (e.g. a wrong target, classed deterministic): the report offers a way
    out, and each command it prints is accepted."""
    ns, gate = run_namespace, tmp_path / "gate"
    failing = {
        "steps": 1,
        "gate": {"file": str(gate), "atStep": 1},
        "fail": {"attempts": [1], "how": "permanent"},
    }
    create_run(kube, ns, scenario_run("dns", failing))
    running = wait_phase(kube, ns, "dns", {"Running"})
    owner = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Run",
        "name": "dns",
        "uid": running["metadata"]["uid"],
    }
    effect = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SideEffect",
        "metadata": {"name": "sfx-dns", "labels": {"agentrun.dev/run": "dns"}, "ownerReferences": [owner]},
        "spec": {"runName": "dns", "tool": "create_ticket", "idempotencyKey": "ticket-1", "target": "t.bad"},
    }
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, ns, "sideeffects", effect)
    send = {"sendId": "op-1-s1", "attempt": "dns-a1", "time": "2026-01-01T00:00:00Z", "outcome": "Failed"}
    for state in ("Pending", "Failed"):
        kube.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, ns, "sideeffects", "sfx-dns", {"status": {"state": state, "sends": [send]}}
        )
    gate.touch()  # the Attempt fails now, with the failed call in its ledger
    assert wait_phase(kube, ns, "dns", {"Failed", "Succeeded"})["status"]["phase"] == "Failed"

    report = ok(cli(kube, ns, "report", "dns"))
    resolve = f"kubectl agentrun resolve-effect sfx-dns --absent -n {ns}"
    retry_hint = f"kubectl agentrun retry dns --reason TEXT -n {ns}"
    assert resolve in report and retry_hint in report and "new key version" in report, report

    refused = cli(kube, ns, "resolve-effect", "sfx-dns", "--confirmed", "--reference", "T-1")
    assert refused.returncode == 1 and "sfx-dns is Failed: only --absent applies" in refused.stderr
    resolved = cli(kube, None, *resolve.split()[2:], "--reason", "the DNS name was wrong")
    assert resolved.returncode == 0, resolved.stderr
    assert "side effect sfx-dns: Failed -> Failed (Absent: it did not happen" in resolved.stdout
    assert f"run dns is Failed; retry it: kubectl agentrun retry dns -n {ns}" in resolved.stderr
    status = kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, "sideeffects", "sfx-dns")["status"]
    assert (status["state"], status["resolution"], status["resolvedSends"]) == ("Failed", "Absent", 1)
    assert status["history"][-1]["message"].endswith("(kubectl agentrun): the DNS name was wrong")
    again = ok(cli(kube, ns, "resolve-effect", "sfx-dns", "--absent"))
    assert "already resolved Absent, nothing sent since; nothing written" in again

    retry_words = retry_hint.split()[2:]
    retry_words[retry_words.index("TEXT")] = "fixed the DNS name"
    retried = ok(cli(kube, None, *retry_words, "--timeout", VERDICT))
    assert ": Accepted (manual retry from" in retried
    assert wait_phase(kube, ns, "dns", {"Succeeded"}, timeout=120)["status"]["phase"] == "Succeeded"


def test_the_plugin_names_the_user_the_api_server_knows(
    kube: Kube, run_namespace: str, operator: OperatorProcess
) -> None:
    ns = run_namespace
    kube.core.create_namespaced_service_account(ns, {"metadata": {"name": "carol"}})
    rules = [
        {"apiGroups": [GROUP], "resources": ["runs"], "verbs": ["get", "list", "watch", "patch"]},
        {
            "apiGroups": [GROUP],
            "resources": ["attempts", "checkpoints", "sideeffects"],
            "verbs": ["get", "list"],
        },
    ]
    kube.rbac.create_namespaced_role(ns, {"metadata": {"name": "answerer"}, "rules": rules})
    kube.rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": "answerer"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "answerer"},
            "subjects": [{"kind": "ServiceAccount", "name": "carol", "namespace": ns}],
        },
    )
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
    carol = kube.with_token(
        kube.core.create_namespaced_service_account_token("carol", ns, request).status.token
    )
    user = f"system:serviceaccount:{ns}:carol"
    scenario = {"steps": 2, "ask": {"atStep": 1, "prompt": "Which priority?", "schema": PRIORITY}}
    create_run(kube, ns, scenario_run("named", scenario))
    wait_phase(kube, ns, "named", {"InputRequired"})

    def readable() -> bool:
        try:
            return bool(get_run(carol, ns, "named"))
        except ApiException as error:  # 403 until the API server's RBAC sees the new binding
            if error.status != 403:
                raise
            return False

    wait_for(readable, what="carol's role seen by the API server")

    answered = ok(
        cli(
            kube,
            ns,
            "resume",
            "named",
            "--value",
            '{"priority": "low"}',
            "--timeout",
            VERDICT,
            kubeconfig=carol.kubeconfig,
        )
    )
    assert f"by {user}: Accepted" in answered
    done = wait_phase(kube, ns, "named", {"Succeeded", "Failed"})
    assert done["status"]["phase"] == "Succeeded", operator.log_tail()
    [recorded] = done["status"]["inputs"]
    assert recorded["answeredBy"] == done["spec"]["resume"]["answeredBy"] == user
    assert f"answered by {user}" in ok(cli(kube, ns, "describe", "named"))


def test_a_refusal_whose_cause_a_person_meets_says_what_to_do(
    kube: Kube, namespace: str, agentrun_crds: None, operator_kubeconfig: Path
) -> None:
    """A ServiceAccount resolving a side effect through the plugin: the API server takes its write for an
    agent's (NotPodBound: its token is bound to no Pod); the plugin prints the server's words, then what
    to do (agentrun.cli.errors.ADVICE)."""
    ns = namespace
    effect = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SideEffect",
        "metadata": {"name": "sfx-bot", "labels": {"agentrun.dev/run": "gone"}},
        "spec": {"runName": "gone", "tool": "create_ticket", "idempotencyKey": "ticket-1", "target": "t"},
    }
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, ns, "sideeffects", effect)
    for state in ("Pending", "Unknown"):
        kube.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, ns, "sideeffects", "sfx-bot", {"status": {"state": state}}
        )
    kube.core.create_namespaced_service_account(ns, {"metadata": {"name": "bot"}})
    rules = [
        {"apiGroups": [GROUP], "resources": ["sideeffects"], "verbs": ["get"]},
        {"apiGroups": [GROUP], "resources": ["sideeffects/status"], "verbs": ["patch"]},
    ]
    kube.rbac.create_namespaced_role(ns, {"metadata": {"name": "resolver"}, "rules": rules})
    kube.rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": "resolver"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "resolver"},
            "subjects": [{"kind": "ServiceAccount", "name": "bot", "namespace": ns}],
        },
    )
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
    bot = kube.with_token(kube.core.create_namespaced_service_account_token("bot", ns, request).status.token)

    def refused_by_the_policy() -> (
        subprocess.CompletedProcess[str] | None
    ):  # RBAC's 403 until it sees the Role
        result = cli(kube, ns, "resolve-effect", "sfx-bot", "--absent", kubeconfig=bot.kubeconfig)
        return result if "NotPodBound:" in result.stderr else None

    refused = wait_for(refused_by_the_policy, what="the bot's resolution refused by the policy")
    said, todo = refused.stderr.rstrip("\n").split("\n")
    assert refused.returncode == 1
    assert said.startswith("error: cannot resolve side effect sfx-bot: forbidden: ") and (
        f"system:serviceaccount:{ns}:bot presented a token that is not bound to a Pod" in said
    )
    assert todo == f"what to do: {ADVICE[RefusalCause.NOT_POD_BOUND]}"
    status = kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, "sideeffects", "sfx-bot")["status"]
    assert status["state"] == "Unknown" and "resolvedBy" not in status
