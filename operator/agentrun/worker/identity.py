"""Who this worker is: read from the attempt Pod's annotations and labels via the downward API."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"


class NotInAttemptPod(RuntimeError):
    pass


@dataclass(frozen=True)
class Identity:
    run: str
    namespace: str
    attempt: str
    lease_epoch: int
    cancel_epoch: int
    resume_from: str | None
    termination_message_path: str
    # From the annotations that spare the SDK its reads at start; None (or False) when the Pod lacks
    # them (made by an older operator): the SDK then reads the Attempt, and the Lease at its renewal.
    attempt_reason: str | None = None
    attempt_input: bool = False
    lease_resource_version: str | None = None

    @property
    def attempt_number(self) -> int:
        return int(self.attempt.rsplit("-a", 1)[1])

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Identity:
        """From the process environment, or from `env` (a host running attempts in-process)."""
        env = os.environ if env is None else env
        missing = [k for k in ("AGENTRUN_RUN", "AGENTRUN_NAMESPACE", "AGENTRUN_ATTEMPT") if not env.get(k)]
        if missing:
            raise NotInAttemptPod(
                f"{', '.join(missing)} not set: agentrun.worker runs inside an attempt Pod created by the "
                "agentrun operator"
            )
        return cls(
            run=env["AGENTRUN_RUN"],
            namespace=env["AGENTRUN_NAMESPACE"],
            attempt=env["AGENTRUN_ATTEMPT"],
            lease_epoch=int(env.get("AGENTRUN_LEASE_EPOCH", "0")),
            cancel_epoch=int(env.get("AGENTRUN_CANCEL_EPOCH", "0")),
            resume_from=env.get("AGENTRUN_RESUME_FROM") or None,
            # The node agent of the local control plane passes the file's path; a kubelet uses the default.
            termination_message_path=env.get("TERMINATION_MESSAGE_PATH", DEFAULT_TERMINATION_MESSAGE_PATH),
            attempt_reason=env.get("AGENTRUN_ATTEMPT_REASON") or None,
            attempt_input=env.get("AGENTRUN_ATTEMPT_INPUT") == "true",
            lease_resource_version=env.get("AGENTRUN_LEASE_RESOURCE_VERSION") or None,
        )
