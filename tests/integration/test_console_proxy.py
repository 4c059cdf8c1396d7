"""The console as the chart installs it, behind an OIDC proxy: every request carries its person's token
(here a `kubectl create token` token, put in the header by the browser as the proxy would), and the
console reads and writes with that token alone. Started with an admin's kubeconfig, to show that its
own credentials never act: a reader still sees no action and the API server refuses what they forge; a
person who may answer answers as themselves; a request without a token, or with a bad one, is refused."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from devcluster.operator import OperatorProcess
from support.console import AGENT_MS, ANSWER, BY_HAND, READ, person, proxied_console, token_of
from support.kube import Kube, wait_for
from support.runs import PRIORITY, create_run, get_run, scenario_run, wait_phase

pytestmark = pytest.mark.cluster
HEADER = "X-Forwarded-Access-Token"


def get(url: str, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def test_behind_a_proxy_each_request_acts_with_its_persons_token(
    kube: Kube, run_namespace: str, operator: OperatorProcess, browser: Browser, tmp_path: Path
) -> None:
    ns = run_namespace
    person(kube, ns, "reader", READ)
    person(kube, ns, "answerer", ANSWER)
    tokens = {name: token_of(kube, ns, name) for name in ("reader", "answerer")}
    ask = {"atStep": 2, "prompt": "Which priority?", "schema": PRIORITY}
    create_run(kube, ns, scenario_run("proxied", {"steps": 2, "ask": ask}))
    pending = wait_for(
        lambda: get_run(kube, ns, "proxied").get("status", {}).get("pendingRequest"),
        timeout=120,
        what="asking",
    )
    with proxied_console(kube.kubeconfig, [ns], HEADER, tmp_path / "console.log") as started:
        # No token: refused, not served as the console's own (admin) identity.
        status, body = get(f"{started.base}/api/inbox", {})
        assert status == 401, body
        assert f"no user token in the {HEADER} header" in body["error"]
        status, body = get(f"{started.base}/api/inbox", {HEADER: "not-a-token"})
        assert status == 401, body
        assert "the API server refuses the token" in body["error"]
        status, body = get(f"{started.base}/api/session", {HEADER: tokens["reader"]})
        assert (status, body["user"]) == (200, f"system:serviceaccount:{ns}:reader"), body

        # A browser the proxy sent without a token: told to sign in again, not served.
        nobody = browser.new_context()
        page = nobody.new_page()
        page.goto(f"{started.base}/")
        expect(page.get_by_role("heading", name="Not signed in")).to_be_visible()
        expect(page.locator("#main")).to_contain_text(f"no user token in the {HEADER} header")
        expect(page.locator("#main")).to_contain_text("organisation's sign-in page")
        nobody.close()

        # The reader: the request in the inbox, no action, and a forged answer refused by the API server.
        reader = browser.new_context(extra_http_headers={HEADER: tokens["reader"]})
        page = reader.new_page()
        page.goto(f"{started.base}/")
        card = page.locator(f'article.card[data-kind="question"][data-id^="{ns}/proxied/"]')
        expect(card).to_be_visible(timeout=AGENT_MS)
        expect(page.locator("#who")).to_have_text(f"as system:serviceaccount:{ns}:reader")
        expect(card.locator(".readonly")).to_contain_text("do not let you patch Runs")
        assert card.locator("button, form, input, textarea, select").count() == 0
        forged = page.evaluate(
            BY_HAND,
            {
                "namespace": ns,
                "run": "proxied",
                "requestId": pending["requestId"],
                "checkpointId": pending["checkpointId"],
                "value": {"priority": "low"},
            },
        )
        assert forged["status"] == 409, forged
        assert f'User "system:serviceaccount:{ns}:reader" cannot patch' in forged["body"]["message"]
        assert "resume" not in get_run(kube, ns, "proxied")["spec"]
        reader.close()

        # The person who may answer: answers through the form, as themselves.
        answerer = browser.new_context(extra_http_headers={HEADER: tokens["answerer"]})
        page = answerer.new_page()
        page.goto(f"{started.base}/")
        card = page.locator(f'article.card[data-kind="question"][data-id^="{ns}/proxied/"]')
        expect(card).to_be_visible(timeout=AGENT_MS)
        expect(page.locator("#who")).to_have_text(f"as system:serviceaccount:{ns}:answerer")
        card.get_by_label("high").check()
        card.get_by_role("button", name="Send answer").click()
        expect(card.locator(".outcome.ok")).to_contain_text("Accepted", timeout=60_000)
        done = wait_phase(kube, ns, "proxied", {"Succeeded", "Failed"})
        assert done["status"]["phase"] == "Succeeded", operator.log_tail() + started.log_tail()
        [answer] = done["status"]["inputs"]
        assert answer["answeredBy"] == f"system:serviceaccount:{ns}:answerer"
        answerer.close()

    assert tokens["reader"] not in started.log.read_text(), "no token in the console's log"
    assert tokens["answerer"] not in started.log.read_text()
