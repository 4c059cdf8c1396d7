"""Chaos: many ticket-agent Runs under random faults, then the promises checked and printed as figures.

    PYTHONPATH=hack:tests .venv/bin/python bench/chaos.py --profile full     # make chaos
    PYTHONPATH=hack:tests .venv/bin/python bench/chaos.py --profile small    # tests/integration/test_chaos.py
    options: --runs N --faults N --seconds S --seed N --state-dir D --keep --report out.json

Everything runs on its own local control plane (a temporary directory): etcd, kube-apiserver,
controller-manager, scheduler and the process node agent; the agentrun CRDs, a namespace whose default
service account may do what an attempt Pod does; the external ticket service; the operator as a process.
Runs of the ticket agent (operator/agentrun/examples/ticket_agent.py) are launched a few at a time, with
short leases (5 s, renewed every second) and a generous retry budget; most ask a person for a priority
(interrupt) before they open their ticket, some fail once after the ticket exists. The ticket service
answers creates slowly (a few seconds, after storing the ticket), so workers spend time with their side
effect recorded Pending.

A seeded fault injector then picks, at random times, among (counted by kind in the output):
  kill-worker                      SIGKILL a running worker process
  kill-during-create               SIGKILL a worker whose ticket create is in flight: the service has
                                   stored the ticket and not answered yet (its /inflight lists the key)
  kill-during-create-lookups-down  the same, and the service's lookups fail until that Run stops (its next
                                   Attempt cannot tell whether the ticket exists until the create's send
                                   deadline: NeedsReconciliation, which the harness resolves as a person)
  freeze-worker                    SIGSTOP a worker for 0.4 to 2.5 lease durations, then SIGCONT it
  zombie-worker                    SIGSTOP the node agent (a hung kubelet) and a worker; SIGCONT the worker
                                   after its lease was taken over (it can write late: the fences must
                                   refuse), then the node agent, which stops it
  drop-create-answer               the service stores creates but drops their answers for a few seconds
  drop-create-request              the service drops the next create before storing it (no answer either:
                                   the lookup finds it absent, the ledger sends it again with the same key)
  rate-limit-create                the service answers the next create 429 (the ledger sends it again)
  hold-closes                      the service applies closes but holds their answers for a few seconds
                                   (a compensation's outcome is unknown meanwhile)
  kill-during-close                SIGKILL a compensation Attempt's worker whose close is in flight: the
                                   service has closed the ticket and not answered yet
  restart-operator                 kill -9 the operator, start it again after up to 3 s (once it has been
                                   up long enough to get some work done)
  restart-apiserver                stop kube-apiserver and start it again with the same flags and port
  cancel / cancel-twice            raise spec.cancelEpoch (compare-and-swap), twice: again a little later
  cancel-double-click              the same compare-and-swap sent twice (the second must be refused)
  resume                           answer a waiting Run
  resume-duplicate                 the same answer twice (one key), the same key with another value (the
                                   API server must refuse it), then a second key with another value
  forged-writes                    a hostile agent (tests/support/hostile_agent.py) runs as a Run of the
                                   same namespace and, with its own Pod's token, forges writes to a running
                                   victim Run (its result, phase, Lease, Checkpoints, ledger, Attempt) and
                                   beyond its rights on its own Run; every one must be refused
  store-down                       stop the state store (versitygw, its whole process group) and start it
                                   again with the same data after 2 to 8 s
  store-slow                       the state store answers late: a TCP proxy in front of the real server
                                   (devcluster.faultproxy; the operator and every attempt Pod reach the
                                   store through it) holds each chunk a client sends for 1 to 6 s, for 3 to
                                   10 s
  store-5xx                        the proxy answers every request 503 (an S3 error document) for 1 to 6 s
  blob-replaced                    a hostile agent (tests/support/hostile_agent.py) runs as a Run of the
                                   same namespace and, with its own Pod's store credentials, overwrites the
                                   state blob of a big-state Run waiting for an answer (other bytes of the
                                   same size, or the first half); the harness checks with its own verified
                                   read that the blob was changed, then answers the Run
  fork                             a Run forked (spec.forkFrom) from a ticket Run's checkpoint saved after
                                   its ticket was created (the source may be live, finished, or archived
                                   and deleted): it inherits the confirmed create and must not send it again
  kill-operator-after-archive      arm a trap in the proxy: the next time the operator writes an archive's
                                   index entry, kill -9 the operator right after the store stored it and
                                   before the answer reaches it (between archive and delete), start it
                                   again after up to 3 s
The window ends after --faults faults or --seconds, but never before the profile's minimum (so many
faults of so many kinds, both restarts and a lookups-down kill among them, the latter's Run stopped):
until then the last Run is held back (a Run still to come keeps the ticket service's create faults
available) and untried kinds come first, so a slow machine gets a longer window, never fewer faults.
The service holds the answers to creates from the window's start until the lookups-down kill has found
its target (a create in flight), so that it always finds one.
Runs left waiting for a few seconds are answered as a person would (not counted as faults). Half of the
Runs compensate on cancel (spec.compensation.onCancel: Compensate): their cancel closes their ticket.
A fifth of the Runs are big-state Runs (tests/support/big_state_agent.py: three checkpoints of ~18 KB,
each a blob in the state store, a question after the second); some ticket Runs ask a second question
once their ticket exists (their checkpoint then is a fork point); about a third of the Runs and forks
have spec.ttlSecondsAfterFinished (0, 3 or 8 s): they are archived and deleted during the faults.

After the fault window every frozen worker is continued, the ticket service is healed, and the harness
waits (bounded) until every Run is terminal (Succeeded, Failed, Cancelled) or waiting for someone
(InputRequired, NeedsReconciliation). It then resolves what needs resolving as a person would: answers
waiting Runs; for a Run in NeedsReconciliation it looks each open ticket (Unknown, or Pending: a send
stopped at its deadline) up in the service, records the outcome on the SideEffect (resolvedBy: the
harness's own user name, which it asks the API server for at start, as `kubectl auth whoami` does;
admission refuses any other) and asks for a retry; and waits (bounded) for every Run to end. The report
counts the resolutions the API server accepted.

Invariants (each figure must be 0; any violation makes the exit status 1, with the evidence printed):
  tickets created twice: from the ticket service's own audit log, `created` events beyond the first per
      idempotency key (a key is one Run's ticket).
  tickets closed twice: from the same audit log, closes beyond the first per ticket (`closed` and
      `close-repeated` alike: a compensation is sent once, or again only after a lookup found it not done).
  effects left Pending on a terminal Run: a SideEffect still Pending whose Run is Succeeded, Failed or
      Cancelled at the end (an ended Run settles what was in flight as Unknown or Failed).
  results accepted after their cancel: a Run holding status.result whose committedBy.cancelEpoch is above
      spec.cancelEpoch; or below it although the cancel that raised the epoch past it did not already see
      this very commit in the answer to its (atomic) patch, i.e. the result was written after the cancel;
      or a late-cancelled Run that is not Succeeded (a commit that passed the fence stands, the cancel is
      too late); or a Cancelled Run carrying a result. (The order comes from the patch's answer, not from
      the CancelTooLate Event, which is best effort: an operator killed at the wrong moment never posts it.)
  commits accepted with a stale lease epoch: a Run whose committedBy does not name its current Attempt,
      whose committedBy.leaseEpoch differs from that Attempt's spec.leaseEpoch or from status.leaseEpoch,
      whose committing Attempt is not Succeeded; or two Attempts of a Run with non-increasing lease epochs.
  Runs stuck outside a terminal or waiting phase: after the faults, a Run in neither a terminal phase nor
      a waiting one (InputRequired, AuthRequired, Paused, NeedsReconciliation) when the settle time is up;
      after the resolution, a Run that is not terminal when the resolve time is up.
  unknown side effects not surfaced as NeedsReconciliation: a SideEffect in Unknown (or left Pending
      with no Attempt running) whose Run is not in NeedsReconciliation, Failed or Cancelled, or whose Run's
      status.sideEffects.unknown does not count it. Checked after the faults and after the resolution.
  forged writes accepted: a hostile agent's write that the API server accepted (the hostile Runs are
      left out of every other check: they are the attackers, not Runs under test).
  history lost: Attempts other than exactly 1..status.attempts; an Attempt's resumeFrom or the Run's
      latestCheckpoint that no longer exists; a status.inputs entry whose key is not an Accepted Resume in
      status.controls; an Accepted control record seen during the run that is gone; Accepted resumes and
      Attempts started by a resume that do not match one to one (same request, same value as sent).
  referenced blobs deleted: a state-store reference ({key, sha256, size}, in any field of a Run, Attempt,
      Checkpoint or SideEffect at the end, or in the archive of a deleted Run) whose blob is not at its
      key. The operator runs its collector through the whole run with short periods (a sweep every 2 s,
      30 s of grace and quarantine).
  transient store faults taken as permanent: an Attempt (of a Run at the end, or in a deleted Run's
      archive) failed `deterministic`, or a Run Failed, with a message about the state store or a blob
      (StateUnverifiable included), other than a tampered Run's StateUnverifiable naming its tampered blob.
  replaced blobs not caught: a big-state Run whose blob the harness saw changed that did not stop in
      NeedsReconciliation with reason StateUnverifiable and the blob's key in its message.
  state lost or shortened: a big-state Run that Succeeded (at the end, or in its archive) with a result
      that is not its whole state: not `complete`, or a digest other than that of every output it saved.
  deleted Runs without a verified archive: a Run that vanished during the run for which the store holds
      no archive of its uid, whose archive does not verify against its index entry, that was not
      terminal in it, or that had no ttlSecondsAfterFinished.
  forks that sent again what their source confirmed: a ticket created under a fork's own key (it forked
      after its source's ticket was Confirmed: the inherited record must be reused), or a fork that
      Succeeded with another ticket than its source's.
Also checked, and counted as violations too:
  results that disagree with the world: a Succeeded Run whose result names another ticket than the one
      the service holds for its key, or another priority than the answer its last resumed Attempt got.
  control requests mishandled: a key recorded twice in status.controls, a reused resume key with another
      value accepted by the API server, a double-clicked cancel applied twice.
  Attempts misrecorded: a Run asked again a question it had an answer to (the ticket agent asks one),
      an Attempt not finished on an ended Run, an Attempt after the first with reason 'initial', an
      Attempt failed because its Pod 'disappeared'. (The first chaos runs found each of these.)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import config

from agentrun.api import GROUP, RUN_LABEL, VERSION
from agentrun.api.run import MAX_RECORDED_CONTROLS
from agentrun.cli.cluster import SELF_SUBJECT_REVIEW, SELF_SUBJECT_REVIEWS, reviewed_user
from agentrun.core.ledger import COMPENSATE_SUFFIX
from agentrun.examples.manifests import agent_run
from agentrun.examples.ticket_agent import ticket_key
from agentrun.kubeapi import ApiError
from agentrun.rbac import AGENT_ACCOUNT_PATCH, attempt_role
from agentrun.statestore import BlobRef, BlobStore, StateStoreError, StateUnverifiable, archives
from agentrun.statestore.documents import refs_in
from agentrun.statestore.operatorstore import OperatorStore
from devcluster import security
from devcluster.cluster import LocalCluster
from devcluster.faultproxy import FaultProxy
from devcluster.operator import OperatorProcess
from devcluster.processes import stop_group
from devcluster.tickets import TicketServiceProcess
from support.agentrun import install_crds
from support.big_state_agent import digest as state_digest
from support.big_state_agent import output as state_output
from support.blocking_api import call_json
from support.kube import Kube
from support.runs import support_agent_run

Json = dict[str, Any]
NS = "chaos"
LEASE = {"durationSeconds": 5, "renewSeconds": 1}
RETRY = {
    "maxAttempts": 20,
    "backoff": {"initialSeconds": 1, "factor": 1.5, "maxSeconds": 3},
    "sameErrorLimit": 8,
}
# A Run the harness saw vanish (archived and deleted after its ttlSecondsAfterFinished): ended, for the
# harness; the checks below read its archive.
DELETED = "Deleted"
RUN_TERMINAL = frozenset({"Succeeded", "Failed", "Cancelled"})  # what a Run's archive must say
TERMINAL = RUN_TERMINAL | {DELETED}
WAITING = frozenset({"InputRequired", "AuthRequired", "Paused"})
SETTLED = TERMINAL | WAITING | {"NeedsReconciliation"}
FINISHED_ATTEMPT = frozenset({"Succeeded", "Failed", "Interrupted", "Aborted", "LeaseLost", "Rejected"})
# A Run may keep an effect whose outcome is unknown only in these phases.
MAY_HOLD_UNKNOWN = frozenset({"NeedsReconciliation", "Failed", "Cancelled"})
PRIORITIES = ("low", "normal", "high")
NODE_AGENT = "(node agent)"  # Frozen.run of the frozen node agent


@dataclass(frozen=True)
class Profile:
    runs: int
    faults: int
    seconds: float  # the fault window, at most (once its minimum below is met)
    # The window never ends on its seconds, nor runs out of Runs, before this many faults of this many
    # kinds were injected: the last Run is launched only after them (until then a Run is still to come,
    # so the ticket service's create faults always have a target), and untried kinds come first until
    # this many were tried. On a loaded machine the window is longer; it never has fewer faults.
    min_faults: int
    min_kinds: int
    gap: float  # mean seconds between two faults (when something offers a target)
    concurrency: int  # Runs in flight at once
    settle_seconds: float  # after the faults: until every Run is terminal or waiting
    resolve_seconds: float  # after the resolution: until every Run is terminal
    # At least this long between two kube-apiserver restarts. After each one the scheduler's and the
    # controllers' watches are refused for a while (RBAC not warmed up yet) and back off; restarted every
    # 90 s, those back-offs never reset and Pods wait a minute or more to be scheduled: the chaos run then
    # measures the control plane's recovery, not agentrun.
    apiserver_gap: float
    # The operator is killed again only after it has been up this long: it must get some work done (after
    # a start it lists every object it owns first, which takes a while once there are thousands).
    operator_uptime: float
    answer_after: float  # a Run left waiting this long is answered (as a person would)


PROFILES = {
    "small": Profile(
        runs=20,
        faults=30,
        seconds=60,
        min_faults=15,  # tests/integration/test_chaos.py checks these two
        min_kinds=6,
        gap=1.2,
        concurrency=7,
        # upper bounds: each wait ends as soon as every Run got there (generous for a loaded machine)
        settle_seconds=240,
        resolve_seconds=240,
        apiserver_gap=45,
        operator_uptime=6,
        answer_after=4,
    ),
    "full": Profile(
        runs=1400,
        faults=2000,
        seconds=5400,
        min_faults=1000,
        min_kinds=6,
        gap=0.8,
        concurrency=10,
        settle_seconds=300,
        resolve_seconds=300,
        apiserver_gap=300,
        operator_uptime=30,
        answer_after=5,
    ),
}

# Every run restarts both halves of the control loop at least once (the promise is that reconciliation
# survives a restart at any line), and has a person resolve an outcome nobody could tell (a create killed
# in flight while the lookups fail: the resolve path, whose writes admission checks against the sender):
# each is injected as soon as it first finds a target, never left to the draw, and the fault window does
# not end on its count before all happened (and the lookups-down kill's Run stopped).
LOOKUPS_DOWN = "kill-during-create-lookups-down"
REQUIRED_FAULTS = ("restart-operator", "restart-apiserver", LOOKUPS_DOWN)
# The ticket Runs' create gives up looking up (and sending) this long after its first send: a lookups-down
# kill's Run then stops in NeedsReconciliation soon after (the lookups stay down until it does).
SEND_DEADLINE_SECONDS = 30

WEIGHTS = {
    "kill-worker": 3.0,
    "kill-during-create": 3.0,
    "kill-during-create-lookups-down": 0.7,
    "freeze-worker": 2.0,
    "zombie-worker": 0.6,
    "drop-create-answer": 0.4,
    "drop-create-request": 0.5,
    "rate-limit-create": 0.5,
    "hold-closes": 0.8,
    "kill-during-close": 1.5,
    "restart-operator": 1.2,
    "restart-apiserver": 0.5,
    "cancel": 1.0,
    "cancel-twice": 0.5,
    "cancel-double-click": 0.5,
    "resume": 1.5,
    "resume-duplicate": 1.5,
    "forged-writes": 0.4,
    "store-down": 0.4,
    "store-slow": 0.6,
    "store-5xx": 0.6,
    "blob-replaced": 0.6,
    "fork": 1.0,
    "kill-operator-after-archive": 0.5,
}
STATE_SHARE = 0.2  # of the Runs launched: big-state Runs (their state in the store)
FORK_SOURCE_SHARE = 0.3  # of the ticket Runs: a second question once the ticket exists (a fork point)
FORK_SHARE = 0.3  # at most this share of the Runs launched so far has been forked
TTL_SHARE = 0.35  # of the Runs and forks: spec.ttlSecondsAfterFinished
TTL_CHOICES = (0, 3, 8)
BIG_STATE = {"steps": 3, "outputBytes": 18_000, "askAt": 1, "stampAttempt": True}
NOTE_STEP = "note"  # the ticket agent's checkpoint after its second answer (askAfterTicket)
LEDGER_KEY = "create-ticket"  # the ledger key of fork sources and forks (spec ticketKey): a fork inherits it
HOSTILE_LABEL = "chaos.agentrun.dev/hostile"
HOSTILE_SHARE = 0.05  # at most this share of the Runs launched so far has a hostile agent beside it
CANCEL_SHARE = 0.25  # at most this share of the Runs launched so far is cancelled

INVARIANTS = (
    ("tickets_created_twice", "tickets created twice"),
    ("tickets_closed_twice", "tickets closed twice"),
    ("effects_pending_on_terminal", "effects left Pending on a terminal Run"),
    ("results_after_cancel", "results accepted after their cancel"),
    ("stale_lease_commits", "commits accepted with a stale lease epoch"),
    ("stuck_runs", "Runs stuck outside a terminal or waiting phase"),
    ("unknown_not_surfaced", "unknown side effects not surfaced as NeedsReconciliation"),
    ("forged_writes_accepted", "forged writes accepted"),
    ("history_lost", "history lost"),
    ("referenced_blobs_deleted", "referenced blobs deleted by the collector"),
    ("store_faults_permanent", "transient store faults taken as permanent"),
    ("replaced_blobs_not_caught", "replaced blobs not caught (StateUnverifiable)"),
    ("state_lost", "state lost or shortened"),
    ("deleted_without_archive", "deleted Runs without a verified archive"),
    ("forks_sent_again", "forks that sent again what their source confirmed"),
    ("results_disagree", "results that disagree with the world (also checked)"),
    ("controls_mishandled", "control requests mishandled (also checked)"),
    ("attempts_misrecorded", "Attempts misrecorded (also checked)"),
)


# The collector at work through the whole run: periods far shorter than a production operator's, still
# longer than a frozen worker's pause between its upload and the object that names the blob.
COLLECTOR_ENV = {
    "AGENTRUN_STATE_STORE_GC_INTERVAL_SECONDS": "2",
    "AGENTRUN_STATE_STORE_GC_GRACE_SECONDS": "30",
    "AGENTRUN_STATE_STORE_GC_QUARANTINE_SECONDS": "30",
}


class HarnessError(Exception):
    """The harness itself could not do its job (not a finding about agentrun)."""


# ---- the API, patient across kube-apiserver restarts ---------------------------------------------------


class AnswerLost(Exception):
    """A write was sent but its answer never came: it may or may not have been applied."""


def _not_sent(exc: BaseException) -> bool:
    """True when the request surely never reached the API server (nothing to be unsure about)."""
    reason = getattr(exc, "reason", None)
    return isinstance(
        exc, urllib3.exceptions.NewConnectionError | urllib3.exceptions.ConnectTimeoutError
    ) or (
        isinstance(exc, urllib3.exceptions.MaxRetryError)
        and isinstance(reason, urllib3.exceptions.NewConnectionError | urllib3.exceptions.ConnectTimeoutError)
    )


class Api:
    """JSON in, JSON out. Reads are retried through API server restarts; a write is retried only when it
    surely was not applied (no connection, or the server said it is not ready), else AnswerLost."""

    def __init__(self, kubeconfig: Path, patience: float = 120.0) -> None:
        self.client = config.new_client_from_config(config_file=str(kubeconfig))
        self.patience = patience

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Json:
        deadline = time.monotonic() + self.patience
        while True:
            try:
                return call_json(
                    self.client, method, path, body, query=query, content_type=content_type, timeout=(5, 30)
                )
            except ApiError as exc:
                retryable = exc.status in (429, 503) or (exc.status >= 500 and method == "GET")
                if retryable and time.monotonic() < deadline:
                    time.sleep(0.5)
                    continue
                raise
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                if method != "GET" and not _not_sent(exc):
                    raise AnswerLost(f"{method} {path}: {type(exc).__name__}: {exc}") from None
                if time.monotonic() >= deadline:
                    raise HarnessError(f"the API server did not answer {method} {path}: {exc}") from None
                time.sleep(0.5)

    def get(self, path: str) -> Json | None:
        try:
            return self.call("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def items(self, path: str, selector: str | None = None) -> list[Json]:
        query = {"labelSelector": selector} if selector else None
        found: list[Json] = self.call("GET", path, query=query).get("items", [])
        return found

    def json_patch(self, path: str, operations: list[Json]) -> Json:
        return self.call("PATCH", path, operations, content_type="application/json-patch+json")

    def merge_patch(self, path: str, patch: Json) -> Json:
        return self.call("PATCH", path, patch, content_type="application/merge-patch+json")


def custom(plural: str, name: str | None = None, sub: str | None = None) -> str:
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{NS}/{plural}"
    return path + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


def pods_path() -> str:
    return f"/api/v1/namespaces/{NS}/pods"


def phase_of(run: Json) -> str:
    return str((run.get("status") or {}).get("phase") or "New")


# ---- what the harness did, for the checks ---------------------------------------------------------------


@dataclass
class CancelRecord:
    run: str
    epoch: int  # the epoch this cancel raised spec.cancelEpoch to
    # committedBy as the answer to the (atomic) patch showed it: None when there was no result yet.
    committed_before: Json | None
    answer_lost: bool = False


@dataclass
class ResumeRecord:
    run: str
    key: str
    request_id: str
    checkpoint: str
    value: Json
    outcome: str  # written | refused | lost | gone (the Run was deleted: nothing written)
    message: str = ""


@dataclass
class Frozen:
    pid: int
    start_time: str  # /proc/<pid>/stat field 22: tells a reused pid apart
    until: float
    run: str


@dataclass
class Tampering:
    """A blob-replaced fault: the hostile Run that overwrote `ref`, the state blob of `victim`'s Checkpoint
    `checkpoint`; `earlier` is that Checkpoint's parent (verified: the retry starts there)."""

    victim: str
    hostile: str
    mode: str
    checkpoint: str
    ref: Json
    earlier: str | None
    confirmed: bool | None = None  # the harness's own verified read: True when the blob was changed
    caught: str = ""  # the victim's failure message, once it stopped as StateUnverifiable


