"""What an agent consumed: the counters an Attempt reports and a Run sums (Attempt/Run status.usage)."""

from __future__ import annotations

from typing import Final

from pydantic import Field

from agentrun.api.common import ApiModel

# 2**53 - 1: the largest integer JSON readers (JavaScript, jq) carry exactly; a Run never gets there.
MAX_COUNTER: Final = 9007199254740991
MICRO: Final = 1_000_000  # costMicroUSD per USD


def _counter(description: str, alias: str | None = None) -> int:
    return Field(0, ge=0, le=MAX_COUNTER, description=description, alias=alias)


class Usage(ApiModel):
    """Counters of what the agent consumed. Cost is an integer in micro-USD, so that sums are exact."""

    input_tokens: int = _counter("Model input (prompt) tokens.")
    output_tokens: int = _counter("Model output (completion) tokens.")
    cost_micro_usd: int = _counter("Cost in millionths of a US dollar.", alias="costMicroUSD")
    model_calls: int = _counter("Model requests made.")
    step_retries: int = _counter("Step calls retried inside the Attempt (ctx.step), not counting firsts.")

    def plus(self, other: Usage) -> Usage:
        return Usage.model_validate(
            {k: min(MAX_COUNTER, getattr(self, k) + getattr(other, k)) for k in type(self).model_fields}
        )

    def minus(self, other: Usage) -> Usage:
        """What grew from `other` to self (never negative: a counter that shrank counts 0)."""
        return Usage.model_validate(
            {k: max(0, getattr(self, k) - getattr(other, k)) for k in type(self).model_fields}
        )

    @property
    def empty(self) -> bool:
        return not any(getattr(self, k) for k in type(self).model_fields)

    def to_status(self) -> dict[str, int]:
        """Every counter, zeros included: a merge patch of the whole value."""
        return self.model_dump(mode="json", by_alias=True)


def usage_sum(usages: list[Usage | None]) -> Usage:
    total = Usage()
    for usage in usages:
        if usage is not None:
            total = total.plus(usage)
    return total
