"""The worker's side of the protocol: lease renewals, the cancel watch, fenced writes, checkpoints.

Every write that changes official Run state goes through `fenced_status_write`: check the fence (cancel
epoch, lease epoch) on the newest Run seen (the cancel watch's, or the answer of our last write), write
with its resourceVersion. Uncontended that is one request; a 409 means the Run changed in between, so
check again on the newer Run (the watch's, else a read). The API server checks the same fence on the
stored object atomically (the CRD's CEL rule, the admission policies), and its refusals name their
cause, so a refused write is classified without a read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from agentrun import kubewatch
from agentrun.api import (
    API_VERSION,
    RUN_LABEL,
    Attempt,
    Checkpoint,
    CheckpointKind,
    Run,
    SdkRead,
    Usage,
    lease_name,
)
from agentrun.api.budgets import CHECKPOINT_STATE_BUDGET, RESULT_BUDGET, over_budget
from agentrun.api.causes import RefusalCause
from agentrun.core.fence import fence_violation, refusal_cause
from agentrun.core.ledger import foreign_record
from agentrun.kubeapi import ApiError, KubeApi
from agentrun.statestore import BlobStore
from agentrun.tracing import Tracing
from agentrun.worker.blobs import RunBlobs, fits_inline
from agentrun.worker.clock import Clock, SystemClock, timestamp
from agentrun.worker.errors import FenceRejected, LeaseLost, PermanentError, StateUnverifiable
from agentrun.worker.identity import Identity
from agentrun.worker.progress import Progress

log = logging.getLogger("agentrun.worker")
JsonDict = dict[str, Any]
MAX_CONFLICTS = 20
# How long to wait for the cancel watch to deliver a Run (its first, or a newer one after a 409) before
# reading it instead: a fallback, the watch normally answers within milliseconds.
WATCH_PATIENCE_SECONDS = 5.0
# A failed lease renewal is tried again this soon, then twice as late each time (keep_lease).
RENEWAL_RETRY_SECONDS = 1.0
# The server-side timeout of the Run watch (watch_cancel): each ends one watch request and starts the next
# from the last resourceVersion (bookmarks keep it recent), so an idle running attempt costs the API server
# one request per this many seconds beside its renewals (docs/performance.md, "Leases"). A connection that
# dies silently is noticed this long (+30 s) after its last byte (a cancel does not wait for it: the
# operator stops the Pod).
RUN_WATCH_TIMEOUT_SECONDS = 600
STATE_ADVICE = (
    "configure the agent-state store (AGENTRUN_STATE_STORE_URL) so that large state goes there, or store "
    "large data elsewhere and checkpoint a reference to it"
)
RESULT_ADVICE = (
    "configure the agent-state store (AGENTRUN_STATE_STORE_URL) so that a large result goes there, or "
    "store large data elsewhere and return a reference to it (a URI and a digest)"
)


def refuse_over_budget(what: str, value: Any, budget: int, advice: str) -> None:
    """Refuses, before anything is sent, a free-form value over its byte budget (agentrun.api.budgets):
    the API server would store the object only to have etcd refuse it, as an apparent outage."""
    if reason := over_budget(what, value, budget, advice):
        raise PermanentError(reason)


class Session:
    def __init__(
        self, api: KubeApi, me: Identity, clock: Clock | None = None, state_store: BlobStore | None = None
    ) -> None:
        """clock: the one the whole Attempt reads (the machine's unless given: a test passes a fake).
        state_store: where values over the inline threshold go (worker.blobs); None keeps all inline."""
        self.api = api
        self.me = me
        self.state_store = state_store
        self.clock: Clock = clock or SystemClock()
        self.run_path = api.custom_path("runs", me.namespace, me.run)
        self.lease_path = api.lease_path(me.namespace, lease_name(me.run))
        self.run: Run | None = None
        self.lost = asyncio.Event()  # the lease is gone: stop writing
        self.cancelled = asyncio.Event()  # spec.cancelEpoch grew past ours
        # SIGTERM: the Pod is being deleted (by the operator's stop, a person, an eviction or a drain)
        self.terminating = asyncio.Event()
        # The operator passes the Lease's resourceVersion as it wrote it (a Pod annotation): the first
        # renewal needs no read.
        self._lease_rv: str | None = me.lease_resource_version
        self.tracing = Tracing("agentrun-worker", env={})  # off; worker.main turns it on from the env
        # The newest Run the watch delivered (the step boundaries read spec.pause from it, the hold
        # waits on it), and an event set at every change.
        self.observed: Run | None = None
        self.changed = asyncio.Event()
        # The agent's liveness (spec.progressTimeoutSeconds, set once the Run is read): a stalled agent's
        # lease is no longer renewed.
        self.progress = Progress(self.clock)
        # The Run's ledger position (the highest SideEffect.spec.ledgerSequence), read once per Attempt
        # and counted on from there: each new record takes the next, each Checkpoint records it as its
        # ledgerMark, so a fork knows exactly which records precede a checkpoint.
        self._ledger_position: int | None = None
        self._ledger_lock = asyncio.Lock()

    async def read_run(self) -> Run:
        body = await self.api.get(self.run_path)
        if body is None:
            raise LeaseLost(f"Run {self.me.run} no longer exists")
        self.run = Run.model_validate(body)
        self.observe(self.run)
        return self.run

    async def first_run(self) -> Run:
        """The Run as the cancel watch's first event carries it (no read), once `watch_cancel` runs; a
        read if the watch has delivered nothing in time (a Run that no longer exists sends nothing)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), WATCH_PATIENCE_SECONDS)
        if self.observed is None or self.behind(self.observed):
            return await self.read_run()
        self.run = self.observed
        return self.run

    async def read_attempt(self) -> Attempt:
        """This worker's Attempt: read only when its spec carries what the Pod's annotations cannot (an
        input value), or when the Pod has no annotations for it (made by an older operator)."""
        me = self.me
        if me.attempt_reason is not None and not me.attempt_input:
            return Attempt.model_validate(
                {
                    "metadata": {"name": me.attempt, "namespace": me.namespace},
                    "spec": {
                        "runName": me.run,
                        "number": me.attempt_number,
                        "leaseEpoch": me.lease_epoch,
                        "cancelEpoch": me.cancel_epoch,
                        "resumeFrom": me.resume_from,
                        "reason": me.attempt_reason,
                    },
                }
            )
        body = await self.api.get(self.api.custom_path("attempts", self.me.namespace, self.me.attempt))
        if body is None:
            raise LeaseLost(f"Attempt {self.me.attempt} does not exist")
        return Attempt.model_validate(body)

    async def read_attempts(self) -> list[Attempt]:
        """Every Attempt of this worker's Run (their specs: what each was started with)."""
        collection = self.api.custom_path("attempts", self.me.namespace)
        return [
            Attempt.model_validate(item)
            async for page in self.api.list_pages(collection, label_selector=f"{RUN_LABEL}={self.me.run}")
            for item in page
        ]

    async def owned_metadata(self, name: str) -> JsonDict:
        """Metadata of an object this worker creates for its Run: the run label and the Run as owner."""
        run = self.run or await self.read_run()
        owner = {"apiVersion": API_VERSION, "kind": "Run", "name": self.me.run, "uid": run.metadata.uid}
        return {
            "name": name,
            "namespace": self.me.namespace,
            "labels": {RUN_LABEL: self.me.run},
            "ownerReferences": [{**owner, "blockOwnerDeletion": True}],
        }

    async def check_own(self, record: JsonDict) -> None:
        """A Checkpoint or SideEffect found by name must be this Run's (spec.runName and owner UID):
        anyone with create rights may have made one first; it is refused, never adopted."""
        run = self.run or await self.read_run()
        if reason := foreign_record(record, self.me.run, run.metadata.uid):
            raise PermanentError(f"{reason}; delete it, then retry the Run")

    # ---- fenced writes -------------------------------------------------------------------------------

    async def fenced_status_write(self, patch: JsonDict, what: str) -> Run:
        """Checks the fence on the newest Run seen and writes with its resourceVersion (one request).

        The epochs of a stored Run only grow, so a fence this worker fails on any version of the Run
        newer than its Pod stays failed: no read is needed to reject. A 409 means the Run changed since
        that version: the check is made again on the newer Run the watch delivers (else a read), and the
        write tried again."""
        run = self.observed or self.run or await self.read_run()
        for conflicts in range(MAX_CONFLICTS):
            if self.behind(run):
                run = await self.read_run()  # a version from before this Attempt's grant: never judged on
            if reason := fence_violation(run, self.me.lease_epoch, self.me.cancel_epoch):
                message = (
                    f"{what} refused: this worker holds lease epoch {self.me.lease_epoch} and cancel epoch "
                    f"{self.me.cancel_epoch}; the Run has {run.status.lease_epoch} and "
                    f"{run.spec.cancel_epoch}"
                )
                await self.record_rejection(reason.value, message)
                raise FenceRejected(reason.value, message)
            body = {"metadata": {"resourceVersion": run.metadata.resource_version}, "status": patch}
            try:
                written = await self.api.merge_patch(f"{self.run_path}/status", body)
            except ApiError as exc:
                if exc.conflict:  # the Run changed in between: check again on the newer one
                    run = await self.newer_run(run) if conflicts == 0 else await self.read_run()
                    continue
                # A fence the API server holds (the admission policies, the CRD's own rule on
                # committedBy) names its cause: the epochs moved under us.
                await self.raise_refusal(exc, what)
                raise
            self.run = Run.model_validate(written)
            self.observe(self.run)
            return self.run
        raise ApiError(409, "Conflict", f"{what}: gave up after {MAX_CONFLICTS} conflicting writes")

    def behind(self, run: Run) -> bool:
        """`run` is older than this Attempt's grant (an epoch below the worker's): a fence judged on it
        would say nothing about the Run now. The watch and the answers of writes never serve one; a
        read is the answer if ever one comes."""
        me = self.me
        return run.spec.cancel_epoch < me.cancel_epoch or (run.status.lease_epoch or 0) < me.lease_epoch

    async def newer_run(self, than: Run) -> Run:
        """A version of the Run newer than `than`: the watch's, when it delivers one in time, else read."""
        deadline = self.clock.monotonic() + WATCH_PATIENCE_SECONDS
        while self.observed is None or _rv(self.observed) <= _rv(than):
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                return await self.read_run()
            self.changed.clear()
            if self.observed is not None and _rv(self.observed) > _rv(than):
                break
            await self.next_change(remaining)
        assert self.observed is not None
        return self.observed

    async def raise_refusal(self, exc: ApiError, what: str) -> None:
        """A write the admission policies refused: a lost fence (recorded on the Attempt, then
        FenceRejected) or a write this worker may never make (PermanentError). Returns if the refusal
        names no cause."""
        if exc.status not in (403, 422) or (found := refusal_cause(exc.message)) is None:
            return
        cause, reason = found
        if reason is None:
            raise PermanentError(f"{what} refused by the API server ({cause}): {exc.message}") from None
        await self.record_rejection(reason.value, exc.message)
        raise FenceRejected(reason.value, exc.message) from None

    async def record_rejection(self, reason: str, message: str) -> None:
        """Records the refused commit on this worker's Attempt (the operator then marks it Rejected)."""
        with self.tracing.span("rejected commit", {"agentrun.reason": reason, "agentrun.message": message}):
            await self._record_rejection(reason, message)

    async def _record_rejection(self, reason: str, message: str) -> None:
        path = self.api.custom_path("attempts", self.me.namespace, self.me.attempt, "status")
        patch = {
            "status": {
                "rejectedCommit": {"reason": reason, "message": message[:1024], "time": timestamp(self.clock)}
            }
        }
        try:
            await self.api.merge_patch(path, patch)
        except ApiError as exc:  # the record is for people; the refusal itself already happened
            log.warning("could not record the rejected commit on %s: %s", self.me.attempt, exc)

    async def commit(self, result: JsonDict) -> None:
        """Writes the result (inline, or its reference in the store when it is over the inline
        threshold) with committedBy: one fenced write."""
        inline, ref = await self.stored_value("the result", result, RESULT_BUDGET, RESULT_ADVICE)
        committed_by = {
            "attempt": self.me.attempt,
            "leaseEpoch": self.me.lease_epoch,
            "cancelEpoch": self.me.cancel_epoch,
        }
        patch: JsonDict = {"committedBy": committed_by}
        patch.update({"resultRef": ref} if ref is not None else {"result": inline})
        await self.fenced_status_write(patch, "result commit")

    # ---- values in the state store ------------------------------------------------------------------

    async def run_blobs(self) -> RunBlobs | None:
        """This Run's blobs in the state store, or None when no store is configured."""
        if self.state_store is None:
            return None
        run = self.run or await self.read_run()
        return RunBlobs(self.state_store, self.me.namespace, str(run.metadata.uid or self.me.run))

    async def stored_value(
        self, what: str, value: Any, budget: int, advice: str
    ) -> tuple[Any, JsonDict | None]:
        """(value, None) to keep inline, or (None, its reference) once put in the store: a value over the
        inline threshold goes to the store when one is configured; without one, a value over its byte
        budget is refused before anything is sent."""
        blobs = await self.run_blobs()
        if blobs is None or fits_inline(value):
            refuse_over_budget(what, value, budget, advice)
            return value, None
        return None, await blobs.put(value)

    async def value_of(self, inline: Any, ref: Any, what: str) -> Any:
        """The value an object records: inline, or read from the store and verified (StateUnverifiable
        when the blob is missing or changed, or when no store is configured to read it from)."""
        if ref is None:
            return inline
        reference = ref.to_api() if hasattr(ref, "to_api") else dict(ref)
        blobs = await self.run_blobs()
        if blobs is None:
            raise StateUnverifiable(
                f"{what} is in the state store ({reference.get('key')}), but this Pod has no state store "
                "configured (AGENTRUN_STATE_STORE_URL)",
                key=str(reference.get("key", "")),
            )
        return await blobs.get(reference)

    async def checkpoint_state(self, checkpoint: Checkpoint) -> Any:
        """ctx.state as the Checkpoint saved it: inline, or its blob read and verified."""
        spec = checkpoint.spec
        return await self.value_of(spec.state, spec.state_ref, f"checkpoint {spec.id}")

    async def state_what_it_reads(self) -> None:
        """States on this worker's Attempt, before it reads any state, that this SDK reads values in the
        state store by reference (status.sdkReads): the operator gives a Run whose state may be there
        only to Attempts that state it (an SDK that predates the store states nothing). Sent when the
        Pod was started so (AGENTRUN_NAMESPACE_WITH_REFS) or may write references (a store configured);
        an Attempt that is gone is a lost lease."""
        if not (self.me.state_in_store or self.state_store is not None):
            return
        path = self.api.custom_path("attempts", self.me.namespace, self.me.attempt, "status")
        try:
            await self.api.merge_patch(path, {"status": {"sdkReads": [SdkRead.BLOB_REFS.value]}})
        except ApiError as exc:
            if exc.status == 404:
                raise LeaseLost(f"Attempt {self.me.attempt} does not exist") from None
            raise

    async def write_usage(self, usage: Usage) -> None:
        """This Attempt's usage totals (absolute values: a repeated write changes nothing)."""
        path = self.api.custom_path("attempts", self.me.namespace, self.me.attempt, "status")
        await self.api.merge_patch(path, {"status": {"usage": usage.to_status()}})

    # ---- the ledger's position ---------------------------------------------------------------------

    async def ledger_position(self) -> int:
        """The highest ledgerSequence among the Run's SideEffects (0: none): read once, then counted."""
        async with self._ledger_lock:
            if self._ledger_position is None:
                self._ledger_position = await self._read_ledger_position()
            return self._ledger_position

    async def next_ledger_sequence(self) -> int:
        """The sequence a new SideEffect record of this Run takes (one Attempt writes at a time)."""
        await self.ledger_position()
        async with self._ledger_lock:
            assert self._ledger_position is not None
            self._ledger_position += 1
            return self._ledger_position

    async def _read_ledger_position(self) -> int:
        run = self.run or await self.read_run()
        if self.me.attempt_number == 1 and run.spec.fork_from is None:
            return 0  # a Run's first Attempt, not a fork's: no record can precede it
        collection = self.api.custom_path("sideeffects", self.me.namespace)
        highest = 0
        async for page in self.api.list_pages(collection, label_selector=f"{RUN_LABEL}={self.me.run}"):
            for item in page:
                if (item.get("spec") or {}).get("runName") == self.me.run:
                    highest = max(highest, int((item.get("spec") or {}).get("ledgerSequence") or 0))
        return highest

    # ---- checkpoints -------------------------------------------------------------------------------

    async def read_journal(self, name: str) -> Checkpoint | None:
        body = await self.api.get(self.api.custom_path("checkpoints", self.me.namespace, name))
        return Checkpoint.model_validate(body) if body is not None else None

    async def save_journal(
        self, name: str, step: str, value: Any, index: int, parent: Checkpoint | None
    ) -> bool:
        """Records a step's result as one immutable Journal Checkpoint; never moves latestCheckpoint (no
        Run write, no fence: a step is side-effect-free, and a replaying reader checks the epochs). False
        when the entry existed already (written by an earlier Attempt for the same key)."""
        inline, ref = await self.stored_value(
            f"the result of step {step!r}", {"result": value}, CHECKPOINT_STATE_BUDGET, STATE_ADVICE
        )
        spec: JsonDict = {
            "runName": self.me.run,
            "id": name,
            "sequence": parent.spec.sequence if parent else 0,
            "attempt": self.me.attempt,
            "leaseEpoch": self.me.lease_epoch,
            "step": step,
            "kind": CheckpointKind.JOURNAL.value,
            # the call index stays inline (a replay matches on it); the result goes to the store if large
            "state": {**(inline or {}), "call": index},
        }
        if ref is not None:
            spec["stateRef"] = ref
        if parent:
            spec["parent"] = parent.spec.id
        body = {
            "apiVersion": API_VERSION,
            "kind": "Checkpoint",
            "metadata": await self.owned_metadata(name),
            "spec": spec,
        }
        try:
            await self.api.create(self.api.custom_path("checkpoints", self.me.namespace), body)
        except ApiError as exc:
            if exc.conflict:
                return False
            await self.raise_refusal(exc, f"journal entry {name}")
            raise
        return True

    async def load_checkpoint(self, checkpoint_id: str) -> Checkpoint:
        body = await self.api.get(self.api.custom_path("checkpoints", self.me.namespace, checkpoint_id))
        if body is None:
            raise LeaseLost(f"checkpoint {checkpoint_id} to resume from does not exist")
        await self.check_own(body)
        return Checkpoint.model_validate(body)

    async def save_checkpoint(self, state: Any, step: str | None, parent: Checkpoint | None) -> Checkpoint:
        """Creates the immutable Checkpoint, then moves status.latestCheckpoint to it (fenced)."""
        with self.tracing.span("checkpoint", {"agentrun.step": step or ""}):
            return await self._save_checkpoint(state, step, parent)

    async def _save_checkpoint(self, state: Any, step: str | None, parent: Checkpoint | None) -> Checkpoint:
        inline, ref = await self.stored_value(
            "the checkpoint state", state, CHECKPOINT_STATE_BUDGET, STATE_ADVICE
        )
        sequence = parent.spec.sequence + 1 if parent else 1
        checkpoint_id = f"{self.me.attempt}-s{sequence}"
        body: JsonDict = {
            "apiVersion": API_VERSION,
            "kind": "Checkpoint",
            "metadata": await self.owned_metadata(checkpoint_id),
            "spec": {
                "runName": self.me.run,
                "id": checkpoint_id,
                "sequence": sequence,
                "attempt": self.me.attempt,
                "leaseEpoch": self.me.lease_epoch,
                "ledgerMark": await self.ledger_position(),
            },
        }
        if ref is not None:
            body["spec"]["stateRef"] = ref
        else:
            body["spec"]["state"] = inline
        if parent:
            body["spec"]["parent"] = parent.spec.id
        if step:
            body["spec"]["step"] = step
        try:
            created = await self.api.create(self.api.custom_path("checkpoints", self.me.namespace), body)
        except ApiError as exc:
            if not exc.conflict:
                raise
            existing = await self.api.get(
                self.api.custom_path("checkpoints", self.me.namespace, checkpoint_id)
            )
            assert existing is not None
            await self.check_own(existing)  # our own earlier create (a lost answer), or a squatter
            created = existing
        await self.fenced_status_write({"latestCheckpoint": checkpoint_id}, f"checkpoint {checkpoint_id}")
        return Checkpoint.model_validate(created)

    # ---- the lease ----------------------------------------------------------------------------------

    async def renew_once(self) -> None:
        """One renewal, preconditioned on the resourceVersion we last wrote or read."""
        for _ in range(3):
            if self._lease_rv is None:
                lease = await self.api.get(self.lease_path)
                spec = (lease or {}).get("spec") or {}
                if (
                    spec.get("holderIdentity") != self.me.attempt
                    or spec.get("leaseTransitions") != self.me.lease_epoch
                ):
                    holder = spec.get("holderIdentity")
                    raise LeaseLost(
                        f"the Run's lease is held by {holder!r} (epoch {spec.get('leaseTransitions')})"
                    )
                assert lease is not None
                self._lease_rv = lease["metadata"]["resourceVersion"]
            patch = {
                "metadata": {"resourceVersion": self._lease_rv},
                "spec": {"renewTime": timestamp(self.clock, micro=True)},
            }
            try:
                renewed = await self.api.merge_patch(self.lease_path, patch)
            except ApiError as exc:
                if exc.conflict:
                    self._lease_rv = None  # re-read: maybe ours, maybe taken over
                    continue
                if exc.status == 403 and RefusalCause.of(exc.message) == RefusalCause.NOT_CURRENT_ATTEMPT:
                    raise LeaseLost(exc.message) from None  # the policy: another Pod holds it now
                raise
            self._lease_rv = renewed["metadata"]["resourceVersion"]
            return
        raise LeaseLost("the lease kept changing under this worker")

    async def keep_lease(self, renew_seconds: float, duration_seconds: float) -> None:
        """Renews until the lease is lost, or its agent stalled (spec.progressTimeoutSeconds); a worker
        that cannot renew for a whole duration stops itself.

        The first renewal comes renew_seconds from now: the operator has just written the Lease for this
        Attempt (and passed its resourceVersion), so a renewal at start would cost a Lease write and an
        operator reconcile for nothing. Until then the fences keep a worker whose lease was taken over
        harmless: every write that changes official state is refused.

        A renewal that fails (no answer, a refusal that is not a lost lease) is tried again soon, 1 s
        later, then 2, 4, ... (never later than the next renewal would be, nor past the lease's end):
        the renewals are sparse (spec.lease: one a minute by default, for what 1,000 idle attempts cost
        the API server), so one lost request must not cost the lease."""
        last_renewal = self.clock.monotonic()
        wait, retry = float(renew_seconds), RENEWAL_RETRY_SECONDS
        while True:
            await self.clock.sleep(wait)
            if self.progress.stalled:  # its agent is stuck: the lease runs out, the operator takes over
                log.warning("the agent shows no progress: the lease is no longer renewed")
                return
            try:
                await self.renew_once()
                last_renewal = self.clock.monotonic()
                wait, retry = float(renew_seconds), RENEWAL_RETRY_SECONDS
            except LeaseLost as exc:
                log.warning("lease lost: %s", exc)
                self.lost.set()
                return
            except Exception as exc:
                left = duration_seconds - (self.clock.monotonic() - last_renewal)
                if left <= 0:
                    log.warning("lease renewal failed: %s; not renewed for %ss: lost", exc, duration_seconds)
                    self.lost.set()
                    return
                wait = min(retry, float(renew_seconds), left)
                retry *= 2
                log.warning("lease renewal failed: %s; again in %.0fs", exc, wait)

    async def watch_cancel(self) -> None:
        """Watches the Run (agentrun.kubewatch, without a list: the watch's first event carries the Run):
        keeps `observed` current, sets `changed` at every change, and sets `cancelled` as soon as
        spec.cancelEpoch grows past this worker's. A reconnect continues from the last resourceVersion
        seen, so no change is skipped (unless the server expired it: 410, then from the current state)."""
        collection = self.api.custom_path("runs", self.me.namespace)
        async for item in kubewatch.reflect(
            self.api,
            collection,
            name=self.me.run,
            list_first=False,
            timeout_seconds=RUN_WATCH_TIMEOUT_SECONDS,
            clock=self.clock,
        ):
            if isinstance(item, kubewatch.Event) and item.type != "DELETED":
                self.observe(Run.model_validate(item.object))
            if self.cancelled.is_set():
                return

    def observe(self, run: Run) -> None:
        """A newer Run than the one observed so far (by the watch or a read)."""
        if self.observed is not None and _rv(run) < _rv(self.observed):
            return
        self.observed = run
        if run.spec.cancel_epoch > self.me.cancel_epoch:
            self.cancelled.set()
        self.changed.set()

    async def next_change(self, seconds: float) -> None:
        """Waits (at most `seconds`) for a change of the Run since `changed` was last cleared."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), seconds)

    async def release_hold(self, request_id: str) -> Run | None:
        """Ends this worker's hold of `request_id`: clears pendingRequest.heldBy, preconditioned on the
        newest Run seen. Returns the Run written, or None when the Run changed first (the operator may
        have accepted an answer: the caller looks again)."""
        run = self.observed if self.observed is not None else await self.read_run()
        pending = run.status.pending_request
        if pending is None or pending.request_id != request_id or pending.held_by != self.me.attempt:
            return run  # not held by us any more: nothing to release
        body = {
            "metadata": {"resourceVersion": run.metadata.resource_version},
            "status": {"pendingRequest": {"heldBy": None}},
        }
        try:
            written = await self.api.merge_patch(f"{self.run_path}/status", body)
        except ApiError as exc:
            if exc.conflict:
                self.observe(await self.read_run())
                return None
            await self.raise_refusal(exc, f"release of request {request_id}")
            raise
        self.run = Run.model_validate(written)
        self.observe(self.run)
        return self.run


def _rv(run: Run) -> int:
    try:
        return int(run.metadata.resource_version or 0)
    except ValueError:
        return 0