@dataclass
class Records:
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    conditions: collections.Counter[str] = field(default_factory=collections.Counter)
    cancels: list[CancelRecord] = field(default_factory=list)
    cancels_refused: int = 0  # refused by the API server (the Run had ended, or the swap lost)
    double_click_applied_twice: list[str] = field(default_factory=list)
    resumes: list[ResumeRecord] = field(default_factory=list)
    key_reuse_accepted: list[str] = field(default_factory=list)
    accepted_seen: dict[str, set[str]] = field(default_factory=lambda: collections.defaultdict(set))
    answers: int = 0  # answers given as a person would (not faults)
    resolutions: int = 0  # SideEffects resolved by the harness: the API server accepted the write
    retries_requested: int = 0
    operator_starts: int = 0
    apiserver_restarts: list[float] = field(default_factory=list)  # seconds each took
    hostile: list[str] = field(default_factory=list)  # the hostile agents' Runs
    tamperings: dict[str, Tampering] = field(default_factory=dict)  # by victim
    unverifiable_untampered: list[str] = field(default_factory=list)  # StateUnverifiable, nobody tampered
    archive_traps_fired: list[str] = field(default_factory=list)  # request lines the operator died after


# ---- processes ------------------------------------------------------------------------------------------


def _proc_start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def worker_pid(pod: Json, state_dir: Path) -> int | None:
    """The pid of a running ticket-agent worker of this cluster's node (never anyone else's process)."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    if not statuses or "running" not in (statuses[0].get("state") or {}):
        return None
    container_id = str(statuses[0].get("containerID") or "")
    if not container_id.startswith("process://"):
        return None
    pid = int(container_id.removeprefix("process://"))
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        cwd = os.readlink(f"/proc/{pid}/cwd")
        group = os.getpgid(pid)
    except OSError:
        return None
    agent = "ticket_agent" in cmdline or "big_state_agent" in cmdline
    if not agent or not cwd.startswith(str(state_dir)) or group != pid:
        return None
    return pid


# ---- the chaos run ---------------------------------------------------------------------------------------


class Chaos:
    def __init__(self, profile: Profile, seed: int, state_dir: Path, out: Callable[[str], None]) -> None:
        self.profile = profile
        self.seed = seed
        self.rng = random.Random(seed)
        self.state_dir = state_dir
        self.say = out
        self.cluster = LocalCluster(state_dir=state_dir / "cluster")
        self.tickets = TicketServiceProcess(state_dir / "tickets.json", state_dir / "logs" / "tickets.log")
        self.operator: OperatorProcess | None = None
        self.api: Api | None = None
        self.user = ""  # the harness's user name, as the API server knows it (it resolves as this person)
        self.records = Records()
        self.launched: list[str] = []
        self.spec_of: dict[str, Json] = {}  # run -> its input
        self.frozen: list[Frozen] = []
        self.timers: list[tuple[float, str, Callable[[], object]]] = []
        self.runs: dict[str, Json] = {}
        self.pods: dict[str, Json] = {}
        self.effects: list[Json] = []
        self.act_at: dict[str, float] = {}  # run -> when a person acts on its wait next
        self.retry_requests: collections.Counter[str] = collections.Counter()
        self.last_fault: dict[str, float] = {}
        self.next_launch = 0.0
        self.observed_at = -1e9
        self.began = time.monotonic()
        self.last_apiserver_restart = time.monotonic() - profile.apiserver_gap / 2
        self.operator_down = False
        self.operator_started_at = 0.0
        self.proxy: FaultProxy | None = None
        self.kind: dict[str, str] = {}  # run -> ticket | state | fork
        self.uid: dict[str, str] = {}
        self.ttl: dict[str, int] = {}  # run -> its spec.ttlSecondsAfterFinished, when it has one
        self.deleted: dict[str, float] = {}  # run -> when the harness saw it gone
        self.fork_points: dict[str, str] = {}  # fork source -> a State checkpoint saved after its ticket
        self.examined: dict[str, str] = {}  # fork source -> the latest checkpoint looked at
        self.fork_of: dict[str, str] = {}  # fork -> its source
        self.store_faulted_until = 0.0
        self.trap_fired: list[str] = []  # filled by the proxy's thread
        # The Run a lookups-down kill hit, while the service's lookups stay down (until it stops).
        self.lookups_down_for: str | None = None
        self.lookups_down_runs: set[str] = set()  # every Run a lookups-down kill hit
        self.lookups_down_until = 0.0  # the upper bound of that (a loaded machine), then lookups come back

    # ---- set-up and tear-down ----------------------------------------------------------------------

    def setup(self) -> None:
        self.say(f"chaos: starting a local control plane in {self.state_dir}")
        self.cluster.start(timeout_seconds=180)
        kube = Kube(self.cluster.kubeconfig, Path(self.cluster.binary("kubectl")))
        install_crds(kube, timeout=120)
        self.api = Api(self.cluster.kubeconfig)
        self.user = self.whoami()
        self.api.call("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
        self._wait(
            "the default service account",
            lambda: self.api_().items(f"/api/v1/namespaces/{NS}/serviceaccounts"),
        )
        self.api.call(
            "PATCH",
            f"/api/v1/namespaces/{NS}/serviceaccounts/default",
            AGENT_ACCOUNT_PATCH,
            content_type="application/merge-patch+json",
        )
        rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}"
        self.api.call("POST", f"{rbac}/roles", attempt_role(NS))
        binding = {
            "metadata": {"name": "agentrun-attempt"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "agentrun-attempt"},
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": NS}],
        }
        self.api.call("POST", f"{rbac}/rolebindings", binding)
        store_env = self.cluster.state_store_env()
        # The namespace's own principal (get and put under its prefix, no delete), as the chart gives it:
        # the hostile agents have exactly what any agent of the namespace has.
        self.api.call(
            "POST",
            f"/api/v1/namespaces/{NS}/secrets",
            security.state_store_secret(NS, self.cluster.namespace_store_env(NS)),
        )
        # The operator and every attempt Pod (told the operator's URL) reach the store through the proxy;
        # the harness's own reads go to the server directly.
        store = self.cluster.object_store
        assert store is not None
        self.proxy = FaultProxy("127.0.0.1", store.port)
        self.proxy.start()
        proxied_url = self.cluster.state_store_url.replace(store.endpoint, self.proxy.endpoint)
        self.tickets.start()
        os.environ["AGENTRUN_METRICS_PORT"] = "0"  # other operators on this machine may hold the default
        operator_kubeconfig = security.install(
            self.cluster.binary("kubectl"), self.cluster.kubeconfig, self.state_dir / "operator.kubeconfig"
        )
        self.operator = OperatorProcess(
            operator_kubeconfig,
            self.state_dir / "logs" / "operator.log",
            env={
                **security.OPERATOR_ENV,
                **security.state_store_operator_env(proxied_url),
                **store_env,
                **COLLECTOR_ENV,
            },
        )
        self._start_operator()

    def teardown(self) -> None:
        for frozen in self.frozen:
            self._continue(frozen)
        self.frozen.clear()
        if self.operator:
            self.operator.stop()
        self.tickets.stop()
        if self.proxy is not None:
            self.proxy.stop()
        self.cluster.stop()

    def api_(self) -> Api:
        assert self.api is not None
        return self.api

    def whoami(self) -> str:
        """The harness's user name as the API server knows it (a SelfSubjectReview, as `kubectl auth
        whoami` and the plugin ask): what admission requires in every name of the sender it writes."""
        for _ in range(3):  # a review is only a question: asked again when its answer was lost
            with contextlib.suppress(AnswerLost):
                user = reviewed_user(self.api_().call("POST", SELF_SUBJECT_REVIEWS, SELF_SUBJECT_REVIEW))
                if user is None:
                    raise HarnessError("the API server did not say who the harness is (SelfSubjectReview)")
                return user
        raise HarnessError("the API server did not answer the harness's SelfSubjectReview")

    def _start_operator(self, timeout: float = 180) -> None:
        assert self.operator is not None
        log = self.operator.log_path
        offset = log.stat().st_size if log.exists() else 0
        self.operator.start()
        self.records.operator_starts += 1
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.operator.alive():
                raise HarnessError(f"the operator exited during start-up:\n{self.operator.log_tail()}")
            with log.open("rb") as f:
                f.seek(offset)
                if b"agentrun operator started" in f.read():
                    self.operator_down = False
                    self.operator_started_at = time.monotonic()
                    return
            time.sleep(0.1)
        raise HarnessError(f"the operator did not start in {timeout}s:\n{self.operator.log_tail()}")

    @staticmethod
    def _wait(what: str, probe: Callable[[], Any], timeout: float = 120) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if value := probe():
                return value
            time.sleep(0.2)
        raise HarnessError(f"timed out waiting for {what}")

    # ---- observing ----------------------------------------------------------------------------------

    def observe(self, every: float = 1.0) -> None:
        """Reads the Runs that have not ended (an ended Run stays as last seen), their Pods and SideEffects;
        at most once every `every` seconds, so that thousands of Runs cost the API server little."""
        if time.monotonic() < self.observed_at + every:
            return
        api = self.api_()
        active = [n for n in self.launched if phase_of(self.runs.get(n, {})) not in TERMINAL]
        for name in active:
            if (run := api.get(custom("runs", name))) is None:
                self._gone(name)
                continue
            if run["metadata"]["uid"] != self.uid.setdefault(name, run["metadata"]["uid"]):
                self._gone(name)  # deleted and created again under its name: never by this harness
                continue
            self.runs[name] = run
            status = run.get("status") or {}
            for control in status.get("controls") or []:
                if control.get("outcome") == "Accepted":
                    self.records.accepted_seen[name].add(control["idempotencyKey"])
            self.find_fork_point(name, status.get("latestCheckpoint"))
            tampering = self.records.tamperings.get(name)
            failure = status.get("failure") or {}
            if (
                tampering is not None
                and not tampering.caught
                and phase_of(run) == "NeedsReconciliation"
                and failure.get("reason") == "StateUnverifiable"
            ):
                tampering.caught = str(failure.get("message"))
        active = [n for n in active if n not in self.deleted]
        selector = f"{RUN_LABEL} in ({','.join(active)})"
        self.pods = {p["metadata"]["name"]: p for p in api.items(pods_path(), selector)} if active else {}
        self.effects = api.items(custom("sideeffects"), selector) if active else []
        self.observed_at = time.monotonic()

    def find_fork_point(self, name: str, latest: str | None) -> None:
        """A fork source's checkpoint saved after its ticket (the `note` step, whose ledger mark counts the
        create): a fork from it inherits the confirmed create."""
        if not latest or name in self.fork_points or not self.spec_of.get(name, {}).get("askAfterTicket"):
            return
        if self.kind.get(name) != "ticket" or self.examined.get(name) == latest:
            return
        self.examined[name] = latest
        checkpoint = self.api_().get(custom("checkpoints", latest))
        spec = (checkpoint or {}).get("spec") or {}
        if spec.get("step") == NOTE_STEP and int(spec.get("ledgerMark") or 0) >= 1:
            self.fork_points[name] = latest

    def _gone(self, name: str) -> None:
        """The Run is no longer there (archived and deleted): ended, for the harness; checked at the end."""
        self.deleted.setdefault(name, time.monotonic())
        last = self.runs.get(name, {})
        self.runs[name] = {"metadata": last.get("metadata") or {"name": name}, "status": {"phase": DELETED}}

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    def progress(self) -> None:
        phases = collections.Counter(phase_of(self.runs.get(n, {})) for n in self.launched)
        shown = " ".join(f"{p}={n}" for p, n in sorted(phases.items()))
        self.say(
            f"  t={self.elapsed():5.0f}s launched {self.launched_main()}/{self.profile.runs} "
            f"(+{len(self.fork_of)} forks) "
            f"faults {sum(self.records.faults.values())}/{self.profile.faults} | {shown}"
        )

    # ---- launching Runs -------------------------------------------------------------------------------

    def launched_main(self) -> int:
        """Runs launched, forks left out (the profile's --runs counts these)."""
        return sum(1 for name in self.launched if self.kind.get(name) != "fork")

    def launch_some(self, *, hold_last: bool = False) -> None:
        """Launches the next Run when there is room; with hold_last, never the last one."""
        active = sum(1 for name in self.launched if phase_of(self.runs.get(name, {})) not in TERMINAL)
        to_launch = self.profile.runs - (1 if hold_last else 0)
        room = active < self.profile.concurrency and self.launched_main() < to_launch
        if room and time.monotonic() >= self.next_launch:  # one at a time: the Runs' steps spread out
            self.launch(f"t{self.launched_main() + 1:03d}")
            self.next_launch = time.monotonic() + self.rng.uniform(0.5, 2.0)

    def launch(self, name: str) -> None:
        spec: Json = {"retry": RETRY, "lease": LEASE}
        if self.rng.random() < STATE_SHARE:
            name = "s" + name[1:]
            scenario: Json = dict(BIG_STATE)
            manifest = support_agent_run(name, "big_state_agent", scenario)
            self.kind[name] = "state"
        else:
            scenario = {
                "title": f"chaos ticket {name}",
                "body": f"opened by the chaos run (seed {self.seed})",
                "askPriority": self.rng.random() < 0.6,
                "sendDeadlineSeconds": SEND_DEADLINE_SECONDS,
            }
            if self.rng.random() < 0.2:
                scenario["failAfterTicket"] = [1]
            if self.rng.random() < FORK_SOURCE_SHARE:
                scenario |= {"askAfterTicket": True, "ticketKey": LEDGER_KEY}
            if self.rng.random() < 0.5:
                spec["compensation"] = {"onCancel": "Compensate"}
            manifest = agent_run(name, "ticket_agent", scenario, env=self.tickets.env())
            self.kind[name] = "ticket"
        self.create(name, manifest, spec, scenario)

    def create(self, name: str, manifest: Json, spec: Json, scenario: Json) -> None:
        if self.rng.random() < TTL_SHARE:
            self.ttl[name] = spec["ttlSecondsAfterFinished"] = self.rng.choice(TTL_CHOICES)
        manifest["spec"].update(spec)
        created: Json | None = None
        try:
            created = self.api_().call("POST", custom("runs"), manifest)
        except ApiError as exc:
            if exc.status != 409:
                raise
        except AnswerLost:
            if self.api_().get(custom("runs", name)) is None:
                created = self.api_().call("POST", custom("runs"), manifest)
        if created is None:
            created = self.api_().get(custom("runs", name))
        if created is not None:
            self.uid[name] = created["metadata"]["uid"]
        self.launched.append(name)
        self.spec_of[name] = scenario

    # ---- timers -------------------------------------------------------------------------------------

    def later(self, seconds: float, what: str, action: Callable[[], object]) -> None:
        self.timers.append((time.monotonic() + seconds, what, action))

    def run_timers(self, *, all_now: bool = False) -> None:
        now = time.monotonic()
        due = [t for t in self.timers if all_now or t[0] <= now]
        self.timers = [t for t in self.timers if t not in due]
        for _, _, action in sorted(due, key=lambda t: t[0]):
            action()
        for frozen in [f for f in self.frozen if all_now or f.until <= now]:
            self._continue(frozen)
            self.frozen.remove(frozen)

    # ---- the fault window ---------------------------------------------------------------------------

    def fault_window(self) -> None:
        profile = self.profile
        # Until the lookups-down kill has its target, creates are stored and their answers held: the first
        # create in flight stays in flight (its Attempt's client waits) until the harness has seen it.
        self.tickets.set_faults(delayCreateSeconds=2.5, holdCreates=True)
        self.records.conditions["slow-creates"] += 1
        next_fault = time.monotonic() + 2.0
        next_condition = time.monotonic() + 15.0
        next_progress = time.monotonic()
        mean_gap = profile.gap
        window_end = time.monotonic() + profile.seconds
        while (sum(self.records.faults.values()) < profile.faults or not self.required_faults_done()) and (
            time.monotonic() < window_end or not self.minimum_done()
        ):
            self.observe()
            self.after_traps()
            self.settle_tamperings()
            if self.launched_main() == profile.runs and all(
                phase_of(self.runs.get(n, {})) in TERMINAL for n in self.launched
            ):
                break  # nothing left to disturb
            # The last Run waits for the window's minimum (Profile.min_faults): until then a Run is still
            # to come, a target for the ticket service's create faults whatever the machine's pace.
            self.launch_some(hold_last=not self.minimum_done())
            self.run_timers()
            self.lookups_back_when_stopped()
            self.tend(after=profile.answer_after, again=6)
            now = time.monotonic()
            if now >= next_progress:
                self.progress()
                next_progress = now + 15
            if now >= next_condition:
                delay = self.rng.choice((1.5, 2.5, 3.5))
                self.tickets.set_faults(delayCreateSeconds=delay)
                self.records.conditions[f"slow-creates-{delay}s"] += 1
                next_condition = now + self.rng.uniform(10, 20)
            # Past --faults, only what is required and still untried is injected: once all of it was,
            # the window waits (for the lookups-down kill's Run to stop) without more faults.
            more = sum(self.records.faults.values()) < profile.faults or not self.required_injected()
            if now >= next_fault and more:
                kind = self.inject()
                if kind is not None:
                    self.records.faults[kind] += 1
                    next_fault = time.monotonic() + self.rng.uniform(0.4, 1.6) * mean_gap
                else:
                    next_fault = time.monotonic() + 0.3
            time.sleep(0.2)
        # The rest run without faults (--runs is honoured), while the faults' timers still go off: a
        # frozen process is continued when its time is up, or the Runs it holds would never end.
        deadline = time.monotonic() + profile.settle_seconds
        while self.launched_main() < profile.runs:
            if time.monotonic() > deadline:  # Runs in flight do not end: the checks below say which
                self.say(f"chaos: only {self.launched_main()} of {profile.runs} Runs launched in time")
                break
            self.observe()
            self.after_traps()
            self.settle_tamperings()
            self.launch_some()
            self.run_timers()
            self.tend(after=profile.answer_after, again=6)
            time.sleep(0.5)
        self.progress()

    def end_faults(self) -> None:
        self.proxy_().disarm()
        self.after_traps()
        self.run_timers(all_now=True)
        self.proxy_().set_mode("pass")
        self.tickets.clear_faults()
        self.lookups_down_for = None
        if self.operator is not None and not self.operator.alive():
            self._start_operator()

    def available(self) -> dict[str, list[Any]]:
        """Targets of each fault kind now."""
        workers: list[tuple[str, int]] = []
        creating: list[tuple[str, int]] = []
        frozen_pids = {f.pid for f in self.frozen}
        # A create is in flight when the ledger says Pending for this Attempt (written before the call)
        # and the service has received it and not answered yet; the ledger alone says nothing about the
        # service.
        pending = {
            (e.get("status") or {}).get("attempt")
            for e in self.effects
            if (e.get("status") or {}).get("state") == "Pending"
        }
        received = self._creates_in_flight() if pending else set()
        compensating = [n for n in self.launched if phase_of(self.runs.get(n, {})) == "Compensating"]
        closes = self._closes_in_flight() if compensating else set()
        closing: list[tuple[str, int]] = []
        for name, pod in self.pods.items():
            pid = worker_pid(pod, self.state_dir)
            if pid is None or pid in frozen_pids:
                continue
            run = pod["metadata"]["labels"][RUN_LABEL]
            workers.append((run, pid))
            if name in pending and ticket_key(NS, run) in received:
                creating.append((run, pid))
            if ticket_key(NS, run) in closes:
                closing.append((run, pid))
        cancelled = {c.run for c in self.records.cancels}
        may_cancel = len(cancelled) < CANCEL_SHARE * len(self.launched)
        cancellable = [n for n in self.launched if phase_of(self.runs.get(n, {})) not in TERMINAL]
        held = self.held()
        # a Run whose blob a hostile agent overwrites is never cancelled: it must read its blob and stop
        # nor the Run of a lookups-down kill: it must stop unable to tell, and be resolved by a person
        untouchable = cancelled | set(self.records.tamperings) | self.lookups_down_runs
        fresh = [n for n in cancellable if n not in untouchable] if may_cancel else []
        waiting = [
            n for n in self.launched if phase_of(self.runs.get(n, {})) == "InputRequired" and n not in held
        ]
        store_calm = time.monotonic() >= self.store_faulted_until
        tamperable = [n for n in waiting if self.kind.get(n) == "state" and n not in self.records.tamperings]
        forked = len(self.fork_of) < FORK_SHARE * self.launched_main()
        sources = sorted(self.fork_points) if forked else []
        expiring = [n for n in self.ttl if n not in self.deleted]
        since_restart = time.monotonic() - self.last_apiserver_restart
        operator_uptime = time.monotonic() - self.operator_started_at
        since_drop = time.monotonic() - self.last_fault.get("drop-create-answer", -1e9)
        targets: dict[str, list[Any]] = {
            "kill-worker": workers,
            "kill-during-create": creating,
            LOOKUPS_DOWN: creating if self.lookups_down_for is None else [],
            "freeze-worker": workers,
            "zombie-worker": workers if not any(f.run == NODE_AGENT for f in self.frozen) else [],
            "drop-create-answer": [True] if creating and since_drop > 10 else [],
            "drop-create-request": [True] if self.launched_main() < self.profile.runs else [],
            "rate-limit-create": [True] if self.launched_main() < self.profile.runs else [],
            "hold-closes": [True] if compensating else [],
            "kill-during-close": closing,
            "restart-operator": [True]
            if not self.operator_down and operator_uptime > self.profile.operator_uptime
            else [],
            "restart-apiserver": [True] if since_restart > self.profile.apiserver_gap else [],
            "cancel": fresh,
            "cancel-twice": fresh,
            "cancel-double-click": fresh,
            "resume": waiting,
            "resume-duplicate": waiting,
            "forged-writes": [
                n
                for n in self.launched
                if phase_of(self.runs.get(n, {})) == "Running" and self.kind.get(n) != "state"
            ]
            if len(self.records.hostile) < max(1.0, HOSTILE_SHARE * len(self.launched))
            else [],
            "store-down": [True] if store_calm else [],
            "store-slow": [True] if store_calm else [],
            "store-5xx": [True] if store_calm else [],
            "blob-replaced": tamperable,
            "fork": sources,
            "kill-operator-after-archive": [True]
            if expiring
            and not self.operator_down
            and operator_uptime > self.profile.operator_uptime
            and self.proxy is not None
            and not self.proxy.trap_armed()
            else [],
        }
        return targets

    def required_injected(self) -> bool:
        return all(self.records.faults[kind] for kind in REQUIRED_FAULTS)

    def required_faults_done(self) -> bool:
        """Each required kind injected, and the lookups-down kill's Run stopped (its lookups came back)."""
        return self.required_injected() and self.lookups_down_for is None

    def lookups_back_when_stopped(self) -> None:
        """The service's lookups come back once the lookups-down kill's Run has stopped (settled, most
        likely in NeedsReconciliation: it could not tell) or gone, or at the upper bound."""
        name = self.lookups_down_for
        if name is None:
            return
        stopped = name in self.deleted or phase_of(self.runs.get(name, {})) in SETTLED
        if stopped or time.monotonic() >= self.lookups_down_until:
            self.tickets.set_faults(failLookups=False)
            self.lookups_down_for = None

    def kinds_tried(self) -> int:
        return sum(1 for count in self.records.faults.values() if count)

    def minimum_done(self) -> bool:
        """The window's promised minimum happened: Profile.min_faults faults of min_kinds kinds, the
        required ones among them."""
        faults, profile = sum(self.records.faults.values()), self.profile
        return (
            faults >= profile.min_faults
            and self.kinds_tried() >= profile.min_kinds
            and (self.required_faults_done())
        )

    def inject(self) -> str | None:
        targets = {k: v for k, v in self.available().items() if v}
        if not targets:
            return None
        kinds = sorted(targets)
        untried = [k for k in kinds if not self.records.faults[k]]
        required = [k for k in REQUIRED_FAULTS if k in untried]
        if required:
            kind = required[0]
        elif untried and (
            # untried kinds first up to the profile's minimum of kinds, then every kind early on, by chance
            self.kinds_tried() < self.profile.min_kinds or self.rng.random() < 0.5
        ):
            kind = self.rng.choice(untried)
        else:
            kind = self.rng.choices(kinds, weights=[WEIGHTS[k] for k in kinds])[0]
        target = self.rng.choice(targets[kind])
        done = getattr(self, "fault_" + kind.replace("-", "_"))(target)
        if done:
            self.last_fault[kind] = time.monotonic()
        return kind if done else None

    # ---- faults -------------------------------------------------------------------------------------

    def fault_kill_worker(self, target: tuple[str, int]) -> bool:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(target[1], signal.SIGKILL)
            return True
        return False

    def _creates_in_flight(self) -> set[str]:
        """Keys of the creates the ticket service has stored and not answered yet."""
        return {e["idempotencyKey"] for e in self.tickets.in_flight() if e.get("op", "create") == "create"}

    def _closes_in_flight(self) -> set[str]:
        """Create keys of the tickets whose close the service has applied and not answered yet."""
        return {e["idempotencyKey"] for e in self.tickets.in_flight() if e.get("op") == "close"}

    def fault_kill_during_close(self, target: tuple[str, int]) -> bool:
        if ticket_key(NS, target[0]) not in self._closes_in_flight():
            return False
        return self.fault_kill_worker(target)

    def fault_hold_closes(self, _: object) -> bool:
        self.tickets.set_faults(holdCloses=True)
        self.later(
            self.rng.uniform(1, 4), "close answers back", lambda: self.tickets.set_faults(holdCloses=False)
        )
        return True

    def fault_drop_create_request(self, _: object) -> bool:
        self.tickets.set_faults(dropCreateRequests=1)
        return True

    def fault_rate_limit_create(self, _: object) -> bool:
        self.tickets.set_faults(rateLimitCreates=1, rateLimitRetryAfter=0)
        return True

    def fault_kill_during_create(self, target: tuple[str, int]) -> bool:
        # Asked again right before the kill: the observation may be a while old, the answer sent since.
        if ticket_key(NS, target[0]) not in self._creates_in_flight():
            return False
        return self.fault_kill_worker(target)

    def fault_kill_during_create_lookups_down(self, target: tuple[str, int]) -> bool:
        self.tickets.set_faults(failLookups=True)  # before the kill: the next Attempt must not find it
        if not self.fault_kill_during_create(target):
            self.tickets.set_faults(failLookups=False)
            return False
        self.tickets.set_faults(holdCreates=False)  # the first target was found: creates answer again
        self.lookups_down_for = target[0]
        self.lookups_down_runs.add(target[0])
        self.lookups_down_until = time.monotonic() + self.profile.settle_seconds
        return True

    def fault_freeze_worker(self, target: tuple[str, int]) -> bool:
        run, pid = target
        start = _proc_start_time(pid)
        if start is None:
            return False
        try:
            os.killpg(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return False
        seconds = self.rng.uniform(0.4, 2.5) * LEASE["durationSeconds"]
        self.frozen.append(Frozen(pid, start, time.monotonic() + seconds, run))
        return True

    def fault_zombie_worker(self, target: tuple[str, int]) -> bool:
        """Freezes the node agent (a hung kubelet) and a worker; the worker wakes first, after its lease
        was taken over and its Pod deleted, with nobody there to kill it: a zombie whose late writes the
        fences must refuse. Then the node agent wakes and stops it."""
        agent = next((c for c in self.cluster.components if c.name == "node-agent"), None)
        agent_start = _proc_start_time(agent.pid) if agent else None
        if agent is None or agent_start is None or not self.fault_freeze_worker(target):
            return False
        worker = self.frozen[-1]
        worker.until = time.monotonic() + self.rng.uniform(7, 10)
        os.killpg(agent.pid, signal.SIGSTOP)
        self.frozen.append(
            Frozen(agent.pid, agent_start, worker.until + self.rng.uniform(1.5, 3), NODE_AGENT)
        )
        return True

    def _continue(self, frozen: Frozen) -> None:
        if _proc_start_time(frozen.pid) == frozen.start_time:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(frozen.pid, signal.SIGCONT)

    def fault_drop_create_answer(self, _: object) -> bool:
        self.tickets.set_faults(dropCreateResponse=True)
        self.later(
            self.rng.uniform(1, 3),
            "create answers back",
            lambda: self.tickets.set_faults(dropCreateResponse=False),
        )
        return True

    def fault_restart_operator(self, _: object) -> bool:
        assert self.operator is not None
        self.operator.kill()
        self.operator_down = True
        self.later(self.rng.uniform(0.1, 3.0), "operator back", self._start_operator)
        return True

    def fault_restart_apiserver(self, _: object) -> bool:
        began = time.monotonic()
        self.cluster.restart_component("kube-apiserver", timeout_seconds=120)
        self.records.apiserver_restarts.append(time.monotonic() - began)
        self.last_apiserver_restart = time.monotonic()
        return True

    def fault_forged_writes(self, victim: str) -> bool:
        current = (self.runs[victim].get("status") or {}).get("currentAttempt")
        if not current:
            return False
        return self._hostile_run({"victim": victim, "victimAttempt": f"{victim}-a{current}"}) is not None

    def _hostile_run(self, input: dict[str, Any]) -> str | None:
        """Creates the next hostile agent's Run with `input`; its name, or None when it was not made."""
        name = f"hostile-{len(self.records.hostile) + 1:03d}"
        attacker = support_agent_run(name, "hostile_agent", input, labels={HOSTILE_LABEL: "true"})
        try:
            self.api_().call("POST", custom("runs"), attacker)
        except AnswerLost:
            if self.api_().get(custom("runs", name)) is None:
                return None
        self.records.hostile.append(name)
        return name

    # ---- the state store, forks, archives ------------------------------------------------------------

    def fault_store_down(self, _: object) -> bool:
        store = next((c for c in self.cluster.components if c.name == "object-store"), None)
        if store is None:
            return False
        stop_group(store.pid, grace_seconds=2)
        seconds = self.rng.uniform(2, 8)
        self.store_faulted_until = time.monotonic() + seconds + 2
        self.later(seconds, "the store back", self._store_back)
        return True

    def _store_back(self) -> None:
        self.cluster.restart_component("object-store", timeout_seconds=120)

    def fault_store_slow(self, _: object) -> bool:
        assert self.proxy is not None
        seconds = self.rng.uniform(3, 10)
        self.proxy.set_mode("slow", delay=self.rng.uniform(1, 6))
        self.store_faulted_until = time.monotonic() + seconds
        self.later(seconds, "the store answers in time", lambda: self.proxy_().set_mode("pass"))
        return True

    def fault_store_5xx(self, _: object) -> bool:
        assert self.proxy is not None
        seconds = self.rng.uniform(1, 6)
        self.proxy.set_mode("5xx")
        self.store_faulted_until = time.monotonic() + seconds
        self.later(seconds, "the store answers well", lambda: self.proxy_().set_mode("pass"))
        return True

    def proxy_(self) -> FaultProxy:
        assert self.proxy is not None
        return self.proxy

    def fault_blob_replaced(self, victim: str) -> bool:
        current = self.api_().get(custom("runs", victim))  # still waiting, and nobody has answered yet
        if current is None or phase_of(current) != "InputRequired":
            return False
        pending = (current.get("status") or {}).get("pendingRequest") or {}
        if (current["spec"].get("resume") or {}).get("requestId") == pending.get("requestId"):
            return False
        checkpoint = self.api_().get(custom("checkpoints", pending.get("checkpointId", "-")))
        ref = ((checkpoint or {}).get("spec") or {}).get("stateRef")
        if checkpoint is None or ref is None:
            return False
        mode = self.rng.choice(("replace", "truncate"))
        store = {"mode": mode, "checkpoint": checkpoint["spec"]["id"]}
        name = self._hostile_run({"victim": victim, "store": store})
        if name is None:
            return False
        self.records.tamperings[victim] = Tampering(
            victim, name, mode, checkpoint["spec"]["id"], ref, checkpoint["spec"].get("parent")
        )
        return True

    def held(self) -> set[str]:
        """Victims whose blob-replaced fault is not settled yet: nobody answers or cancels them meanwhile."""
        return {v for v, t in self.records.tamperings.items() if t.confirmed is None}

    def settle_tamperings(self) -> None:
        """Once a hostile Run has ended, the harness reads the victim's blob itself, verified: changed (the
        victim must stop as StateUnverifiable) or not (the attack failed). Then the victim is answered."""
        for tampering in self.records.tamperings.values():
            if tampering.confirmed is not None:
                continue
            hostile = self.api_().get(custom("runs", tampering.hostile))
            if hostile is None or phase_of(hostile) not in RUN_TERMINAL:
                continue
            store = BlobStore.from_url(self.cluster.state_store_url, env=self.cluster.state_store_env())
            try:
                asyncio.run(store.get(BlobRef.from_json(tampering.ref)))
                tampering.confirmed = False
            except StateUnverifiable:
                tampering.confirmed = True
            except StateStoreError:
                continue  # the store is down: read it again later

    def fault_fork(self, source: str) -> bool:
        name = f"f{len(self.fork_of) + 1:03d}"
        scenario = dict(self.spec_of[source])
        spec: Json = {
            "retry": RETRY,
            "lease": LEASE,
            "forkFrom": {"run": source, "checkpointId": self.fork_points[source]},
        }
        if self.rng.random() < 0.5:
            spec["compensation"] = {"onCancel": "Compensate"}
        manifest = agent_run(name, "ticket_agent", scenario, env=self.tickets.env())
        self.kind[name] = "fork"
        self.fork_of[name] = source
        self.create(name, manifest, spec, scenario)
        return True

    def fault_kill_operator_after_archive(self, _: object) -> bool:
        """The next index entry the operator writes (its archive is written and verified by then) kills it
        before the store's answer reaches it: the Run is archived, not deleted yet."""
        operator = self.operator
        assert operator is not None

        def kill(line: bytes) -> None:  # on the proxy's thread: the operator that wrote it, whichever start
            process = operator.process
            if self.operator_down:  # being started again (a kill now would fail the start-up): let it be
                return
            if process is not None and process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
            self.trap_fired.append(line.decode(errors="replace"))

        self.proxy_().trap_once(rb"^PUT /[^/ ]+/_archives/" + NS.encode() + rb"/_index/", kill)
        return True

    def after_traps(self) -> None:
        """The operator the proxy's trap killed is started again after up to 3 s."""
        while self.trap_fired:
            line = self.trap_fired.pop()
            self.records.archive_traps_fired.append(line)
            if self.operator_down or self.operator is None:
                continue
            self.operator.kill()  # reaps it
            self.operator_down = True
            self.later(self.rng.uniform(0.1, 3.0), "operator back", self._start_operator)

    def fault_cancel(self, run: str) -> bool:
        return self.cancel(run) is not None

    def fault_cancel_twice(self, run: str) -> bool:
        if self.cancel(run) is None:
            return False
        self.later(self.rng.uniform(0.2, 4.0), f"second cancel of {run}", lambda: self._cancel_again(run))
        return True

    def _cancel_again(self, run: str) -> None:
        self.cancel(run)

    def fault_cancel_double_click(self, run: str) -> bool:
        current = self.api_().get(custom("runs", run))
        if current is None:
            return False
        observed = int(current["spec"].get("cancelEpoch", 0))
        first = self.cancel(run, observed=observed)
        second = self.cancel(run, observed=observed)
        if first is not None and second is not None:
            self.records.double_click_applied_twice.append(f"{run}: epoch {observed} raised twice")
        return first is not None

    def cancel(self, run: str, observed: int | None = None) -> int | None:
        """The compare-and-swap of `kubectl agentrun cancel`; the epoch it wrote, None if refused."""
        api = self.api_()
        if observed is None:
            current = api.get(custom("runs", run))
            if current is None:
                return None
            observed = int(current["spec"].get("cancelEpoch", 0))
        operations = [
            {"op": "test", "path": "/spec/cancelEpoch", "value": observed},
            {"op": "replace", "path": "/spec/cancelEpoch", "value": observed + 1},
        ]
        try:
            written = api.json_patch(custom("runs", run), operations)
        except ApiError as exc:
            if exc.status == 404:  # archived and deleted since it was read (its time to live ran out)
                self._gone(run)
                return None
            if exc.status not in (409, 422):
                raise
            self.records.cancels_refused += 1
            return None
        except AnswerLost:
            self.records.cancels.append(CancelRecord(run, observed + 1, None, answer_lost=True))
            return observed + 1
        status = written.get("status") or {}
        before = status.get("committedBy") if "result" in status else None
        self.records.cancels.append(CancelRecord(run, observed + 1, before))
        return observed + 1

    def fault_resume(self, run: str) -> bool:
        return self.answer(run) is not None

    def fault_resume_duplicate(self, run: str) -> bool:
        first = self.answer(run)
        if first is None:
            return False
        other = {"priority": self.rng.choice([p for p in PRIORITIES if p != first.value["priority"]])}

        def again() -> None:
            # The same answer under the same key (changes nothing), then the same key with another value,
            # which the API server must refuse while spec.resume holds that key. (A person may have
            # answered the agent's next question meanwhile: then spec.resume holds their key, the reuse is
            # no direct one, and the operator judges it; the test operation keeps to the direct case.)
            self.resume(run, first.key, first.request_id, first.checkpoint, first.value)
            key = first.key
            reuse = self.resume(run, key, first.request_id, first.checkpoint, other, stored_key=key)
            if reuse.outcome == "written":
                self.records.key_reuse_accepted.append(f"{run}: key {first.key} reused with {other}")

        def second() -> None:  # another key, another value: before or after the operator judged the first
            self.resume(run, f"{first.key}-second", first.request_id, first.checkpoint, other)

        first_delay = self.rng.uniform(0, 2)
        self.later(first_delay, f"duplicate answer to {run}", again)
        self.later(first_delay + self.rng.uniform(0.1, 3), f"second answer to {run}", second)
        return True

    # ---- answering, as a person would -----------------------------------------------------------------

    def tend(self, after: float, again: float) -> None:
        """What a person does for a Run waiting for someone, `after` seconds into its wait (and every
        `again` seconds while it still waits): answers its question, or reconciles its unknown outcome."""
        now = time.monotonic()
        held = self.held()
        for name in self.launched:
            phase = phase_of(self.runs.get(name, {}))
            if phase not in ("InputRequired", "NeedsReconciliation") or name in held:
                self.act_at.pop(name, None)
                continue
            if now < self.act_at.setdefault(name, now + after):
                continue
            self.act_at[name] = now + again
            if phase == "InputRequired":
                if self.answer(name) is not None:
                    self.records.answers += 1
            elif self.reconcile(name):
                self.act_at[name] = now + 1.0  # ask for the retry once the ledger shows the outcome

    def answer(self, run: str) -> ResumeRecord | None:
        current = self.api_().get(custom("runs", run))
        pending = ((current or {}).get("status") or {}).get("pendingRequest")
        if not pending:
            return None
        key = f"answer-{run}-{self.rng.getrandbits(40):010x}"
        value = {"priority": self.rng.choice(PRIORITIES)}
        return self.resume(run, key, pending["requestId"], pending["checkpointId"], value)

    def resume(
        self,
        run: str,
        key: str,
        request_id: str,
        checkpoint: str,
        value: Json,
        *,
        stored_key: str | None = None,
    ) -> ResumeRecord:
        """Sets spec.resume as a whole (a JSON patch, as `kubectl agentrun resume` does); with `stored_key`,
        only while spec.resume holds that key (a test operation: refused otherwise)."""
        resume = {"requestId": request_id, "checkpointId": checkpoint, "value": value, "idempotencyKey": key}
        record = ResumeRecord(run, key, request_id, checkpoint, value, "written")
        operations: list[Json] = [{"op": "add", "path": "/spec/resume", "value": resume}]
        if stored_key is not None:
            operations.insert(0, {"op": "test", "path": "/spec/resume/idempotencyKey", "value": stored_key})
        try:
            self.api_().json_patch(custom("runs", run), operations)
        except ApiError as exc:
            if exc.status == 404:  # archived and deleted since it was read: nothing was written
                self._gone(run)
                record.outcome, record.message = "gone", exc.message
                self.records.resumes.append(record)
                return record
            if exc.status not in (409, 422):
                raise
            record.outcome, record.message = "refused", exc.message
        except AnswerLost as exc:
            record.outcome, record.message = "lost", str(exc)
        self.records.resumes.append(record)
        return record

    # ---- after the faults -------------------------------------------------------------------------------

    def settle(self, timeout: float, done: Callable[[str], bool]) -> list[str]:
        """Waits until done(phase) holds for every Run; returns the names that never got there."""
        deadline = time.monotonic() + timeout
        next_progress = time.monotonic() + 15
        while True:
            self.observe()
            self.settle_tamperings()
            late = [n for n in self.launched if not done(phase_of(self.runs.get(n, {})))]
            if not late or time.monotonic() >= deadline:
                return late
            if time.monotonic() >= next_progress:
                self.progress()
                next_progress = time.monotonic() + 15
            time.sleep(0.5)

    def resolve(self) -> list[str]:
        """Answers waiting Runs and reconciles Runs in NeedsReconciliation, until every Run has ended."""
        deadline = time.monotonic() + self.profile.resolve_seconds
        next_progress = time.monotonic() + 15
        self.act_at.clear()
        while True:
            self.observe()
            self.settle_tamperings()
            late = [n for n in self.launched if phase_of(self.runs.get(n, {})) not in TERMINAL]
            if not late or time.monotonic() >= deadline:
                return late
            self.tend(after=0, again=6)
            if time.monotonic() >= next_progress:
                self.progress()
                next_progress = time.monotonic() + 15
            time.sleep(0.5)

    def reconcile(self, name: str) -> bool:
        """What a person does: look each ticket whose outcome is open up in the service and record the
        outcome on its SideEffect (True); once none is open any more, ask for a retry with a new key
        (False). Open: Unknown, or Pending (a send that stopped at its deadline, MaxSendsReached: the Run
        waits for a person all the same, and a retry alone would stop there again)."""
        unknown = [
            e
            for e in self.effects
            if e["spec"]["runName"] == name and _effect_state(e) in ("Unknown", "Pending")
        ]
        if unknown:
            tickets = {t["idempotencyKey"]: t for t in self.tickets.tickets()}
            for effect in unknown:
                key = service_key(effect)
                if key.endswith(COMPENSATE_SUFFIX):  # a close: did it take effect?
                    outcome = _close_outcome(effect, tickets.get(key.removesuffix(COMPENSATE_SUFFIX)))
                elif (ticket := tickets.get(key)) is not None:
                    outcome = {"state": "Confirmed", "externalReference": ticket["id"], "result": ticket}
                else:
                    outcome = {"state": "Failed"}
                patch = {"status": {**outcome, "resolvedBy": self.user}}
                with contextlib.suppress(AnswerLost):  # still Unknown if it was lost: resolved again
                    written = self.api_().merge_patch(
                        custom("sideeffects", effect["metadata"]["name"], "status"), patch
                    )
                    if (written.get("status") or {}).get("resolvedBy") == self.user:
                        self.records.resolutions += 1
            return True
        self.retry_requests[name] += 1
        key = f"retry-{name}-{self.retry_requests[name]}"
        if (self.runs.get(name, {}).get("status") or {}).get("compensating"):
            # An incomplete compensation is asked again, never retried (that would run the agent again).
            with contextlib.suppress(AnswerLost):
                self.api_().merge_patch(
                    custom("runs", name), {"spec": {"compensateRequest": {"idempotencyKey": key}}}
                )
            return False
        request: Json = {"idempotencyKey": key, "reason": f"{self.user}: outcome recorded"}
        failure = (self.runs.get(name, {}).get("status") or {}).get("failure") or {}
        if failure.get("reason") == "StateUnverifiable":
            # The operator puts the overwritten blob back (StateRestored); the harness still goes on from
            # the checkpoint before the tampered one (verified), as `kubectl agentrun retry
            # --from-checkpoint` asks, so the run does not depend on the restore.
            tampering = self.records.tamperings.get(name)
            if tampering is None or not tampering.confirmed:
                self.records.unverifiable_untampered.append(f"{name}: {failure.get('message')}")
            elif tampering.earlier:
                request = {**request, "fromCheckpoint": tampering.earlier, "reason": "tampered state"}
        with contextlib.suppress(AnswerLost):
            self.api_().merge_patch(custom("runs", name), {"spec": {"retryRequest": request}})
            self.records.retries_requested += 1
        return False

    # ---- the whole run -----------------------------------------------------------------------------------

    def run(self) -> Report:
        self.setup()
        self.began = time.monotonic()
        self.last_apiserver_restart = self.began - self.profile.apiserver_gap / 2
        self.say(
            f"chaos: profile {self.profile}, seed {self.seed}; up in {self.elapsed():.0f}s; faults begin"
        )
        self.fault_window()
        window = self.elapsed()
        self.end_faults()
        self.say(
            f"chaos: {sum(self.records.faults.values())} faults in {window:.0f}s; "
            "waiting for the Runs to settle"
        )
        stuck_after_faults = self.settle(self.profile.settle_seconds, lambda p: p in SETTLED)
        settled = self.snapshot()
        self.say("chaos: settled; resolving what waits for a person")
        stuck_after_resolution = self.resolve()
        self.progress()
        final = self.snapshot()
        for name in self.launched:  # gone after the harness last read it (it reads ended Runs no more)
            if name not in final.runs:
                self._gone(name)
        archived = self.read_archives()
        audit = self.tickets.audit()
        evidence = {
            "settled": {k: v for k, v in vars(settled).items() if not k.startswith("_")},
            "final": {k: v for k, v in vars(final).items() if not k.startswith("_")},
            "archived": archived,
            "audit": audit,
        }
        (self.state_dir / "world.json").write_text(json.dumps(evidence, indent=1, default=str))
        return build_report(
            self,
            settled=settled,
            final=final,
            archived=archived,
            audit=audit,
            stuck_after_faults=stuck_after_faults,
            stuck_after_resolution=stuck_after_resolution,
            window_seconds=window,
        )

    def snapshot(self) -> World:
        api = self.api_()
        # The report of a stopped Run follows its SideEffects (level-based): wait for it, bounded
        # generously (a loaded machine's operator may take a while; a real violation stays one).
        deadline = time.monotonic() + 120
        while True:
            runs = {r["metadata"]["name"]: r for r in api.items(custom("runs"))}
            hostile = {n: r for n, r in runs.items() if HOSTILE_LABEL in (r["metadata"].get("labels") or {})}
            ours = {n: r for n, r in runs.items() if n not in hostile}

            world = World(
                runs=ours,
                attempts=_of_runs(api.items(custom("attempts")), ours),
                checkpoints=_of_runs(api.items(custom("checkpoints")), ours),
                effects=_of_runs(api.items(custom("sideeffects")), ours),
                hostile=hostile,
                stored=self.stored_keys(),
            )
            if not unknown_not_surfaced(world) or time.monotonic() >= deadline:
                return world
            time.sleep(1.0)

    def read_archives(self) -> dict[str, Json]:
        """Each deleted Run's archive, found by its uid in the namespace's index and verified against its
        entry (read as `kubectl agentrun describe --archived` does): {document, entries} or {error}."""
        store = BlobStore.from_url(self.cluster.state_store_url, env=self.cluster.state_store_env())
        entries = asyncio.run(archives.archived_runs(store, NS)) if self.deleted else []
        found: dict[str, Json] = {}
        for name in sorted(self.deleted):
            uid = self.uid.get(name)
            mine = [e for e in entries if uid is not None and e.uid == uid]
            if not mine:
                found[name] = {"error": f"no archive of its uid {uid} in the index"}
                continue
            try:
                document = asyncio.run(archives.read_entry(store, mine[-1]))
            except StateStoreError as exc:
                found[name] = {"error": f"its archive does not verify: {exc}"}
                continue
            found[name] = {"document": document, "entries": len(mine)}
        return found

    def stored_keys(self) -> frozenset[str]:
        """Every key in the cluster's state store, as references name them."""
        store = OperatorStore.from_url(self.cluster.state_store_url, env=self.cluster.state_store_env())
        return frozenset(store.location.key(blob.key) for blob in asyncio.run(store.list_blobs()))


