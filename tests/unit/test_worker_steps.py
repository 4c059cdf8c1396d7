"""The SDK's step retries and usage meter, without a cluster: what they do between API requests."""

from __future__ import annotations

import asyncio

import pytest

from agentrun.api import Usage
from agentrun.kubeapi import KubeApi
from agentrun.worker import StepRetry, TransientError
from agentrun.worker.errors import Cancelled, RateLimited
from agentrun.worker.identity import Identity
from agentrun.worker.main import _termination
from agentrun.worker.session import Session
from agentrun.worker.steps import Journal, StepFailed, run_step
from agentrun.worker.usage import UsageMeter

ME = Identity("run", "ns", "run-a1", 1, 0, None, "/dev/null")
FAST = StepRetry(max_attempts=3, initial_seconds=0.0, max_seconds=0.0)


def session() -> Session:
    # A KubeApi that is never called: without journal=True, a step makes no request at all.
    return Session(KubeApi.__new__(KubeApi), ME)


def flaky(failures: list[BaseException]) -> tuple[list[int], object]:
    calls: list[int] = []

    def fn() -> str:
        calls.append(len(calls))
        if failures:
            raise failures.pop(0)
        return "ok"

    return calls, fn


async def step(s: Session, meter: UsageMeter, fn: object, retry: StepRetry = FAST) -> object:
    journal = Journal(s, replays=False, start=None, answer=None)
    return await run_step(s, journal=journal, usage=meter, name="plan", fn=fn, retry=retry, journaled=False)  # type: ignore[arg-type]


async def nothing(_: Usage) -> None:
    raise AssertionError("no write expected")


def test_a_step_that_fails_twice_then_succeeds_counts_two_retries() -> None:
    calls, fn = flaky([TransientError("503"), RateLimited("slow down", retry_after=0.0)])
    meter = UsageMeter(nothing)
    assert asyncio.run(step(session(), meter, fn)) == "ok"
    assert calls == [0, 1, 2]
    assert meter.total.step_retries == 2


def test_a_step_out_of_tries_fails_with_its_name_and_class() -> None:
    _, fn = flaky([RateLimited("429", retry_after=0.0)] * 3)
    with pytest.raises(StepFailed, match="step 'plan' failed after 3 tries: 429") as failed:
        asyncio.run(step(session(), UsageMeter(nothing), fn))
    report, code = _termination(failed.value)
    assert (report["class"], code) == ("rate_limited", 1)
    assert report["retryAfterSeconds"] == 0


def test_other_errors_are_not_retried() -> None:
    calls, fn = flaky([KeyError("bug")])
    with pytest.raises(KeyError):
        asyncio.run(step(session(), UsageMeter(nothing), fn))
    assert calls == [0]


def test_a_cancel_stops_the_backoff_at_once() -> None:
    async def scenario() -> None:
        s, failed_once = session(), asyncio.Event()

        def fn() -> None:
            failed_once.set()
            raise TransientError("503")

        hour = StepRetry(max_attempts=3, initial_seconds=3600.0, max_seconds=3600.0)
        waiting = asyncio.create_task(step(s, UsageMeter(nothing), fn, hour))
        await failed_once.wait()  # the step is in its hour-long backoff now
        s.cancelled.set()
        with pytest.raises(Cancelled, match="while step 'plan' waited to retry"):
            await asyncio.wait_for(waiting, 60.0)  # long before the hour of backoff, however loaded

    asyncio.run(scenario())


def test_usage_is_written_once_however_many_calls() -> None:
    writes: list[Usage] = []

    async def write(usage: Usage) -> None:
        writes.append(usage)

    async def scenario() -> None:
        meter = UsageMeter(write)
        for _ in range(1000):
            meter.add(input_tokens=10, output_tokens=2, cost_usd=0.0001, model_calls=1)
        await meter.flush()
        await meter.flush()  # nothing changed: no write

    asyncio.run(scenario())
    assert writes == [
        Usage(input_tokens=10000, output_tokens=2000, cost_micro_usd=100000, model_calls=1000, step_retries=0)
    ]
