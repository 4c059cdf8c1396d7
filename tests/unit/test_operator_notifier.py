"""The notifier against a real HTTP receiver (aiohttp, in the test's loop): CloudEvents in binary mode,
retried with backoff on the injected clock, never past its retry time, once per id in a process."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from aiohttp import web

from agentrun.api import Run
from agentrun.core import notifications
from agentrun.core.notifications import Notice
from agentrun.operator.notifications import Notifier
from agentrun.operator.settings import OperatorSettings
from unit.factories import NOW, make_run, pending_request, run_status


@dataclass
class FakeClock:
    """The notifier's clock: sleeping moves time on at once and is remembered."""

    moment: datetime = NOW
    slept: list[float] = field(default_factory=list)
    meanwhile: Callable[[], None] | None = None  # what happens in the world while the notifier sleeps

    def now(self) -> datetime:
        return self.moment

    def monotonic(self) -> float:
        return (self.moment - NOW).total_seconds()

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.moment += timedelta(seconds=seconds)
        if self.meanwhile is not None:
            self.meanwhile()


@dataclass
class Receiver:
    """A CloudEvents sink that answers each POST with the next status of `answers` (then 200)."""

    answers: list[int] = field(default_factory=list)
    seen: list[tuple[dict[str, str], Any]] = field(default_factory=list)
    got: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append((dict(request.headers), json.loads(await request.read())))
        status = self.answers.pop(0) if self.answers else 200
        if status == 200:
            self.got.set()
        return web.Response(status=status)


async def serving(receiver: Receiver, check: Callable[[str], Awaitable[None]]) -> None:
    app = web.Application()
    app.router.add_post("/events", receiver.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        await check(f"http://127.0.0.1:{port}/events")
    finally:
        await runner.cleanup()


def notifier(sink: str, clock: FakeClock, refusals: list[str], *, retry_seconds: float = 60.0) -> Notifier:
    async def labels(namespace: str) -> Mapping[str, str]:
        return {"agentrun.dev/notify-prompt": "true"}

    async def refused(notice: Notice, message: str) -> None:
        refusals.append(message)

    config = OperatorSettings(
        notify_sinks=(sink,), console_url="https://console.example", notify_retry_seconds=retry_seconds
    )
    return Notifier(config, clock=clock, namespace_labels=labels, record_refusal=refused)


WAITING = make_run(
    run_status("InputRequired", current=1, pendingRequest=pending_request()),
    spec={"notify": {"sink": "http://placeholder.example/"}},
)


def waiting_body(sink: str) -> dict[str, Any]:
    body = WAITING.to_api()
    body["spec"]["notify"] = {"sink": sink}
    return body


def test_a_sink_that_fails_is_retried_with_backoff_until_it_takes_the_event() -> None:
    clock, receiver, refusals = FakeClock(), Receiver(answers=[503, 500]), list[str]()

    async def check(sink: str) -> None:
        told = notifier(sink, clock, refusals)
        told.start()
        told.observe(waiting_body(sink))
        told.observe(waiting_body(sink))  # the same state seen again: no second notification
        await receiver.got.wait()
        await told.stop()

    asyncio.run(serving(receiver, check))
    assert clock.slept == [1.0, 2.0]
    assert [headers["ce-id"] for headers, _ in receiver.seen] == [f"{WAITING.metadata.uid}/req-1"] * 3
    headers, data = receiver.seen[-1]
    assert (headers["ce-specversion"], headers["ce-type"]) == ("1.0", "dev.agentrun.run.input_required")
    assert headers["Content-Type"] == "application/json"
    assert data["requestId"] == "req-1" and data["prompt"] == "Which one?"
    assert data["console"].startswith("https://console.example/runs/")
    assert refusals == []


def test_a_sink_that_never_answers_is_given_up_after_the_retry_time() -> None:
    clock, receiver, refusals = FakeClock(), Receiver(answers=[500] * 100), list[str]()
    outcome: list[bool] = []

    async def check(sink: str) -> None:
        told = notifier(sink, clock, refusals, retry_seconds=30)
        told.observe(waiting_body(sink))
        notice = _due(sink)
        assert notice is not None
        outcome.append(await told.deliver(notice))
        await told.stop()

    asyncio.run(serving(receiver, check))
    assert outcome == [False]
    assert sum(clock.slept) >= 30 and len(receiver.seen) == len(clock.slept) + 1


def test_a_sink_off_the_allow_list_is_refused_recorded_once_and_never_called() -> None:
    clock, receiver, refusals = FakeClock(), Receiver(), list[str]()
    outcome: list[bool] = []

    async def check(sink: str) -> None:
        told = notifier(sink, clock, refusals)
        forged = _due(sink.replace("/events", "/elsewhere"))
        assert forged is not None
        outcome.extend([await told.deliver(forged), await told.deliver(forged)])
        await told.stop()

    asyncio.run(serving(receiver, check))
    assert outcome == [False, False]
    assert receiver.seen == []
    [refusal] = refusals
    assert "/elsewhere is not on the operator's allow-list" in refusal


def test_a_notification_whose_run_moved_on_is_not_retried() -> None:
    clock, receiver, refusals = FakeClock(), Receiver(answers=[503]), list[str]()
    outcome: list[bool] = []

    async def check(sink: str) -> None:
        told = notifier(sink, clock, refusals)
        told.observe(waiting_body(sink))
        notice = _due(sink)
        assert notice is not None
        answered = waiting_body(sink) | {"status": run_status("Running", current=2)}

        clock.meanwhile = lambda: told.observe(answered)  # answered while the notifier waits to retry
        outcome.append(await told.deliver(notice))
        await told.stop()

    asyncio.run(serving(receiver, check))
    assert outcome == [False]
    assert len(receiver.seen) == 1, "tried once, then dropped: nobody waits for it any more"


def _due(sink: str) -> Notice | None:
    return notifications.due(Run.model_validate(waiting_body(sink)))