def _of_runs(items: list[Json], runs: dict[str, Json]) -> list[Json]:
    return [item for item in items if item["spec"]["runName"] in runs]


# ---- the checks: pure functions of what was observed ---------------------------------------------------


@dataclass
class World:
    runs: dict[str, Json]
    attempts: list[Json]
    checkpoints: list[Json]
    effects: list[Json]
    hostile: dict[str, Json] = field(default_factory=dict)  # the hostile agents' Runs
    stored: frozenset[str] | None = None  # every key in the state store (None: not looked at)
    _by_run: dict[str, list[Json]] = field(default_factory=dict, repr=False)

    def attempts_of(self, run: str) -> list[Json]:
        if not self._by_run:
            for attempt in sorted(self.attempts, key=lambda a: a["spec"]["number"]):
                self._by_run.setdefault(attempt["spec"]["runName"], []).append(attempt)
        return self._by_run.get(run, [])


def forged_writes(world: World) -> tuple[int, list[str]]:
    """(writes the hostile agents attempted, the ones the API server accepted), from their results."""
    attempted, accepted = 0, []
    for name, run in sorted(world.hostile.items()):
        outcomes = ((run.get("status") or {}).get("result") or {}).get("outcomes") or {}
        attempted += len(outcomes)
        accepted += [
            f"{name}: {what} accepted" for what, outcome in sorted(outcomes.items()) if outcome == "accepted"
        ]
    return attempted, accepted


