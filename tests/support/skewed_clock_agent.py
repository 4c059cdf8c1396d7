"""The scenario agent on a machine whose clock is off: `python -m support.skewed_clock_agent`.

The Run's env AGENT_CLOCK_SKEW_SECONDS (e.g. -3600) shifts what datetime and time report inside this
process before the SDK starts, as a worker on a badly set node would see the time. Run with
PYTHONPATH=<repo>/tests.
"""

from __future__ import annotations

import datetime
import os
import time

from agentrun import worker
from agentrun.examples.scenario import agent

SKEW = float(os.environ.get("AGENT_CLOCK_SKEW_SECONDS", "0"))
_real_time = time.time


class _SkewedDatetime(datetime.datetime):
    @classmethod
    def now(cls, tz: datetime.tzinfo | None = None) -> _SkewedDatetime:
        return super().now(tz) + datetime.timedelta(seconds=SKEW)

    @classmethod
    def utcnow(cls) -> _SkewedDatetime:
        return cls.now(datetime.UTC).replace(tzinfo=None)


def _skewed_time() -> float:
    return _real_time() + SKEW


datetime.datetime = _SkewedDatetime  # type: ignore[misc]
time.time = _skewed_time

if __name__ == "__main__":
    worker.main(agent)
