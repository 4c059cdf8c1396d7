"""The console in a real browser (the distribution's Chromium, driven by Playwright), against the real
control plane and operator: people answer through the page, the page shows agent text as text, a
reader sees no action and the API server refuses what they forge, and of two answers one is accepted.
The screenshots in docs/console/ are taken here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Locator, Page, Playwright, expect, sync_playwright

from devcluster.operator import OperatorProcess
from support.console import ANSWER, READ, console, launch, person, screenshot, signed_in
from support.kube import Kube, wait_for
from support.runs import PRIORITY, attempts, create_run, get_run, scenario_run, wait_phase

pytestmark = pytest.mark.cluster
HOSTILE = 'Which priority? <script>window.__pwned = 1</script><img src="x" onerror="window.__pwned = 2">'
AGENT_SECONDS = 90_000  # ms for an agent Pod to start and ask (a cold Python on a busy machine)
# Posts an answer straight to the console with the page's session and CSRF token: what a person could
# send by hand, past the page's own checks.
BY_HAND = """async (body) => {
  const session = await (await fetch("/api/session")).json();
  const answer = await fetch("/api/answer", {
    method: "POST",
    headers: {"Content-Type": "application/json", "X-CSRF-Token": session.csrf},
    body: JSON.stringify(body),
  });
  return {status: answer.status, body: await answer.json()};
}"""


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    browser = launch(playwright)
    yield browser
    browser.close()


def asking(name: str, prompt: str = "Which priority?", hold: int | None = 120) -> dict[str, Any]:
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
    expect(card).to_be_visible(timeout=AGENT_SECONDS)
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
        pending = wait_for(lambda: held(kube, ns, "ask"), timeout=60, what="the question held")

        # What the agent wrote is text: no element made of it, no script run.
        expect(card.locator(".prompt")).to_have_text(HOSTILE)
        assert card.locator(".prompt *").count() == 0
        assert page.evaluate("window.__pwned") is None
        expect(card.locator(".meta")).to_contain_text(pending["requestId"])
        screenshot(page, "question", f'article[data-id^="{ns}/ask/"]')

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
        card.get_by_role("button", name="Send answer").click()
        expect(card.locator(".outcome.ok")).to_contain_text("Accepted", timeout=30_000)
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
        lambda: get_run(kube, ns, "quiet").get("status", {}).get("pendingRequest"), timeout=90, what="asking"
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
    wait_for(lambda: held(kube, ns, "both"), timeout=90, what="the question held")
    with (
        console(alice.kubeconfig, [ns], tmp_path / "alice.log") as alice_console,
        console(bob.kubeconfig, [ns], tmp_path / "bob.log") as bob_console,
    ):
        pages = []
        for started, choice in ((alice_console, "high"), (bob_console, "low")):
            context, page = signed_in(browser, started)
            card = question_card(page, ns, "both")
            card.get_by_label(choice).check()
            pages.append((context, card))
        for _, card in pages:  # both sent before either hears back
            card.get_by_role("button", name="Send answer").click()
        outcomes = []
        for _, card in pages:
            settled = card.locator(".outcome.ok, .outcome.bad")
            expect(settled).to_be_visible(timeout=40_000)
            outcomes.append((settled.get_attribute("class"), settled.inner_text()))
        accepted = [i for i, (kind, _) in enumerate(outcomes) if "ok" in str(kind)]
        assert len(accepted) == 1, outcomes
        winner = ("high", "low")[accepted[0]]
        loser_text = outcomes[1 - accepted[0]][1]
        assert "Accepted" in outcomes[accepted[0]][1]
        # The other sees why: the operator refused the late answer, or another one was on its way.
        assert any(why in loser_text for why in ("Rejected", "another answer", "not waiting")), loser_text
        done = wait_phase(kube, ns, "both", {"Succeeded", "Failed"})
        assert done["status"]["phase"] == "Succeeded", operator.log_tail()
        assert done["status"]["result"]["answer"] == {"priority": winner}
        assert len(done["status"]["inputs"]) == 1
        for context, _ in pages:
            context.close()