def referenced_blobs_deleted(world: World, archived: dict[str, Json] | None = None) -> list[str]:
    """References in the Runs under test and their objects (and in deleted Runs' archives) whose blob is
    not at its key."""
    if world.stored is None:
        return []
    named = [("Run", r) for r in world.runs.values()]
    named += [("Attempt", a) for a in world.attempts] + [("Checkpoint", c) for c in world.checkpoints]
    named += [("SideEffect", e) for e in world.effects]
    named += [
        ("the archive of", {"metadata": {"name": name}, **record["document"]})
        for name, record in sorted((archived or {}).items())
        if "document" in record
    ]
    return [
        f"{kind} {obj['metadata']['name']}: {ref.key} is gone"
        for kind, obj in named
        for ref in refs_in(obj)
        if ref.key not in world.stored
    ]


def service_key(effect: Json) -> str:
    """The ticket service's key for a SideEffect's ledger key: as given when the Run scoped it itself (the
    default key), else prefixed with the Run whose agent sent it (ticket_ledger.service_key), for an
    inherited record its source."""
    key = str(effect["spec"]["idempotencyKey"])
    if key.startswith(f"{NS}."):
        return key
    run = ((effect.get("status") or {}).get("inheritedFrom") or {}).get("run") or effect["spec"]["runName"]
    return f"{NS}.{run}.{key}"


