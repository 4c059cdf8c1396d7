"""Who this worker is: read from the attempt Pod's annotations and labels via the downward API."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"
NAMESPACE = "AGENTRUN_NAMESPACE"
NAMESPACE_WITH_REFS = "AGENTRUN_NAMESPACE_WITH_REFS"  # core.pods.NAMESPACE_WITH_REFS_ENV


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
    # The operator said the Run's state may be in the state store (its namespace came as
    # AGENTRUN_NAMESPACE_WITH_REFS): the SDK states that it reads references before it reads anything.
    state_in_store: bool = False

    @property
    def attempt_number(self) -> int:
        return int(self.attempt.rsplit("-a", 1)[1])

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Identity:
        """From the process environment, or from `env` (a host running attempts in-process)."""
        env = os.environ if env is None else env
        # AGENTRUN_NAMESPACE_WITH_REFS instead of AGENTRUN_NAMESPACE: only an SDK that reads references (this
        # one) may run the Attempt; an older one stops at once without AGENTRUN_NAMESPACE.
        state_in_store = not env.get(NAMESPACE) and bool(env.get(NAMESPACE_WITH_REFS))
        namespace = env.get(NAMESPACE_WITH_REFS) if state_in_store else env.get(NAMESPACE)
        missing = [k for k in ("AGENTRUN_RUN", NAMESPACE, "AGENTRUN_ATTEMPT") if not env.get(k)]
        if namespace:
            missing = [k for k in missing if k != NAMESPACE]
        if missing:
            raise NotInAttemptPod(
                f"{', '.join(missing)} not set: agentrun.worker runs inside an attempt Pod created by the "
                "agentrun operator"
            )
        return cls(
            run=env["AGENTRUN_RUN"],
            namespace=str(namespace),
            attempt=env["AGENTRUN_ATTEMPT"],
            lease_epoch=int(env.get("AGENTRUN_LEASE_EPOCH", "0")),
            cancel_epoch=int(env.get("AGENTRUN_CANCEL_EPOCH", "0")),
            resume_from=env.get("AGENTRUN_RESUME_FROM") or None,
            # The node agent of the local control plane passes the file's path; a kubelet uses the default.
            termination_message_path=env.get("TERMINATION_MESSAGE_PATH", DEFAULT_TERMINATION_MESSAGE_PATH),
            attempt_reason=env.get("AGENTRUN_ATTEMPT_REASON") or None,
            attempt_input=env.get("AGENTRUN_ATTEMPT_INPUT") == "true",
            lease_resource_version=env.get("AGENTRUN_LEASE_RESOURCE_VERSION") or None,
            state_in_store=state_in_store,
        )
