"""The console in a real browser (the distribution's Chromium, driven by Playwright), against the real
control plane and operator: people answer through the page, the page shows agent text as text, a
reader sees no action and the API server refuses what they forge, and of two answers one is accepted.
The screenshots in docs/console/ are taken here."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Locator, Page, Route, expect

from devcluster.operator import OperatorProcess
from support.console import AGENT_MS, ANSWER, BY_HAND, READ, console, person, screenshot, signed_in
from support.kube import Kube, wait_for
from support.runs import GROUP, PRIORITY, VERSION, attempts, create_run, get_run, scenario_run, wait_phase

pytestmark = pytest.mark.cluster
HOSTILE = 'Which priority? <script>window.__pwned = 1</script><img src="x" onerror="window.__pwned = 2">'


def asking(name: str, prompt: str = "Which priority?", hold: int | None = 600) -> dict[str, Any]:
    question: dict[str, Any] = {"atStep": 2, "prompt": prompt, "schema": PRIORITY}
    if hold:
        question["holdSeconds"] = hold
    return scenario_run(name, {"steps": 2, "ask": question})


def held(kube: Kube, ns: str, name: str) -> dict[str, Any] | None:
    status = get_run(kube, ns, name).get("status", {})
    pending = status.get("pendingRequest") or {}
    return pending if status.get("phase") == "InputRequired" and pending.get("heldBy") else None


def question_card(page: Page, ns: str, run: str) -> Locator:
    card = page.locator(f'article.card[data-kind="question"][data-id^="{ns}/{run}/"]')
    expect(card).to_be_visible(timeout=AGENT_MS)
    return card


def test_a_question_answered_through_its_form_continues_the_run_from_the_same_checkpoint(
    kube: Kube, run_namespace: str, operator: OperatorProcess, browser: Browser, tmp_path: Path
) -> None:
    ns = run_namespace
    with console(kube.kubeconfig, [ns], tmp_path / "console.log") as started:
        context, page = signed_in(browser, started, viewport={"width": 1100, "height": 760})
        expect(page.get_by_role("heading", name="Nothing waits for you")).to_be_visible()
        assert "token=" not in page.url, "the login token leaves the address bar"
        page.evaluate("window.__loaded = 'once'")

        # The request appears without a reload (server-sent events fed by the console's watches).
        create_run(kube, ns, asking("ask", HOSTILE))
        card = question_card(page, ns, "ask")
        assert page.evaluate("window.__loaded") == "once", "no reload"
        pending = wait_for(lambda: held(kube, ns, "ask"), timeout=120, what="the question held")

        # What the agent wrote is text: no element made of it, no script run.
        expect(card.locator(".prompt")).to_have_text(HOSTILE)
        assert card.locator(".prompt *").count() == 0
        assert page.evaluate("window.__pwned") is None
        expect(card.locator(".meta")).to_contain_text(pending["requestId"])
        screenshot(page, "question", f'article[data-id^="{ns}/ask/"]')

        # Keyboard: j selects the request, Enter goes to its first field.
        page.keyboard.press("j")
        expect(card).to_have_class("card question selected")
        page.keyboard.press("Enter")
        assert page.evaluate("document.activeElement.type") == "radio"
        page.keyboard.press("Escape")

        # An answer the schema refuses: refused in the browser, nothing sent ...
        card.get_by_role("button", name="Edit as JSON").click()
        card.locator("textarea.raw").fill('{"priority": "urgent"}')
        card.get_by_role("button", name="Send answer").click()
        expect(card.locator(".problems")).to_contain_text('priority must be one of "low", "high"')
        screenshot(page, "refused-in-browser", f'article[data-id^="{ns}/ask/"]')
        assert "resume" not in get_run(kube, ns, "ask")["spec"]
        # ... and, sent by hand past the page, refused by the server with the CLI's (and operator's) check.
        forged = page.evaluate(
            BY_HAND,
            {
                "namespace": ns,
                "run": "ask",
                "requestId": pending["requestId"],
                "checkpointId": pending["checkpointId"],
                "value": {"priority": "urgent"},
            },
        )
        assert forged["status"] == 409, forged
        assert f"does not match the schema of request {pending['requestId']}" in forged["body"]["message"]
        assert "'urgent' is not one of ['low', 'high']" in forged["body"]["message"]
        assert "nothing sent" in forged["body"]["message"]
        assert "resume" not in get_run(kube, ns, "ask")["spec"]

        # The form's answer: accepted, and the held Attempt continues from the checkpoint it asked at.
        card.get_by_role("button", name="Use the form").click()
        card.get_by_label("high").check()
        sent = time.monotonic()
        card.get_by_role("button", name="Send answer").click()
        expect(card.locator(".outcome.ok")).to_contain_text("Accepted", timeout=60_000)
        took = (time.monotonic() - sent) * 1000
        print(f"\nanswer sent in the browser -> accepted, the held Attempt continuing: {took:.0f} ms (n=1)")
        expect(page.locator("#toast")).to_contain_text("Accepted")
        done = wait_phase(kube, ns, "ask", {"Succeeded", "Failed"})
        assert done["status"]["phase"] == "Succeeded", operator.log_tail() + started.log_tail()
        result = done["status"]["result"]
        continued = (result["attempt"], result["answer"], result["resumed"])
        assert continued == ("ask-a1", {"priority": "high"}, True)
        [recorded] = done["status"]["inputs"]
        assert (recorded["requestId"], recorded["checkpointId"]) == (
            pending["requestId"],
            pending["checkpointId"],
        )
        assert len(attempts(kube, ns, "ask")) == 1, "the same Attempt went on: no new Pod"
        card.get_by_role("button", name="Dismiss").click()  # the answered card stays until dismissed
        expect(page.get_by_role("heading", name="Nothing waits for you")).to_be_visible()

        # The Run's page: describe's timeline and the report.
        page.goto(f"{started.base}/runs/{ns}/ask")
        expect(page.locator("table.timeline")).to_contain_text("input recorded")
        expect(page.locator("table.timeline")).to_contain_text("resume Accepted")
        expect(page.locator("pre.report").first).to_contain_text("Run ask: Succeeded")
        screenshot(page, "run")
        context.close()


def test_a_reader_sees_no_action_and_the_api_server_refuses_what_they_forge(
    kube: Kube, run_namespace: str, operator: OperatorProcess, browser: Browser, tmp_path: Path
) -> None:
    ns = run_namespace
    reader = person(kube, ns, "reader", READ)
    create_run(kube, ns, asking("quiet", hold=None))
    pending = wait_for(
        lambda: get_run(kube, ns, "quiet").get("status", {}).get("pendingRequest"), timeout=120, what="asking"
    )
    with console(reader.kubeconfig, [ns], tmp_path / "console.log") as started:
        context, page = signed_in(browser, started, viewport={"width": 390, "height": 720}, is_mobile=True)
        card = question_card(page, ns, "quiet")
        expect(page.locator("#who")).to_have_text(f"as system:serviceaccount:{ns}:reader")
        expect(card.locator(".readonly")).to_contain_text("do not let you patch Runs")
        assert card.locator("button, form, input, textarea, select").count() == 0, "no action offered"
        screenshot(page, "read-only-phone")

        forged = page.evaluate(
            BY_HAND,
            {
                "namespace": ns,
                "run": "quiet",
                "requestId": pending["requestId"],
                "checkpointId": pending["checkpointId"],
                "value": {"priority": "low"},
            },
        )
        assert forged["status"] == 409, forged
        assert "forbidden" in forged["body"]["message"], forged
        assert f'User "system:serviceaccount:{ns}:reader" cannot patch' in forged["body"]["message"]
        assert "resume" not in get_run(kube, ns, "quiet")["spec"]
        context.close()


def test_two_people_answering_at_once_one_is_accepted_and_the_other_sees_why(
    kube: Kube, run_namespace: str, operator: OperatorProcess, browser: Browser, tmp_path: Path
) -> None:
    ns = run_namespace
    alice, bob = person(kube, ns, "alice", ANSWER), person(kube, ns, "bob", ANSWER)
    create_run(kube, ns, asking("both"))
    wait_for(lambda: held(kube, ns, "both"), timeout=120, what="the question held")
    with (
        console(alice.kubeconfig, [ns], tmp_path / "alice.log") as alice_console,
        console(bob.kubeconfig, [ns], tmp_path / "bob.log") as bob_console,
    ):
        pages = []
        answers: list[Route] = []

        def together(route: Route) -> None:
            """Holds each answer until both are on their way, then lets both go: truly at once."""
            answers.append(route)
            if len(answers) == 2:
                for answer in answers:
                    answer.continue_()

        for started, choice in ((alice_console, "high"), (bob_console, "low")):
            context, page = signed_in(browser, started)
            page.route("**/api/answer", together)
            card = question_card(page, ns, "both")
            card.get_by_label(choice).check()
            pages.append((context, card))
        for _, card in pages:
            card.get_by_role("button", name="Send answer").click()
        outcomes = []
        for _, card in pages:
            settled = card.locator(".outcome.ok, .outcome.bad")
            expect(settled).to_be_visible(timeout=60_000)
            outcomes.append((settled.get_attribute("class"), settled.inner_text()))
        accepted = [i for i, (kind, _) in enumerate(outcomes) if "ok" in str(kind)]
        assert len(accepted) == 1, outcomes
        winner = ("high", "low")[accepted[0]]
        loser_text = outcomes[1 - accepted[0]][1]
        assert "Accepted" in outcomes[accepted[0]][1]
        # The other sees why: the operator refused the late answer, another one was on its way or came
        # first (named, with its outcome), the Run no longer waits, or it kept changing under the guarded
        # write (the operator acting on the first).
        reasons = ("Rejected", "another answer", "answered first", "not waiting", "keeps changing")
        assert any(why in loser_text for why in reasons), loser_text
        if "answered first" in loser_text:  # named, as the API server knows them
            assert f"system:serviceaccount:{ns}:{('alice', 'bob')[accepted[0]]} answered first" in loser_text
        done = wait_phase(kube, ns, "both", {"Succeeded", "Failed"})
        assert done["status"]["phase"] == "Succeeded", operator.log_tail()
        assert done["status"]["result"]["answer"] == {"priority": winner}
        assert len(done["status"]["inputs"]) == 1
        for context, _ in pages:
            context.close()


def test_pause_from_the_run_page_then_release_from_the_inbox(
    kube: Kube, run_namespace: str, operator: OperatorProcess, browser: Browser, tmp_path: Path
) -> None:
    ns, gate = run_namespace, tmp_path / "gate"
    # The agent waits before its second step until the gate opens: the pause is sure to find it Running.
    create_run(kube, ns, scenario_run("nap", {"steps": 3, "gate": {"file": str(gate), "atStep": 2}}))
    wait_phase(kube, ns, "nap", {"Running"})
    with console(kube.kubeconfig, [ns], tmp_path / "console.log") as started:
        context, page = signed_in(browser, started)
        page.goto(f"{started.base}/runs/{ns}/nap")
        page.get_by_label("Reason").fill("lunch")
        page.get_by_role("button", name="Pause").click()
        expect(page.locator("#toast")).to_contain_text("run nap:", timeout=60_000)
        gate.touch()
        assert wait_phase(kube, ns, "nap", {"Paused", "Succeeded", "Failed"})["status"]["phase"] == "Paused"

        page.get_by_role("link", name="Inbox").first.click()
        card = page.locator(f'article.card[data-kind="pause"][data-id^="{ns}/nap/"]')
        expect(card).to_be_visible()
        card.get_by_role("button", name="Release").click()
        expect(card.locator(".outcome.ok")).to_contain_text("Accepted", timeout=60_000)
        assert wait_phase(kube, ns, "nap", {"Succeeded", "Failed"})["status"]["phase"] == "Succeeded"
        context.close()


def test_reconcile_an_unknown_outcome_then_cancel_the_run_with_a_reason(
    kube: Kube, run_namespace: str, operator: OperatorProcess, browser: Browser, tmp_path: Path
) -> None:
    ns = run_namespace
    create_run(kube, ns, scenario_run("ledger", {"steps": 1, "fail": {"how": "hang"}}))
    # An outcome nobody knows, as a crashed worker leaves it (written here by the cluster's admin).
    effect = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SideEffect",
        "metadata": {"name": "ledger-ticket", "labels": {"agentrun.dev/run": "ledger"}},
        "spec": {"runName": "ledger", "tool": "create_ticket", "idempotencyKey": "t-1", "target": "proj-a"},
    }
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, ns, "sideeffects", effect)
    for state in ("Pending", "Unknown"):
        unknown = {"status": {"state": state, "attempt": "ledger-a1"}}
        kube.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, ns, "sideeffects", "ledger-ticket", unknown
        )
    with console(kube.kubeconfig, [ns], tmp_path / "console.log") as started:
        context, page = signed_in(browser, started, viewport={"width": 1100, "height": 900})
        card = page.locator(f'article.card[data-kind="reconcile"][data-id="{ns}/effect/ledger-ticket"]')
        expect(card).to_contain_text("create_ticket")
        expect(card).to_contain_text("proj-a")
        card.get_by_role("button", name="Record verdict").click()
        expect(card.locator(".problems")).to_contain_text("choose what happened")
        card.get_by_label("Confirmed: it happened").check()
        card.get_by_role("button", name="Record verdict").click()
        expect(card.locator(".problems")).to_contain_text("Confirmed needs the reference")
        card.get_by_label("Reference in the external system").fill("T-9")
        card.get_by_label("Why (recorded)").fill("found it in the tracker")
        card.get_by_label("Then retry the Run").uncheck()
        screenshot(page, "reconcile", f'article[data-id="{ns}/effect/ledger-ticket"]')
        card.get_by_role("button", name="Record verdict").click()
        expect(card.locator(".outcome.ok")).to_contain_text("Unknown -> Confirmed (T-9), resolved by")
        status = kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, "sideeffects", "ledger-ticket")[
            "status"
        ]
        assert (status["state"], status["externalReference"]) == ("Confirmed", "T-9")
        assert status["resolutionMessage"] == "found it in the tracker"
        who = page.locator("#who").inner_text().removeprefix("as ")
        assert status["resolvedBy"] == who, "the person the API server knows"

        page.goto(f"{started.base}/runs/{ns}/ledger")
        page.get_by_label("Reason").fill("no longer needed")
        cancel = page.get_by_role("button", name="Cancel run")
        cancel.click()
        page.get_by_role("button", name="Really cancel?").click()
        expect(page.locator("#toast")).to_contain_text("cancel requested (cancel epoch 0 -> 1)")
        done = wait_phase(kube, ns, "ledger", {"Cancelled"})
        assert done["spec"]["cancelRequest"]["reason"] == "no longer needed"
        context.close()
