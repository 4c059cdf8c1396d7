"""Notifications: a CloudEvent (HTTP binary mode) to a sink when a Run waits for a person.

The Run never waits for a notification: `observe` only queues, a few sender tasks deliver, and a sink
that is down is retried with capped backoff for a while, then given up with a warning (the Run still
waits, visible as ever). At least once: a restarted operator sends what it sees waiting again, under the
same ids (agentrun.core.notifications), and receivers deduplicate by id.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, Final

import aiohttp

from agentrun.api import API_VERSION, NOTIFY_PROMPT_LABEL, Run, RunPhase
from agentrun.clock import Clock
from agentrun.core import notifications
from agentrun.core.notifications import Notice
from agentrun.kubeapi import ApiError, KubeApi
from agentrun.operator.settings import OperatorSettings

log = logging.getLogger("agentrun.operator.notifier")
JsonDict = dict[str, Any]

NOTIFY_PHASES: Final = frozenset(
    {RunPhase.INPUT_REQUIRED, RunPhase.AUTH_REQUIRED, RunPhase.NEEDS_RECONCILIATION}
)
SENDERS: Final = 4  # deliveries at once: one slow sink does not hold up the others
QUEUE_LIMIT: Final = 10_000
KNOWN_LIMIT: Final = 100_000  # ids remembered as queued or sent (the oldest are forgotten first)
POST_TIMEOUT_SECONDS: Final = 10.0
LABELS_SECONDS: Final = 60.0  # how long a namespace's labels are trusted before they are read again


# POST url, headers, body -> HTTP status (raises on a connection error or a timeout).
Post = Callable[[str, Mapping[str, str], bytes], Awaitable[int]]
Labels = Callable[[str], Awaitable[Mapping[str, str]]]
Refusal = Callable[[Notice, str], Awaitable[None]]


class Notifier:
    def __init__(
        self,
        config: OperatorSettings,
        *,
        clock: Clock,
        namespace_labels: Labels,
        record_refusal: Refusal,
        post: Post | None = None,
    ) -> None:
        self.config, self.clock = config, clock
        self._labels, self._record_refusal, self._post = namespace_labels, record_refusal, post
        self._queue: asyncio.Queue[Notice] = asyncio.Queue(QUEUE_LIMIT)
        self._known: OrderedDict[str, None] = OrderedDict()
        self._waiting: dict[str, str] = {}  # Run uid -> the id of what it waits for now
        self._refused: set[tuple[str, str]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None

    # ---- what is due -------------------------------------------------------------------------------

    def observe(self, body: JsonDict) -> None:
        """A Run as the watch delivered it: queues the notification its state calls for, once per id in
        this process. Never waits."""
        if (body.get("status") or {}).get("phase") not in NOTIFY_PHASES:
            # most events: parsing the Run is only worth it when it waits for someone
            self._waiting.pop((body.get("metadata") or {}).get("uid", ""), None)
            return
        try:
            notice = notifications.due(Run.model_validate(body))
        except ValueError as exc:  # a Run the operator cannot read is the reconciler's to report
            log.warning("no notification for a Run that does not parse: %s", str(exc)[:200])
            return
        if notice is None:
            return
        self._waiting[notice.uid] = notice.id
        if notice.id in self._known:
            return
        try:
            self._queue.put_nowait(notice)
        except asyncio.QueueFull:
            log.warning("notification %s not queued: %d are waiting to be sent", notice.id, QUEUE_LIMIT)
            return  # not remembered: a later event of the Run queues it again
        self._known[notice.id] = None
        while len(self._known) > KNOWN_LIMIT:
            self._known.popitem(last=False)

    # ---- delivery ----------------------------------------------------------------------------------

    def forget(self, body: JsonDict) -> None:
        """A Run was deleted: what it waited for is over (ids already sent stay known, bounded)."""
        self._waiting.pop((body.get("metadata") or {}).get("uid", ""), None)

    def still_due(self, notice: Notice) -> bool:
        """Whether the Run still waits for what `notice` tells (as far as this process has seen)."""
        return self._waiting.get(notice.uid) == notice.id

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._send_forever(), name=f"notifier-{n}") for n in range(SENDERS)
        ]

    async def stop(self) -> None:
        """Stops the senders; what is queued stays (a delivery under way is queued again if its Run
        still waits for it) for a start again: a replica that stands by sends nothing until it takes
        over."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _send_forever(self) -> None:
        while True:
            notice = await self._queue.get()
            try:
                await self.deliver(notice)
            except asyncio.CancelledError:  # stopped: sent again after a start, if still due
                if self.still_due(notice) and not self._queue.full():
                    self._queue.put_nowait(notice)
                raise
            except Exception:  # a notification is worth a log line, never the notifier
                log.exception("notification %s not delivered", notice.id)

    async def deliver(self, notice: Notice) -> bool:
        """Sends one notification to where it may go, retrying until it is taken or the retry time is
        over; True when a sink took it."""
        where = notifications.destination(
            notice.requested_sink, self.config.notify_sinks, self.config.notify_default_sink
        )
        if where.refusal and (notice.uid, str(notice.requested_sink)) not in self._refused:
            if len(self._refused) >= KNOWN_LIMIT:
                self._refused.clear()  # at worst a refusal is recorded twice
            self._refused.add((notice.uid, str(notice.requested_sink)))
            await self._record_refusal(notice, where.refusal)
        if where.sink is None:
            return False
        with_prompt = await self._prompt_allowed(notice.namespace)
        body = json.dumps(notifications.data(notice, self.config.console_url, with_prompt)).encode()
        started, tries = self.clock.now(), 0
        while True:
            if tries and not self.still_due(notice):
                log.info("notification %s dropped: its Run no longer waits for it", notice.id)
                return False
            tries += 1
            outcome = await self._try(where.sink, notifications.headers(notice, self.clock.now()), body)
            if outcome is None:
                return True
            waited = (self.clock.now() - started).total_seconds()
            if waited >= self.config.notify_retry_seconds:
                log.warning(
                    "notification %s to %s given up after %d tries in %.0fs: %s",
                    notice.id,
                    where.sink,
                    tries,
                    waited,
                    outcome,
                )
                return False
            await self.clock.sleep(notifications.retry_delay(tries))

    async def _try(self, sink: str, headers: Mapping[str, str], body: bytes) -> str | None:
        """One POST: None when the sink took it, else why not."""
        try:
            status = await (self._post or self._http_post)(sink, headers, body)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return f"{type(exc).__name__}: {exc}"
        return None if 200 <= status < 300 else f"HTTP {status}"

    async def _http_post(self, url: str, headers: Mapping[str, str], body: bytes) -> int:
        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=POST_TIMEOUT_SECONDS)
            self._session = aiohttp.ClientSession(timeout=timeout)
        async with self._session.post(url, data=body, headers=dict(headers)) as answer:
            await answer.read()
            return answer.status

    async def _prompt_allowed(self, namespace: str) -> bool:
        try:
            labels = await self._labels(namespace)
        except (ApiError, aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.warning(
                "labels of namespace %s not read (%s): notifications leave the prompt out", namespace, exc
            )
            return False
        return labels.get(NOTIFY_PROMPT_LABEL) == "true"


# ---- what the runtime injects --------------------------------------------------------------------------


def namespace_labels(api: KubeApi, clock: Clock) -> Labels:
    """A namespace's labels, read at most once a minute per namespace; none when they cannot be read (a
    namespaced install may not read namespaces: its notifications then leave the prompt out)."""
    read: dict[str, tuple[datetime, Mapping[str, str]]] = {}

    async def labels(namespace: str) -> Mapping[str, str]:
        now = clock.now()
        if (known := read.get(namespace)) and (now - known[0]).total_seconds() < LABELS_SECONDS:
            return known[1]
        try:
            body = await api.get(f"/api/v1/namespaces/{namespace}") or {}
        except ApiError as exc:
            log.warning(
                "labels of namespace %s not read (%s): its notifications leave the prompt out", namespace, exc
            )
            body = {}
        found: Mapping[str, str] = (body.get("metadata") or {}).get("labels") or {}
        read[namespace] = (now, found)
        return found

    return labels


def refusal_event(api: KubeApi, clock: Clock) -> Refusal:
    """Records a refused sink as a Warning Event on the Run (and in the log)."""

    async def record(notice: Notice, message: str) -> None:
        fields = {"namespace": notice.namespace, "run": notice.run}
        log.warning("run %s/%s NotifySinkRefused: %s", notice.namespace, notice.run, message, extra=fields)
        moment = clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{notice.run}.", "namespace": notice.namespace},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": "Run",
                "name": notice.run,
                "namespace": notice.namespace,
                "uid": notice.uid,
            },
            "type": "Warning",
            "reason": "NotifySinkRefused",
            "message": message[:1024],
            "source": {"component": "agentrun-operator"},
            "firstTimestamp": moment,
            "lastTimestamp": moment,
            "count": 1,
            "reportingComponent": "agentrun-operator",
        }
        try:
            await api.create(api.core_path("events", notice.namespace), body)
        except ApiError as exc:
            log.warning("event NotifySinkRefused not recorded: %s", exc, extra=fields)

    return record