def _close_outcome(effect: Json, ticket: Json | None) -> Json:
    """A person's verdict on a close whose outcome is unknown: it happened if the ticket is closed, else it
    did not (Absent: the compensation may send it again)."""
    if ticket is not None and ticket.get("status") == "closed":
        return {"state": "Confirmed", "externalReference": ticket["id"], "result": ticket}
    sends = len((effect.get("status") or {}).get("sends") or [])
    return {"state": "Failed", "resolution": "Absent", "resolvedSends": sends}


def tickets_created_twice(audit: list[Json]) -> list[str]:
    created = collections.Counter(e["idempotencyKey"] for e in audit if e["event"] == "created")
    return [f"key {key}: {count} tickets created" for key, count in sorted(created.items()) if count > 1]


def tickets_closed_twice(audit: list[Json]) -> list[str]:
    closes = collections.Counter(e["ticketId"] for e in audit if e["event"] in ("closed", "close-repeated"))
    return [
        f"ticket {ticket}: {count} closes arrived" for ticket, count in sorted(closes.items()) if count > 1
    ]


def effects_pending_on_terminal(world: World) -> list[str]:
    return [
        f"{e['metadata']['name']} ({e['spec']['runName']}): Pending, the Run is {phase}"
        for e in world.effects
        if _effect_state(e) == "Pending"
        and (phase := phase_of(world.runs.get(e["spec"]["runName"], {}))) in TERMINAL
    ]


