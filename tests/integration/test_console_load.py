"""The console under load, measured in a real browser: 1,000 pending requests over 10 namespaces.

A control plane of its own and no operator: the Runs' status (a pending request each) is written
directly, so the requests stay pending while the browser loads them. Printed, not asserted (timings
depend on the machine): p50 and p95 over 20 cold loads of the time from navigation to the first usable
control, and of the time from a change in the API server to its card on the open page.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect, sync_playwright

from support.clusters import own_cluster
from support.console import console, launch, signed_in
from support.kube import Kube
from support.runs import GROUP, PRIORITY, VERSION, create_run, scenario_run

pytestmark = pytest.mark.cluster
NAMESPACES, PER_NAMESPACE, LOADS = 10, 100, 20


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    """Overrides the session's `kube` in this module: a control plane of its own, without the operator."""
    yield from own_cluster(tmp_path_factory, "console-load-cluster")


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


def waiting(request_id: str, prompt: str) -> dict[str, Any]:
    """A Run's status while it waits for an answer, as the operator and the worker write it."""
    return {
        "status": {
            "phase": "InputRequired",
            "attempts": 1,
            "latestCheckpoint": f"{request_id}-c1",
            "conditions": [
                {
                    "type": "Waiting",
                    "status": "True",
                    "reason": "InputRequired",
                    "message": "waiting",
                    "lastTransitionTime": now(),
                }
            ],
            "pendingRequest": {
                "requestId": request_id,
                "reason": "input_required",
                "checkpointId": f"{request_id}-c1",
                "prompt": prompt,
                "acceptedSchema": PRIORITY,
            },
        }
    }


def pending_run(kube: Kube, namespace: str, name: str) -> None:
    create_run(kube, namespace, scenario_run(name, {"steps": 1}))
    kube.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "runs", name, waiting(f"{name}-r1", f"Which priority for {name}?")
    )


def quantiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[max(0, round(0.95 * len(ordered)) - 1)]
    return f"p50 {statistics.median(ordered):.0f} ms, p95 {p95:.0f} ms, max {ordered[-1]:.0f} ms"


def test_cold_loads_and_changes_with_a_thousand_pending_requests(kube: Kube, tmp_path: Path) -> None:
    namespaces = [f"load-{n}" for n in range(NAMESPACES)]
    for ns in namespaces:
        kube.core.create_namespace({"metadata": {"name": ns}})
    names = [(ns, f"ask-{i:03d}") for ns in namespaces for i in range(PER_NAMESPACE)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda pair: pending_run(kube, *pair), names))

    with console(kube.kubeconfig, None, tmp_path / "console.log") as started, sync_playwright() as driver:
        browser = launch(driver)
        context, page = signed_in(browser, started)
        expect(page.locator("#count")).to_have_text(str(len(names)), timeout=60_000)
        cookies = context.cookies()

        usable, wall = [], []
        for _ in range(LOADS):
            cold = browser.new_context()  # no cache, no page state: only the session cookie
            cold.add_cookies(cookies)  # type: ignore[arg-type]  # the cookies it gave back
            fresh = cold.new_page()
            began = time.monotonic()
            fresh.goto(f"{started.base}/")
            fresh.locator("article.card button.act").first.wait_for(state="visible", timeout=60_000)
            wall.append((time.monotonic() - began) * 1000)
            usable.append(fresh.evaluate('performance.getEntriesByName("inbox-usable")[0].startTime'))
            assert fresh.locator("article.card").count() == 100, "the first page of cards"
            cold.close()

        seen = []
        for n in range(LOADS):
            ns, name = names[n * 37 % len(names)]
            prompt = f"changed {n}: which priority for {name}?"
            began = time.monotonic()
            kube.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, ns, "runs", name, waiting(f"{name}-r{n + 2}", prompt)
            )
            page.locator("article.card .prompt", has_text=prompt).wait_for(timeout=60_000)
            seen.append((time.monotonic() - began) * 1000)
        browser.close()

    print(f"\n{len(names)} pending requests over {NAMESPACES} namespaces, {LOADS} cold loads:")
    print(f"  navigation -> first usable control (performance mark): {quantiles(usable)}")
    print(f"  navigation -> first usable control (test's clock):     {quantiles(wall)}")
    print(f"  change written -> visible on the open page:            {quantiles(seen)}")
