"""Notifications on a real API server with the operator running: a CloudEvent (HTTP binary mode) reaches a
real HTTP receiver when a Run waits for a person, at least once per id across an operator restart (the
receiver deduplicates by id); a sink off the operator's allow-list is refused and recorded; the prompt
travels only where the namespace opts in; the Run never waits for any of it."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from agentrun.api import NOTIFY_PROMPT_LABEL
from agentrun.examples.manifests import agent_run
from devcluster.operator import OperatorProcess
from devcluster.processes import free_port
from devcluster.tickets import TicketServiceProcess
from support.clusters import CONSOLE_URL
from support.kube import Kube, wait_for
from support.runs import FAST_RETRY, PRIORITY, create_run, get_run, resume, scenario_run, wait_phase

pytestmark = pytest.mark.cluster


class Receiver:
    """A CloudEvents sink on its own thread and loop: every delivery kept, and the events by id (the
    first delivery of each id, as a deduplicating receiver keeps them)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.port = int(url.split(":")[2].split("/", maxsplit=1)[0])
        self.deliveries: list[tuple[dict[str, str], dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def _handle(self, request: web.Request) -> web.Response:
        delivery = (dict(request.headers), json.loads(await request.read()))
        with self._lock:
            self.deliveries.append(delivery)
        return web.Response(status=202)

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_post("/events", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout=30)

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    def sent(self, event_id: str) -> list[tuple[dict[str, str], dict[str, Any]]]:
        with self._lock:
            return [d for d in self.deliveries if d[0].get("ce-id") == event_id]

    def events(self) -> dict[str, tuple[dict[str, str], dict[str, Any]]]:
        with self._lock:
            deduplicated: dict[str, tuple[dict[str, str], dict[str, Any]]] = {}
            for headers, data in self.deliveries:
                deduplicated.setdefault(headers["ce-id"], (headers, data))
            return deduplicated


def _receiving(url: str) -> Iterator[Receiver]:
    receiver = Receiver(url)
    receiver.start()
    try:
        yield receiver
    finally:
        receiver.stop()


@pytest.fixture
def receiver(notify_sink: str) -> Iterator[Receiver]:
    """Listens on the sink the operator's allow-list names."""
    yield from _receiving(notify_sink)


@pytest.fixture
def elsewhere() -> Iterator[Receiver]:
    """A sink nobody allowed: a Run naming it must not make the operator call it."""
    yield from _receiving(f"http://127.0.0.1:{free_port()}/events")


def _asking(name: str, sink: str) -> dict[str, Any]:
    body = scenario_run(
        name, {"steps": 2, "ask": {"atStep": 1, "prompt": "Which priority?", "schema": PRIORITY}}
    )
    body["spec"]["notify"] = {"sink": sink}
    return body


def test_a_question_is_notified_once_per_id_across_a_restart_and_the_run_goes_on(
    kube: Kube, run_namespace: str, operator: OperatorProcess, receiver: Receiver
) -> None:
    ns = run_namespace
    kube.core.patch_namespace(ns, {"metadata": {"labels": {NOTIFY_PROMPT_LABEL: "true"}}})
    create_run(kube, ns, _asking("asks", receiver.url))
    waiting = wait_phase(kube, ns, "asks", {"InputRequired", "Failed", "Succeeded"})
    assert waiting["status"]["phase"] == "InputRequired", operator.log_tail()
    pending = waiting["status"]["pendingRequest"]
    event_id = f"{waiting['metadata']['uid']}/{pending['requestId']}"
    wait_for(lambda: receiver.sent(event_id), what=f"the notification {event_id}")

    operator.restart()  # at least once: the restarted operator tells the receiver again, same id
    operator.wait_ready()
    wait_for(lambda: len(receiver.sent(event_id)) >= 2, timeout=120, what="the notification sent again")
    [(headers, data)] = [e for i, e in receiver.events().items() if i.startswith(waiting["metadata"]["uid"])]
    assert (headers["ce-specversion"], headers["ce-type"]) == ("1.0", "dev.agentrun.run.input_required")
    assert headers["ce-source"] == f"/apis/agentrun.dev/v1alpha1/namespaces/{ns}/runs/asks"
    assert headers["Content-Type"] == "application/json"
    assert data == {
        "namespace": ns,
        "run": "asks",
        "uid": waiting["metadata"]["uid"],
        "phase": "InputRequired",
        "reason": "input_required",
        "requestId": pending["requestId"],
        "checkpointId": pending["checkpointId"],
        "console": f"{CONSOLE_URL}/runs/{ns}/asks",
        "prompt": "Which priority?",  # this namespace opted in
    }

    resume(kube, ns, "asks", pending, {"priority": "high"}, key="high")
    done = wait_phase(kube, ns, "asks", {"Succeeded", "Failed"})
    assert done["status"]["phase"] == "Succeeded", operator.log_tail()


def test_a_sink_off_the_allow_list_is_refused_and_the_prompt_stays_home(
    kube: Kube, run_namespace: str, operator: OperatorProcess, receiver: Receiver, elsewhere: Receiver
) -> None:
    ns = run_namespace  # not opted in for prompts
    create_run(kube, ns, _asking("quiet", receiver.url))
    create_run(kube, ns, _asking("forged", elsewhere.url))
    for name in ("quiet", "forged"):
        waiting = wait_phase(kube, ns, name, {"InputRequired", "Failed", "Succeeded"})
        assert waiting["status"]["phase"] == "InputRequired", "a notification never holds up a Run"

    def refusal() -> str | None:
        events = kube.core.list_namespaced_event(ns, field_selector="involvedObject.name=forged").items
        return next((e.message for e in events if e.reason == "NotifySinkRefused"), None)

    message = wait_for(refusal, what="the refusal of the forged sink recorded on the Run")
    assert f"spec.notify.sink {elsewhere.url} is not on the operator's allow-list" in message
    assert elsewhere.deliveries == [], "the operator never calls a URL a Run author chose"

    uid = get_run(kube, ns, "quiet")["metadata"]["uid"]
    [(_, data)] = wait_for(
        lambda: [e for i, e in receiver.events().items() if i.startswith(uid)], what="the quiet Run's event"
    )
    assert "prompt" not in data and data["requestId"].startswith("quiet-r")


def _ticket_run(name: str, sink: str, service: TicketServiceProcess, **scenario: Any) -> dict[str, Any]:
    body = agent_run(
        name,
        "ticket_agent",
        {"title": f"ticket of {name}", "body": "details", "askPriority": False, **scenario},
        env=service.env(),
        retry=FAST_RETRY,
    )
    body["spec"]["notify"] = {"sink": sink}
    return body


def test_each_kind_is_notified_once_per_id_across_a_restart(
    kube: Kube,
    run_namespace: str,
    operator: OperatorProcess,
    receiver: Receiver,
    tickets: TicketServiceProcess,
) -> None:
    """An agent asking for credentials (AuthRequired), an approval waiting, and an irreversible action
    whose outcome nobody knows (NeedsReconciliation): one event each, the same ids again after a restart."""
    ns = run_namespace
    kube.core.patch_namespace(ns, {"metadata": {"labels": {NOTIFY_PROMPT_LABEL: "true"}}})
    signin = _asking("signin", receiver.url)
    signin["spec"]["input"]["ask"] |= {"reason": "auth_required", "prompt": "Sign in to the tracker"}
    create_run(kube, ns, signin)
    create_run(kube, ns, _ticket_run("approval", receiver.url, tickets, requireApproval=True))
    tickets.set_faults(dropCreateRequests=1)  # the create is lost: an irreversible one is never re-sent
    create_run(kube, ns, _ticket_run("unsure", receiver.url, tickets, reversible=False))

    runs = {
        name: wait_phase(kube, ns, name, {phase, "Succeeded", "Failed"}, timeout=120)
        for name, phase in (
            ("signin", "AuthRequired"),
            ("approval", "AuthRequired"),
            ("unsure", "NeedsReconciliation"),
        )
    }
    phases = {name: run["status"]["phase"] for name, run in runs.items()}
    assert phases == {
        "signin": "AuthRequired",
        "approval": "AuthRequired",
        "unsure": "NeedsReconciliation",
    }, operator.log_tail()
    uid = {name: run["metadata"]["uid"] for name, run in runs.items()}
    signin_request = runs["signin"]["status"]["pendingRequest"]
    approval_request = runs["approval"]["status"]["pendingRequest"]
    unsure = runs["unsure"]["status"]
    assert unsure["failure"]["reason"] == "IrreversibleUnknown"
    ids = {
        "signin": f"{uid['signin']}/{signin_request['requestId']}",
        "approval": f"{uid['approval']}/{approval_request['requestId']}",
        "unsure": f"{uid['unsure']}/IrreversibleUnknown-{unsure['attempts']}",
    }

    def sent_all(times: int) -> bool:
        return all(len(receiver.sent(event_id)) >= times for event_id in ids.values())

    wait_for(lambda: sent_all(1), timeout=120, what=f"the events {sorted(ids.values())}")
    operator.restart()  # at least once: the restarted operator sends what it sees waiting again
    operator.wait_ready()
    wait_for(lambda: sent_all(2), timeout=120, what="every event sent again after the restart")

    events = receiver.events()  # deduplicated by id, as a receiver keeps them
    for name, event_id in ids.items():
        assert [i for i in events if i.startswith(uid[name])] == [event_id], "one event per Run"
    types = {name: events[event_id][0]["ce-type"] for name, event_id in ids.items()}
    assert types == {
        "signin": "dev.agentrun.run.auth_required",
        "approval": "dev.agentrun.run.approval_waiting",
        "unsure": "dev.agentrun.run.needs_reconciliation",
    }
    signin_data = events[ids["signin"]][1]
    assert (signin_data["reason"], signin_data["prompt"]) == ("auth_required", "Sign in to the tracker")
    approval_data = events[ids["approval"]][1]
    assert (approval_data["requestId"], approval_data["checkpointId"]) == (
        approval_request["requestId"],
        approval_request["checkpointId"],
    )
    assert approval_data["action"]["tool"] == "create_ticket"  # opted in: what would be done
    assert approval_data["console"] == f"{CONSOLE_URL}/runs/{ns}/approval"
    unsure_data = events[ids["unsure"]][1]
    assert unsure_data == {
        "namespace": ns,
        "run": "unsure",
        "uid": uid["unsure"],
        "phase": "NeedsReconciliation",
        "reason": "IrreversibleUnknown",
        "console": f"{CONSOLE_URL}/runs/{ns}/unsure",
    }
    assert tickets.creations() == [], "nothing was approved, and the lost create was never sent again"
