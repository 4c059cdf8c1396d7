"""Decisions people make in the console, in a real browser against the real control plane, operator and
ticket service: an irreversible action approved runs once and names its approver wherever the approval
shows; a denied one never runs; an unknown outcome is settled Failed or Absent by a named person.
(Questions, readers, two people at once and Confirmed are in test_console.py.)"""

from __future__ import annotations

import statistics
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from agentrun.core.ledger import request_digest
from agentrun.examples.manifests import agent_run
from devcluster.operator import OperatorProcess
from devcluster.tickets import TicketServiceProcess
from support.console import AGENT_MS, ANSWER, console, person, screenshot, signed_in
from support.kube import Kube, wait_for
from support.runs import FAST_RETRY, GROUP, PRIORITY, VERSION, create_run, get_run, scenario_run, wait_phase

pytestmark = pytest.mark.cluster


def gated_ticket_run(name: str, service: TicketServiceProcess) -> dict[str, Any]:
    """The ticket agent opening one irreversible ticket, once a person approves it."""
    scenario = {"title": f"ticket of {name}", "body": "details", "askPriority": False}
    scenario |= {"requireApproval": True, "reversible": False}
    return agent_run(name, "ticket_agent", scenario, env=service.env(), retry=FAST_RETRY)


def approval_card(page: Page, ns: str, run: str) -> Locator:
    card = page.locator(f'article.card[data-kind="approval"][data-id^="{ns}/{run}/"]')
    expect(card).to_be_visible(timeout=AGENT_MS)
    return card


def effects_of(kube: Kube, ns: str, run: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, ns, "sideeffects", label_selector=f"agentrun.dev/run={run}"
    )["items"]
    return found


def test_an_irreversible_action_approved_in_the_console_runs_once_and_names_its_approver(
    kube: Kube,
    *,
    run_namespace: str,
    operator: OperatorProcess,
    tickets: TicketServiceProcess,
    browser: Browser,
    tmp_path: Path,
) -> None:
    ns = run_namespace
    carol = person(kube, ns, "carol", ANSWER)
    approver = f"system:serviceaccount:{ns}:carol"
    create_run(kube, ns, gated_ticket_run("gated", tickets))
    with console(carol.kubeconfig, [ns], tmp_path / "console.log") as started:
        context, page = signed_in(browser, started, viewport={"width": 1100, "height": 900})
        card = approval_card(page, ns, "gated")
        pending = get_run(kube, ns, "gated")["status"]["pendingRequest"]
        action = pending["action"]
        # What is approved is on the card: the tool, that it cannot be undone, and the digest the
        # console recomputed from the request shown (the one the worker wrote).
        expect(card).to_contain_text("create_ticket")
        expect(card).to_contain_text("no: irreversible")
        digest = request_digest(action["tool"], action.get("target"), action["request"])
        assert digest == action["requestDigest"]
        expect(card).to_contain_text(digest)
        expect(card.locator(".verified")).to_contain_text("The digest matches")
        assert tickets.creations() == [], "nothing runs before the approval"
        screenshot(page, "approval", f'article[data-id^="{ns}/gated/"]')

        card.get_by_role("button", name="Approve").click()
        expect(card.locator(".outcome.ok")).to_contain_text("Accepted", timeout=60_000)
        done = wait_phase(kube, ns, "gated", {"Succeeded", "Failed"}, timeout=120)
        assert done["status"]["phase"] == "Succeeded", operator.log_tail() + started.log_tail()
        assert len(tickets.creations()) == 1, tickets.audit()

        # The approver, as the API server knows them, wherever the approval shows.
        [effect] = effects_of(kube, ns, "gated")
        assert effect["status"]["state"] == "Confirmed"
        approval = effect["status"]["approval"]
        assert (approval["requestId"], approval["approvedBy"]) == (pending["requestId"], approver)
        assert approval["requestDigest"] == digest
        assert [(i["requestId"], i["answeredBy"]) for i in done["status"]["inputs"]] == [
            (pending["requestId"], approver)
        ]
        reported = wait_for(
            lambda: get_run(kube, ns, "gated")["status"].get("report", {}).get("effects"),
            what="the report listing the effect",
        )
        assert [(e["tool"], e["approvedBy"], e["reversible"]) for e in reported] == [
            ("create_ticket", approver, False)
        ]

        page.goto(f"{started.base}/runs/{ns}/gated")
        expect(page.locator("table.timeline")).to_contain_text(f"answered by {approver}")
        row = page.locator("#run table.effects tbody tr", has_text="create_ticket")
        expect(row).to_contain_text(approver)
        expect(row).to_contain_text("Confirmed")
        context.close()


def test_an_action_denied_in_the_console_never_runs(
    kube: Kube,
    *,
    run_namespace: str,
    operator: OperatorProcess,
    tickets: TicketServiceProcess,
    browser: Browser,
    tmp_path: Path,
) -> None:
    ns = run_namespace
    dave = person(kube, ns, "dave", ANSWER)
    create_run(kube, ns, gated_ticket_run("denied", tickets))
    with console(dave.kubeconfig, [ns], tmp_path / "console.log") as started:
        context, page = signed_in(browser, started)
        card = approval_card(page, ns, "denied")
        pending = get_run(kube, ns, "denied")["status"]["pendingRequest"]
        card.get_by_role("button", name="Deny").click()
        expect(card.locator(".outcome.ok")).to_contain_text("Accepted", timeout=60_000)
        done = wait_phase(kube, ns, "denied", {"Succeeded", "Failed"}, timeout=120)
        assert done["status"]["phase"] == "Failed", operator.log_tail()
        assert "not approved" in done["status"]["failure"]["message"]
        assert tickets.creations() == [], "a denied action is never sent"
        [answer] = done["status"]["inputs"]
        assert (answer["requestId"], answer["answeredBy"]) == (
            pending["requestId"],
            f"system:serviceaccount:{ns}:dave",
        )
        context.close()


