"""worker.compensation: what worker.main(agent, compensations=..., lookups=...) registers."""

from __future__ import annotations

from typing import Any

from agentrun import worker
from agentrun.worker.compensation import registry


def close(effect: worker.Effect) -> Any:
    return {"closed": effect.reference}


def find_close(effect: worker.Effect) -> Any:
    return None


def test_a_bare_callable_is_a_compensation_without_lookup() -> None:
    made = registry({"close_ticket": close})
    assert made == {"close_ticket": worker.Compensation(close)}
    assert made["close_ticket"].lookup is None and made["close_ticket"].resend == "Never"


def test_a_compensation_keeps_its_lookup_and_bounds() -> None:
    given = worker.Compensation(close, lookup=find_close, resend="WithSameKey", max_sends=2)
    assert registry({"close_ticket": given}) == {"close_ticket": given}
    assert registry(None) == {}