def results_after_cancel(world: World, cancels: list[CancelRecord]) -> tuple[list[str], list[str]]:
    """(violations, unverifiable): see the module docstring."""
    violations, unverifiable = [], []
    for name, run in sorted(world.runs.items()):
        status, epoch = run.get("status") or {}, int(run["spec"].get("cancelEpoch", 0))
        phase = phase_of(run)
        if "result" not in status:
            continue
        committed = status.get("committedBy")
        if committed is None:
            violations.append(f"{name}: a result without committedBy")
            continue
        if phase == "Cancelled":
            violations.append(f"{name}: Cancelled, yet holds a result committed by {committed}")
        at = int(committed.get("cancelEpoch", 0))
        if at > epoch:
            violations.append(f"{name}: result committed with cancel epoch {at} > spec.cancelEpoch {epoch}")
        if at >= epoch:
            continue
        passing = [c for c in cancels if c.run == name and c.epoch > at]
        if not passing:
            violations.append(
                f"{name}: spec.cancelEpoch {epoch} > {at} of the commit, raised by nobody known"
            )
            continue
        first = passing[0]
        if first.answer_lost:
            unverifiable.append(f"{name}: the answer to the cancel to epoch {first.epoch} was lost")
        elif first.committed_before != committed:
            violations.append(
                f"{name}: result committed by {committed} after the cancel to epoch {first.epoch} "
                f"(the cancel saw {first.committed_before})"
            )
        if phase != "Succeeded":
            violations.append(f"{name}: the commit came before the cancel, yet the Run is {phase}")
    return violations, unverifiable


def stale_lease_commits(world: World) -> list[str]:
    violations = []
    for name, run in sorted(world.runs.items()):
        status = run.get("status") or {}
        attempts = world.attempts_of(name)
        epochs = [int(a["spec"]["leaseEpoch"]) for a in attempts]
        if any(b <= a for a, b in itertools.pairwise(epochs)):
            violations.append(f"{name}: Attempt lease epochs not increasing: {epochs}")
        committed = status.get("committedBy")
        if "result" not in status or committed is None:
            continue
        by_name = {a["metadata"]["name"]: a for a in attempts}
        attempt = by_name.get(committed.get("attempt"))
        if attempt is None:
            violations.append(f"{name}: committed by {committed.get('attempt')}, which does not exist")
            continue
        if int(attempt["spec"]["leaseEpoch"]) != int(committed.get("leaseEpoch", -1)):
            violations.append(
                f"{name}: committed with lease epoch {committed.get('leaseEpoch')}, "
                f"{attempt['metadata']['name']} held {attempt['spec']['leaseEpoch']}"
            )
        if attempt["spec"]["number"] != status.get("currentAttempt"):
            violations.append(
                f"{name}: committed by {attempt['metadata']['name']}, current Attempt is "
                f"{status.get('currentAttempt')}"
            )
        if int(status.get("leaseEpoch") or 0) != int(committed.get("leaseEpoch", -1)):
            violations.append(
                f"{name}: status.leaseEpoch {status.get('leaseEpoch')} != "
                f"committed {committed.get('leaseEpoch')}"
            )
        if (attempt.get("status") or {}).get("phase") != "Succeeded":
            violations.append(
                f"{name}: the committing {attempt['metadata']['name']} is "
                f"{(attempt.get('status') or {}).get('phase')}, not Succeeded"
            )
    return violations