def unknown_effect(kube: Kube, ns: str, run: str, name: str) -> None:
    """An outcome nobody knows, as a worker that crashed mid-call leaves it (written by the admin)."""
    effect = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SideEffect",
        "metadata": {"name": name, "labels": {"agentrun.dev/run": run}},
        "spec": {"runName": run, "tool": "send_invoice", "idempotencyKey": f"{name}-1", "target": "acme"},
    }
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, ns, "sideeffects", effect)
    for state in ("Pending", "Unknown"):
        status = {"status": {"state": state, "attempt": f"{run}-a1"}}
        kube.custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, "sideeffects", name, status)


@pytest.mark.parametrize(
    ("verdict", "label"),
    [
        ("Failed", "Failed: it did not happen, never send it again"),
        ("Absent", "Absent: it did not happen, a later Attempt may send it again"),
    ],
)
def test_an_unknown_outcome_settled_failed_or_absent_by_a_named_person(
    kube: Kube,
    *,
    run_namespace: str,
    operator: OperatorProcess,
    browser: Browser,
    tmp_path: Path,
    verdict: str,
    label: str,
) -> None:
    # The person is the cluster's admin user here: the API server lets a ServiceAccount write SideEffect
    # status only from an attempt Pod, so a person stood in by a ServiceAccount token cannot resolve.
    ns = run_namespace
    create_run(kube, ns, scenario_run("invoice", {"steps": 1, "fail": {"how": "hang"}}))
    unknown_effect(kube, ns, "invoice", "invoice-send")
    with console(kube.kubeconfig, [ns], tmp_path / "console.log") as started:
        context, page = signed_in(browser, started)
        card = page.locator(f'article.card[data-kind="reconcile"][data-id="{ns}/effect/invoice-send"]')
        expect(card).to_contain_text("send_invoice")
        card.get_by_label(label).check()
        card.get_by_label("Why (recorded)").fill("the customer's ledger has no invoice")
        card.get_by_label("Then retry the Run").uncheck()
        card.get_by_role("button", name="Record verdict").click()
        expect(card.locator(".outcome.ok")).to_contain_text("Unknown -> Failed", timeout=60_000)
        status = kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, "sideeffects", "invoice-send")[
            "status"
        ]
        assert (status["state"], status["resolution"]) == ("Failed", verdict)
        who = page.locator("#who").inner_text().removeprefix("as ")
        assert status["resolvedBy"] == who, "the person the API server knows"
        assert status["resolutionMessage"] == "the customer's ledger has no invoice"
        context.close()


def test_answers_sent_in_the_browser_reach_the_held_attempts_measured(
    kube: Kube, *, run_namespace: str, operator: OperatorProcess, browser: Browser, tmp_path: Path
) -> None:
    """The issue's measure, printed (timings depend on the machine): from the click on Send to the
    operator's verdict on the page, and to the held Attempt's next checkpoint (the agent going on)."""
    ns, names = run_namespace, ["m1", "m2", "m3"]
    ask = {"atStep": 2, "prompt": "Which priority?", "schema": PRIORITY, "holdSeconds": 300}
    for name in names:
        create_run(kube, ns, scenario_run(name, {"steps": 2, "ask": ask}))

    def held(name: str) -> dict[str, Any] | None:
        status: dict[str, Any] = get_run(kube, ns, name).get("status", {})
        pending = status.get("pendingRequest") or {}
        return status if status.get("phase") == "InputRequired" and pending.get("heldBy") else None

    def went_on(name: str, asked_at: str) -> bool:
        return bool(get_run(kube, ns, name)["status"].get("latestCheckpoint") != asked_at)

    verdicts: list[float] = []
    continuing: list[float] = []
    with console(kube.kubeconfig, [ns], tmp_path / "console.log") as started:
        context, page = signed_in(browser, started)
        for name in names:
            asked = wait_for(partial(held, name), timeout=120, what=f"{name} held")
            card = page.locator(f'article.card[data-kind="question"][data-id^="{ns}/{name}/"]')
            expect(card).to_be_visible(timeout=AGENT_MS)
            card.get_by_label("high").check()
            began = time.monotonic()
            card.get_by_role("button", name="Send answer").click()
            expect(card.locator(".outcome.ok")).to_contain_text("Accepted", timeout=60_000)
            verdicts.append((time.monotonic() - began) * 1000)
            checkpoint = str(asked.get("latestCheckpoint"))
            wait_for(partial(went_on, name, checkpoint), 120, 0.02, f"{name}'s held Attempt going on")
            continuing.append((time.monotonic() - began) * 1000)
        context.close()
    for name in names:
        done = wait_phase(kube, ns, name, {"Succeeded", "Failed"})
        assert done["status"]["phase"] == "Succeeded", operator.log_tail()
        result = done["status"]["result"]
        assert (result["attempt"], result["resumed"]) == (f"{name}-a1", True), "the held Attempt went on"
    n = len(names)
    print(f"\nanswer sent in the browser -> accepted: p50 {statistics.median(verdicts):.0f} ms (n={n})")
    print(f"answer sent -> the held Attempt's next checkpoint: p50 {statistics.median(continuing):.0f} ms")