def _effect_state(effect: Json) -> str:
    return str((effect.get("status") or {}).get("state") or "Pending")


def unknown_not_surfaced(world: World) -> list[str]:
    """Meant for a world where no Attempt runs any more (settled or ended)."""
    violations = []
    unknown_by_run: collections.Counter[str] = collections.Counter()
    for effect in world.effects:
        state, run_name = _effect_state(effect), effect["spec"]["runName"]
        if state not in ("Unknown", "Pending"):
            continue
        unknown_by_run[run_name] += 1
        phase = phase_of(world.runs.get(run_name, {}))
        if phase not in MAY_HOLD_UNKNOWN:
            violations.append(f"{effect['metadata']['name']} ({run_name}): {state}, but the Run is {phase}")
    for name, run in sorted(world.runs.items()):
        if phase_of(run) not in MAY_HOLD_UNKNOWN:
            continue
        counted = int(((run.get("status") or {}).get("sideEffects") or {}).get("unknown") or 0)
        if counted != unknown_by_run[name]:
            violations.append(
                f"{name} ({phase_of(run)}): status.sideEffects.unknown is {counted}, "
                f"{unknown_by_run[name]} SideEffects are Unknown or Pending"
            )
    return violations


def history_lost(world: World, records: Records) -> list[str]:
    violations = []
    checkpoints = {c["spec"]["id"] for c in world.checkpoints}
    sent = {r.key: r for r in records.resumes if r.outcome == "written"}
    for name, run in sorted(world.runs.items()):
        status = run.get("status") or {}
        attempts = world.attempts_of(name)
        numbers = [a["spec"]["number"] for a in attempts]
        if numbers != list(range(1, int(status.get("attempts") or 0) + 1)):
            violations.append(f"{name}: Attempts {numbers}, status.attempts {status.get('attempts')}")
        for attempt in attempts:
            start = attempt["spec"].get("resumeFrom")
            if start and start not in checkpoints:
                violations.append(f"{attempt['metadata']['name']}: resumeFrom {start} no longer exists")
        latest = status.get("latestCheckpoint")
        if latest and latest not in checkpoints:
            violations.append(f"{name}: latestCheckpoint {latest} no longer exists")
        controls = status.get("controls") or []
        accepted = {c["idempotencyKey"] for c in controls if c.get("outcome") == "Accepted"}
        accepted_resumes = [
            c["idempotencyKey"]
            for c in controls
            if c.get("outcome") == "Accepted" and c.get("op") == "Resume"
        ]
        for entry in status.get("inputs") or []:
            if entry.get("idempotencyKey") not in accepted_resumes:
                violations.append(f"{name}: input {entry} has no Accepted Resume in status.controls")
        # status.controls keeps the newest MAX_RECORDED_CONTROLS (the full history is in the Events): only
        # a list below that bound can have lost one.
        if len(controls) < MAX_RECORDED_CONTROLS:
            for key in sorted(records.accepted_seen.get(name, set()) - accepted):
                violations.append(
                    f"{name}: the Accepted control {key} seen earlier is gone from status.controls"
                )
        resumed = [a for a in attempts if str(a["spec"]["reason"]).startswith("resume:")]
        if len(resumed) != len(accepted_resumes):
            violations.append(
                f"{name}: {len(accepted_resumes)} Accepted resumes, "
                f"{len(resumed)} Attempts started by a resume"
            )
        for key, attempt in zip(accepted_resumes, resumed, strict=False):
            record = sent.get(key)
            if record is None:
                violations.append(f"{name}: Accepted resume {key} was never sent")
                continue
            reason = f"resume:{record.request_id}"
            if attempt["spec"]["reason"] != reason or attempt["spec"].get("input") != record.value:
                violations.append(
                    f"{attempt['metadata']['name']}: {attempt['spec']['reason']} with "
                    f"{attempt['spec'].get('input')}, but {key} answered {record.request_id} "
                    f"with {record.value}"
                )
    return violations


def attempts_misrecorded(world: World, inputs: dict[str, Json] | None = None) -> list[str]:
    """History that happened otherwise than it reads: a question asked again after it was answered (the
    ticket agent asks one), an Attempt still going on an ended Run, a retry recorded as 'initial', an
    Attempt failed because its Pod 'disappeared' (nobody deletes a live attempt Pod here)."""
    violations = []
    for name, run in sorted(world.runs.items()):
        controls = (run.get("status") or {}).get("controls") or []
        resumes = sum(1 for c in controls if c.get("op") == "Resume" and c.get("outcome") == "Accepted")
        if resumes > (2 if (inputs or {}).get(name, {}).get("askAfterTicket") else 1):
            violations.append(f"{name}: asked again after its answer ({resumes} answers accepted)")
        ended = phase_of(run) in TERMINAL
        for attempt in world.attempts_of(name):
            label, status = attempt["metadata"]["name"], attempt.get("status") or {}
            if ended and status.get("phase") not in FINISHED_ATTEMPT:
                violations.append(f"{label}: {status.get('phase')} on a {phase_of(run)} Run")
            if attempt["spec"]["number"] > 1 and attempt["spec"]["reason"] == "initial":
                violations.append(f"{label}: a retry recorded as 'initial'")
            if "disappeared" in str((status.get("failure") or {}).get("message")):
                violations.append(f"{label}: failed as 'Pod disappeared'")
    return violations


def results_disagree(
    world: World, tickets: list[Json], inputs: dict[str, Json], only: set[str] | None = None
) -> list[str]:
    """For the ticket Runs (`only`, when given): see the module docstring."""
    by_key = {t["idempotencyKey"]: t for t in tickets}
    violations = []
    for name, run in sorted(world.runs.items()):
        status = run.get("status") or {}
        if phase_of(run) != "Succeeded" or (only is not None and name not in only):
            continue
        result = status.get("result") or {}
        ticket = by_key.get(ticket_key(NS, name))
        if ticket is None or result.get("ticket") != ticket["id"]:
            violations.append(f"{name}: result {result}, the service holds {ticket}")
            continue
        resumed = [a for a in world.attempts_of(name) if str(a["spec"]["reason"]).startswith("resume:")]
        asked = inputs.get(name, {}).get("askPriority", True)
        # with a second question (askAfterTicket), the priority is the first answer
        second = inputs.get(name, {}).get("askAfterTicket")
        answered = (resumed[0] if second else resumed[-1]) if resumed else None
        expected = (answered["spec"].get("input") or {}).get("priority") if answered else None
        if asked and result.get("priority") != expected:
            violations.append(f"{name}: result priority {result.get('priority')}, the answer was {expected}")
        if ticket["title"] != f"[{result.get('priority') or 'normal'}] {inputs.get(name, {}).get('title')}":
            violations.append(f"{name}: ticket title {ticket['title']!r} vs result {result}")
    return violations


# ---- the state store, archives and forks -----------------------------------------------------------------


def archived_objects(archived: dict[str, Json], key: str) -> list[Json]:
    """`key` ("attempts", "sideEffects", ...) of every deleted Run's verified archive."""
    return [item for record in archived.values() for item in (record.get("document") or {}).get(key) or []]


def final_runs(world: World, archived: dict[str, Json]) -> dict[str, Json]:
    """Every Run at the end: those still there, and the deleted ones as their archive holds them."""
    runs = {name: (record.get("document") or {}).get("object") for name, record in archived.items()}
    return {**{n: r for n, r in runs.items() if r}, **world.runs}


def _store_message(message: str) -> bool:
    return "state store" in message or "state blob" in message


def store_faults_permanent(
    world: World, archived: dict[str, Json], tamperings: dict[str, Tampering], untampered: list[str]
) -> list[str]:
    """Attempts failed deterministic, and Runs Failed, because of the store (or StateUnverifiable), other
    than a tampered Run's StateUnverifiable naming its tampered blob; and StateUnverifiable where nobody
    tampered (seen by the harness as it reconciled)."""
    violations = sorted(set(untampered))

    def excused(run: str, message: str) -> bool:
        tampering = tamperings.get(run)
        return bool(tampering and tampering.confirmed and tampering.ref["key"] in message)

    for attempt in [*world.attempts, *archived_objects(archived, "attempts")]:
        failure = (attempt.get("status") or {}).get("failure") or {}
        message, run = str(failure.get("message") or ""), attempt["spec"]["runName"]
        permanent = failure.get("class") == "deterministic"
        about_store = _store_message(message) or failure.get("reason") == "StateUnverifiable"
        if permanent and about_store and not excused(run, message):
            violations.append(f"{attempt['metadata']['name']}: {failure.get('reason')}: {message[:300]}")
    for name, run in sorted(final_runs(world, archived).items()):
        failure = (run.get("status") or {}).get("failure") or {}
        message = str(failure.get("message") or "")
        if phase_of(run) == "Failed" and (
            _store_message(message) or failure.get("reason") == "StateUnverifiable"
        ):
            violations.append(f"{name}: Failed: {failure.get('reason')}: {message[:300]}")
    return violations


def replaced_blobs_not_caught(
    world: World, archived: dict[str, Json], tamperings: dict[str, Tampering]
) -> list[str]:
    """A blob the harness saw changed whose Run never stopped as StateUnverifiable naming it."""
    failed: dict[str, list[str]] = collections.defaultdict(list)
    for attempt in [*world.attempts, *archived_objects(archived, "attempts")]:
        failure = (attempt.get("status") or {}).get("failure") or {}
        if failure.get("reason") == "StateUnverifiable":
            failed[attempt["spec"]["runName"]].append(str(failure.get("message")))
    violations = []
    for victim, tampering in sorted(tamperings.items()):
        if not tampering.confirmed:
            continue
        key = tampering.ref["key"]
        seen = [tampering.caught, *failed.get(victim, [])]
        if not any(key in message for message in seen):
            violations.append(
                f"{victim}: its blob {key} was {tampering.mode}d; never stopped as StateUnverifiable"
            )
    return violations


def state_lost(world: World, archived: dict[str, Json], kinds: dict[str, str]) -> list[str]:
    """Big-state Runs that Succeeded with a result that is not their whole state."""
    full = [state_output(i, int(BIG_STATE["outputBytes"])) for i in range(int(BIG_STATE["steps"]))]
    violations = []
    for name, run in sorted(final_runs(world, archived).items()):
        if kinds.get(name) != "state" or phase_of(run) != "Succeeded":
            continue
        status = run.get("status") or {}
        result = status.get("result") or {}
        attempts = int(status.get("attempts") or 0)
        whole = {
            state_digest({"outputs": full, "fetched": None, "by": f"{name}-a{number}"})
            for number in range(1, attempts + 1)
        }
        if result.get("complete") is not True or result.get("stateDigest") not in whole:
            violations.append(f"{name}: Succeeded with {result} (not its whole state)")
    return violations


def deleted_without_archive(archived: dict[str, Json], ttl: dict[str, int]) -> list[str]:
    violations = []
    for name, record in sorted(archived.items()):
        if name not in ttl:
            violations.append(f"{name}: deleted, though it had no ttlSecondsAfterFinished")
        if "error" in record:
            violations.append(f"{name}: {record['error']}")
            continue
        phase = phase_of(record["document"].get("object") or {})
        if phase not in RUN_TERMINAL:
            violations.append(f"{name}: archived and deleted in phase {phase}")
    return violations


def forks_sent_again(
    world: World, archived: dict[str, Json], audit: list[Json], tickets: list[Json], fork_of: dict[str, str]
) -> list[str]:
    created = collections.Counter(e["idempotencyKey"] for e in audit if e["event"] == "created")
    by_key = {t["idempotencyKey"]: t for t in tickets}
    runs = final_runs(world, archived)
    violations = []
    for fork, source in sorted(fork_of.items()):
        if created[ticket_key(NS, fork)]:
            violations.append(
                f"{fork}: {created[ticket_key(NS, fork)]} tickets created under its own key; "
                f"its source {source} had confirmed its create before the fork point"
            )
        run = runs.get(fork) or {}
        if phase_of(run) == "Succeeded":
            result = (run.get("status") or {}).get("result") or {}
            ticket = by_key.get(ticket_key(NS, source)) or {}
            if result.get("ticket") != ticket.get("id"):
                violations.append(f"{fork}: result {result}, its source's ticket is {ticket.get('id')}")
    return violations


def controls_mishandled(world: World, records: Records) -> list[str]:
    violations = list(records.double_click_applied_twice) + list(records.key_reuse_accepted)
    for name, run in sorted(world.runs.items()):
        keys = collections.Counter(
            c["idempotencyKey"] for c in (run.get("status") or {}).get("controls") or []
        )
        violations += [f"{name}: control {key} recorded {n} times" for key, n in keys.items() if n > 1]
    return violations


# ---- the report ----------------------------------------------------------------------------------------


@dataclass
class Report:
    profile: str
    seed: int
    runs: int
    faults: dict[str, int]
    conditions: dict[str, int]
    violations: dict[str, list[str]]
    unverifiable: list[str]
    figures: dict[str, Any]
    seconds: dict[str, float]
    resolutions: dict[str, Any]  # by (the harness's user name), accepted (by the API server)

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())

    def to_json(self) -> Json:
        return {
            "profile": self.profile,
            "seed": self.seed,
            "runs": self.runs,
            "faults": self.faults,
            "faultsTotal": sum(self.faults.values()),
            "conditions": self.conditions,
            "invariants": {key: len(found) for key, found in self.violations.items()},
            "violations": self.violations,
            "unverifiable": self.unverifiable,
            "figures": self.figures,
            "seconds": self.seconds,
            "resolutions": self.resolutions,
            "ok": self.ok,
        }

    def render(self) -> str:
        lines = [
            f"chaos report: profile {self.profile}, seed {self.seed}, {self.runs} Runs, "
            f"{sum(self.faults.values())} faults; fault window {self.seconds['window']:.0f}s, "
            f"total {self.seconds['total']:.0f}s",
            "faults injected, by kind:",
            *(f"  {kind:<34} {count:>5}" for kind, count in sorted(self.faults.items())),
            "conditions of the ticket service (not counted as faults): "
            + ", ".join(f"{k} x{v}" for k, v in sorted(self.conditions.items())),
            "figures:",
            *(f"  {key:<52} {value}" for key, value in self.figures.items()),
            "invariants (each must be 0):",
            *(f"  {label:<60} {len(self.violations[key]):>3}" for key, label in INVARIANTS),
        ]
        if self.unverifiable:
            lines += ["not verifiable (a lost answer; not counted):", *(f"  {u}" for u in self.unverifiable)]
        for key, label in INVARIANTS:
            if self.violations[key]:
                lines += [f"VIOLATIONS: {label}:", *(f"  - {v}" for v in self.violations[key][:40])]
        lines.append("chaos: OK, no invariant violated" if self.ok else "chaos: FAILED, invariants violated")
        return "\n".join(lines)


def build_report(
    chaos: Chaos,
    *,
    settled: World,
    final: World,
    archived: dict[str, Json],
    audit: list[Json],
    stuck_after_faults: list[str],
    stuck_after_resolution: list[str],
    window_seconds: float,
) -> Report:
    records = chaos.records
    tickets = chaos.tickets.tickets()
    # The Runs at the end with their objects, the deleted ones as their archives hold them: the promises
    # about a Run's history hold for both.
    whole = World(
        runs=final_runs(final, archived),
        attempts=[*final.attempts, *archived_objects(archived, "attempts")],
        checkpoints=[*final.checkpoints, *archived_objects(archived, "checkpoints")],
        effects=[*final.effects, *archived_objects(archived, "sideEffects")],
        hostile=final.hostile,
        stored=final.stored,
    )
    after_cancel, unverifiable = results_after_cancel(whole, records.cancels)
    stuck = [f"{n}: {phase_of(settled.runs.get(n, {}))} after the faults" for n in stuck_after_faults]
    stuck += [f"{n}: {phase_of(final.runs.get(n, {}))} after the resolution" for n in stuck_after_resolution]
    violations = {
        "tickets_created_twice": tickets_created_twice(audit),
        "tickets_closed_twice": tickets_closed_twice(audit),
        "effects_pending_on_terminal": effects_pending_on_terminal(whole),
        "results_after_cancel": after_cancel,
        "stale_lease_commits": stale_lease_commits(whole),
        "stuck_runs": stuck,
        "unknown_not_surfaced": [f"after the faults: {v}" for v in unknown_not_surfaced(settled)]
        + [f"at the end: {v}" for v in unknown_not_surfaced(final)],
        "forged_writes_accepted": forged_writes(final)[1],
        "history_lost": history_lost(whole, records),
        "referenced_blobs_deleted": referenced_blobs_deleted(whole, archived),
        "store_faults_permanent": store_faults_permanent(
            final, archived, records.tamperings, records.unverifiable_untampered
        ),
        "replaced_blobs_not_caught": replaced_blobs_not_caught(final, archived, records.tamperings),
        "state_lost": state_lost(final, archived, chaos.kind),
        "deleted_without_archive": deleted_without_archive(archived, chaos.ttl),
        "forks_sent_again": forks_sent_again(final, archived, audit, tickets, chaos.fork_of),
        "results_disagree": results_disagree(
            whole, tickets, chaos.spec_of, only={n for n, k in chaos.kind.items() if k == "ticket"}
        ),
        "controls_mishandled": controls_mishandled(whole, records),
        "attempts_misrecorded": attempts_misrecorded(whole, chaos.spec_of),
    }
    every_run = whole.runs
    changed = [t for t in records.tamperings.values() if t.confirmed]
    forks = {n: every_run.get(n, {}) for n in chaos.fork_of}
    inherited = sum(1 for r in forks.values() if ((r.get("status") or {}).get("fork") or {}).get("inherited"))
    attempt_phases = collections.Counter(str((a.get("status") or {}).get("phase")) for a in final.attempts)
    rejected = collections.Counter(
        str(a["status"]["rejectedCommit"].get("reason"))
        for a in final.attempts
        if (a.get("status") or {}).get("rejectedCommit")
    )
    reasons = collections.Counter(str(a["spec"]["reason"]).split(":")[0] for a in final.attempts)
    events = collections.Counter(e["event"] for e in audit)
    judged = collections.Counter(
        f"{c.get('op')} {c.get('outcome')} {c.get('reason')}"
        for run in final.runs.values()
        for c in (run.get("status") or {}).get("controls") or []
    )
    figures: dict[str, Any] = {
        "Runs after the faults": dict(collections.Counter(phase_of(r) for r in settled.runs.values())),
        "Runs at the end (Deleted: archived and deleted after their TTL)": {
            **collections.Counter(phase_of(r) for r in final.runs.values()),
            **({DELETED: len(archived)} if archived else {}),
        },
        "Attempts": len(final.attempts),
        "Attempts by reason": dict(reasons),
        "Attempts by phase": dict(attempt_phases),
        "late writes refused by the fences (rejectedCommit)": dict(rejected),
        "tickets created / creates replayed by key / closed": (
            f"{events['created']} / {events['replayed']} / {events['closed']}"
        ),
        "NeedsReconciliation after the faults": sum(
            1 for r in settled.runs.values() if phase_of(r) == "NeedsReconciliation"
        ),
        "SideEffects resolved by the harness / retries asked": (
            f"{records.resolutions} / {records.retries_requested}"
        ),
        "cancels written / refused by the API server": f"{len(records.cancels)} / {records.cancels_refused}",
        "cancels too late (the commit came first, the Run Succeeded)": sum(
            1
            for r in final.runs.values()
            if phase_of(r) == "Succeeded"
            and int((r["status"].get("committedBy") or {}).get("cancelEpoch", 0))
            < int(r["spec"].get("cancelEpoch", 0))
        ),
        "resumes written / refused by the API server": (
            f"{sum(r.outcome == 'written' for r in records.resumes)} / "
            f"{sum(r.outcome == 'refused' for r in records.resumes)}"
        ),
        "control requests judged by the operator (op outcome reason)": dict(sorted(judged.items())),
        "answers given as a person would (not faults)": records.answers,
        "Runs Failed, by failure class and reason": dict(
            collections.Counter(
                f"{(r['status'].get('failure') or {}).get('class')} "
                f"{(r['status'].get('failure') or {}).get('reason')}"
                for r in final.runs.values()
                if phase_of(r) == "Failed"
            )
        ),
        "forged writes attempted by hostile agents / their Runs ended": (
            f"{forged_writes(final)[0]} / "
            f"{sum(1 for r in final.hostile.values() if phase_of(r) in TERMINAL)} of {len(records.hostile)}"
        ),
        "Runs by kind (ticket, big-state, fork)": dict(collections.Counter(chaos.kind.values())),
        "the store's proxy (requests, answered 503, delayed, trapped...)": dict(
            sorted(chaos.proxy_().counts.items())
        ),
        "blobs overwritten by hostile agents: changed / caught (StateUnverifiable) / then Succeeded": (
            f"{len(changed)} / {len(changed) - len(violations['replaced_blobs_not_caught'])} / "
            f"{sum(1 for t in changed if phase_of(every_run.get(t.victim, {})) == 'Succeeded')}"
        ),
        "big-state Runs Succeeded with their whole state": sum(
            1 for n, r in every_run.items() if chaos.kind.get(n) == "state" and phase_of(r) == "Succeeded"
        )
        - len(violations["state_lost"]),
        "forks: launched / Succeeded / inherited the confirmed create": (
            f"{len(forks)} / {sum(1 for r in forks.values() if phase_of(r) == 'Succeeded')} / {inherited}"
        ),
        "Runs with a TTL / archived and deleted / their archives verified": (
            f"{len(chaos.ttl)} / {len(archived)} / {sum(1 for r in archived.values() if 'document' in r)}"
        ),
        "operator killed after an archive's index entry, before the delete": len(records.archive_traps_fired),
        "operator starts": records.operator_starts,
        "kube-apiserver restarts (seconds each)": [round(s, 1) for s in records.apiserver_restarts],
    }
    return Report(
        profile="",
        seed=chaos.seed,
        runs=len(chaos.launched),
        faults=dict(records.faults),
        conditions=dict(records.conditions),
        violations=violations,
        unverifiable=unverifiable,
        figures=figures,
        seconds={"window": window_seconds, "total": chaos.elapsed()},
        resolutions={"by": chaos.user, "accepted": records.resolutions},
    )


# ---- main ----------------------------------------------------------------------------------------------


def summary(report: Report, argv: list[str]) -> str:
    """The printed report as a Markdown page (bench/CHAOS.md), with what produced it."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    commit = subprocess.run(
        ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, check=False
    ).stdout.strip()
    load = os.getloadavg()
    return "\n".join(
        [
            "# agentrun chaos run",
            "",
            f"Generated on {when} by `bench/chaos.py {' '.join(argv)}` (`make chaos`), agentrun {commit}, "
            f"on a {os.cpu_count()}-core machine shared with other engineers' test runs (1-min load at "
            f"the end: {load[0]:.1f}). What each fault and each invariant means: the docstring of "
            "`bench/chaos.py`. Raw figures: `bench/chaos.json`.",
            "",
            "```",
            report.render(),
            "```",
            "",
        ]
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", choices=sorted(PROFILES), default="small")
    parser.add_argument("--runs", type=int, help="Runs launched in all (default: the profile's)")
    parser.add_argument("--faults", type=int, help="faults to inject, at most (default: the profile's)")
    parser.add_argument("--seconds", type=float, help="the fault window, at most (default: the profile's)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--state-dir", type=Path, help="default: a temporary directory, removed unless kept")
    parser.add_argument("--keep", action="store_true", help="keep the state directory (logs) in any case")
    parser.add_argument("--report", type=Path, help="also write the report as JSON here")
    parser.add_argument("--summary", type=Path, help="also write the printed report here, as Markdown")
    return parser.parse_args(argv)


def _stop_on_sigterm(signum: int, _: object) -> None:
    # As for Ctrl-C: unwind, so that tear-down continues frozen processes and stops everything started.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    profile = PROFILES[args.profile]
    overrides = {
        k: v for k, v in (("runs", args.runs), ("faults", args.faults), ("seconds", args.seconds)) if v
    }
    profile = replace(profile, **overrides)
    profile = replace(profile, concurrency=min(profile.concurrency, profile.runs))
    profile = replace(profile, min_faults=min(profile.min_faults, profile.faults))
    temporary = args.state_dir is None
    state_dir = args.state_dir or Path(tempfile.mkdtemp(prefix="agentrun-chaos-"))
    state_dir.mkdir(parents=True, exist_ok=True)

    def say(line: str) -> None:
        print(line, flush=True)

    chaos = Chaos(profile, args.seed, state_dir.resolve(), say)
    report: Report | None = None
    try:
        report = chaos.run()
        report.profile = args.profile
    except (HarnessError, ApiError, AnswerLost, urllib.error.URLError, OSError) as exc:
        say(f"chaos: the harness could not finish: {type(exc).__name__}: {exc}")
        if chaos.operator is not None:
            say(f"operator log tail:\n{chaos.operator.log_tail()}")
    finally:
        chaos.teardown()
    keep = args.keep or report is None or not report.ok
    if report is not None:
        say(report.render())
        if args.report:
            args.report.write_text(json.dumps(report.to_json(), indent=2) + "\n")
        if args.summary:
            args.summary.write_text(summary(report, argv if argv is not None else sys.argv[1:]))
    if keep:
        say(f"chaos: logs and state kept in {state_dir}")
    elif temporary:
        shutil.rmtree(state_dir, ignore_errors=True)
    if report is None:
        return 2
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
