"""The console without a cluster: sessions, the server's defences, the inbox's items and the commands
its actions become. (With the API server and a real browser: tests/integration/test_console.py.)"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import DummyCookieJar
from aiohttp.test_utils import TestClient, TestServer

from agentrun.cli.app import parse
from agentrun.cli.console import actions, inbox, server
from agentrun.cli.console.seats import Seat
from agentrun.cli.console.server import COOKIE, CSRF_HEADER, AccessLogger, Console, application
from agentrun.cli.console.sessions import Sessions, csrf_matches
from agentrun.cli.console.watchcache import WatchCache
from agentrun.core.ledger import approval_request_id, request_digest
from agentrun.kubeapi import KubeApi, load_configuration
from support.clock import FakeClock

STATIC = Path(actions.__file__).parent / "static"
HOST = "127.0.0.1:8765"
SESSION_COOKIE = f"{COOKIE}-8765"  # one name per port


def jar(value: str) -> str:
    """The Cookie header of a session."""
    return f"{SESSION_COOKIE}={value}"


# ---- sessions --------------------------------------------------------------------------------------


def test_the_login_token_opens_one_session_once_and_sessions_expire() -> None:
    clock = FakeClock(monotonic=100.0)
    sessions = Sessions(60, clock=clock)
    token = sessions.login_token
    assert token and len(token) >= 40
    assert sessions.exchange("wrong") is None
    session = sessions.exchange(token)
    assert session is not None and sessions.login_token is None
    assert sessions.exchange(token) is None, "a login URL works once"
    assert sessions.find(session.id) is session and sessions.seconds_left(session) == 60
    assert csrf_matches(session, session.csrf) and not csrf_matches(session, None)
    assert not csrf_matches(session, session.csrf + "x")
    clock.advance(60)
    assert sessions.find(session.id) is None, "expired"
    assert sessions.find(session.id) is None, "and forgotten"


# ---- the server's defences (requests refused before any reaches the API server) -----------------------


def _api(tmp_path: Path) -> KubeApi:
    """A client of an API server that is not there: these requests must never get that far."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return KubeApi(load_configuration(str(path)))


def _console(tmp_path: Path, clock: FakeClock) -> Console:
    api = _api(tmp_path)
    sessions = Sessions(3600, clock=clock)
    return Console(api, WatchCache(api, ["team-a"]), sessions, {HOST}, "alice", parse, clock=clock)


def local(console: Console) -> Seat:
    """The one seat of a console on a laptop: the kubeconfig user's."""
    assert console.local is not None
    return console.local


def _serve(
    tmp_path: Path, test: Callable[[TestClient[Any, Any], Console, FakeClock], Awaitable[None]]
) -> None:
    now = FakeClock(monotonic=0.0)
    console = _console(tmp_path, now)

    async def main() -> None:
        # no cookie jar: each request carries exactly the cookies the test gives it
        client = TestClient(TestServer(application(console)), cookie_jar=DummyCookieJar())
        await client.start_server()
        try:
            await test(client, console, now)
        finally:
            await client.close()
            await local(console).api.aclose()

    asyncio.run(main())


async def _signed_in(client: TestClient[Any, Any], console: Console) -> tuple[str, str]:
    """Signs in with the login URL; returns the session cookie and the CSRF token."""
    token = console.sessions.login_token
    answer = await client.get(f"/login?token={token}", headers={"Host": HOST}, allow_redirects=False)
    assert answer.status == 303 and answer.headers["Location"] == "/"
    cookie = answer.cookies[SESSION_COOKIE]
    assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/"
    session = await client.get("/api/session", headers={"Host": HOST, "Cookie": jar(cookie.value)})
    body = await session.json()
    assert body["user"] == "alice" and body["scopes"] == ["team-a"]
    return cookie.value, body["csrf"]


def test_sign_in_exchanges_the_one_time_token_for_an_httponly_strict_cookie(tmp_path: Path) -> None:
    async def test(client: TestClient[Any, Any], console: Console, now: FakeClock) -> None:
        assert (await client.get("/api/session", headers={"Host": HOST})).status == 401
        token = console.sessions.login_token
        cookie, _ = await _signed_in(client, console)
        again = await client.get(f"/login?token={token}", headers={"Host": HOST}, allow_redirects=False)
        assert again.status == 403 and "used already" in await again.text()
        now.advance(3600)
        expired = await client.get("/api/session", headers={"Host": HOST, "Cookie": jar(cookie)})
        assert expired.status == 401
        assert "open the login URL" in (await expired.json())["error"]

    _serve(tmp_path, test)


def test_a_foreign_host_header_is_refused_even_with_a_valid_login(tmp_path: Path) -> None:
    """DNS rebinding: a page of evil.example resolved to 127.0.0.1 sends Host: evil.example:8765."""

    async def test(client: TestClient[Any, Any], console: Console, now: FakeClock) -> None:
        token = console.sessions.login_token
        for path in ("/", f"/login?token={token}", "/api/session", "/static/console.js"):
            answer = await client.get(path, headers={"Host": "evil.example:8765"}, allow_redirects=False)
            assert answer.status == 421, path
        assert console.sessions.login_token == token, "not spent by the refused request"

    _serve(tmp_path, test)


def test_writes_need_the_session_the_page_origin_and_the_csrf_token(tmp_path: Path) -> None:
    async def test(client: TestClient[Any, Any], console: Console, now: FakeClock) -> None:
        cookie, csrf = await _signed_in(client, console)
        body = {"namespace": "team-a", "run": "r"}
        page = {"Host": HOST, "Origin": f"http://{HOST}", "Cookie": jar(cookie), CSRF_HEADER: csrf}
        cases = {
            "no session": {k: v for k, v in page.items() if k != "Cookie"},
            "no origin": {k: v for k, v in page.items() if k != "Origin"},
            "another site": {**page, "Origin": "http://evil.example"},
            "no csrf": {k: v for k, v in page.items() if k != CSRF_HEADER},
            "wrong csrf": {**page, CSRF_HEADER: "guess"},
        }
        for case, headers in cases.items():
            answer = await client.post("/api/cancel", json=body, headers=headers)
            assert answer.status in (401, 403), case
        # With everything right, the request gets past the guard (to the action, refused here as unknown).
        past = await client.post("/api/frobnicate", json=body, headers=page)
        assert past.status == 400 and (await past.json())["error"] == "unknown action 'frobnicate'"
        form = await client.post("/api/cancel", data="namespace=team-a", headers=page)
        assert form.status == 415, "a form post (what another site can send) is not JSON"

    _serve(tmp_path, test)


def test_the_server_approves_nothing_whose_digest_it_could_not_recompute(tmp_path: Path) -> None:
    """The page offers no Approve then; an approval sent by hand is refused before anything is sent."""
    action = _action({"title": "t"})
    request_id = approval_request_id("ap-k1", action["requestDigest"])
    tampered = {**action, "request": {"title": "something else"}}
    pending = {"requestId": request_id, "reason": "auth_required", "checkpointId": "c1", "action": tampered}

    async def test(client: TestClient[Any, Any], console: Console, now: FakeClock) -> None:
        local(console).cache.objects["runs"][("team-a", "ap")] = _run("ap", pending, "2026-03-01T12:00:00Z")
        cookie, csrf = await _signed_in(client, console)
        page = {"Host": HOST, "Origin": f"http://{HOST}", "Cookie": jar(cookie), CSRF_HEADER: csrf}
        body = {"namespace": "team-a", "run": "ap", "requestId": request_id, "checkpointId": "c1"}
        answer = await client.post("/api/approve", json={**body, "approved": True}, headers=page)
        said = await answer.json()
        assert answer.status == 409 and said["ok"] is False
        assert "not the digest of the request it shows" in said["message"]
        assert said["message"].endswith("nothing sent")
        other = await client.post(
            "/api/approve", json={**body, "requestId": "approve-other", "approved": True}, headers=page
        )
        assert "does not wait for this approval" in (await other.json())["message"]

    _serve(tmp_path, test)


def test_an_api_server_that_does_not_answer_gets_a_page_that_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "READY_SECONDS", 0.05)  # the lists never come: no need to wait long

    async def test(client: TestClient[Any, Any], console: Console, now: FakeClock) -> None:
        local(console).cache.start()  # its watches try the API server that is not there, again and again
        try:
            cookie, _ = await _signed_in(client, console)
            answer = await client.get("/api/inbox", headers={"Host": HOST, "Cookie": jar(cookie)})
            assert answer.status == 503
            assert "is the cluster reachable?" in (await answer.json())["error"]
        finally:
            await local(console).cache.stop()

    _serve(tmp_path, test)


def test_every_answer_carries_a_strict_content_security_policy(tmp_path: Path) -> None:
    async def test(client: TestClient[Any, Any], console: Console, now: FakeClock) -> None:
        for path in ("/", "/runs/team-a/r", "/static/console.js", "/static/console.css", "/api/session"):
            answer = await client.get(path, headers={"Host": HOST})
            policy = answer.headers["Content-Security-Policy"]
            assert "script-src 'self'" in policy and "default-src 'none'" in policy, path
            assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
            assert answer.headers["X-Frame-Options"] == "DENY"
            assert answer.headers["Referrer-Policy"] == "no-referrer"
        for other in ("/static/server.py", "/static/%2e%2e%2fserver.py"):
            missing = await client.get(other, headers={"Host": HOST})
            assert missing.status == 404, "only the listed files"
            assert missing.headers["Content-Security-Policy"] == server.CSP
        login = await client.get(
            f"/login?token={console.sessions.login_token}", headers={"Host": HOST}, allow_redirects=False
        )
        assert login.status == 303 and login.headers["Content-Security-Policy"] == server.CSP
        assert login.headers["Cache-Control"] == "no-store"

    _serve(tmp_path, test)


def test_the_access_log_never_holds_the_login_token(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="aiohttp.access")
    console = _console(tmp_path, FakeClock(monotonic=0.0))
    token = str(console.sessions.login_token)

    async def main() -> None:
        server = TestServer(application(console))
        await server.start_server(access_log_class=AccessLogger)  # as `console` runs it
        client = TestClient(server)
        try:
            await client.get(f"/login?token={token}", headers={"Host": HOST}, allow_redirects=False)
        finally:
            await client.close()
            await local(console).api.aclose()

    asyncio.run(main())
    logged = [r.getMessage() for r in caplog.records if r.name == "aiohttp.access"]
    assert logged and logged[0].startswith("GET /login 303")
    assert token not in caplog.text


def test_the_page_runs_no_inline_script_and_sets_no_markup_from_data() -> None:
    html = (STATIC / "index.html").read_text()
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", html, re.S)
    assert scripts == [(' src="/static/console.js" defer', "")]
    assert not re.search(r"\son[a-z]+=", html), "no inline event handlers"
    script = (STATIC / "console.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in script, sink


# ---- the inbox -------------------------------------------------------------------------------------

PRIORITY = {"type": "object", "properties": {"priority": {"enum": ["low", "high"]}}, "required": ["priority"]}


def _run(
    name: str, pending: dict[str, Any] | None, since: str, phase: str = "InputRequired"
) -> dict[str, Any]:
    conditions = [{"type": "Waiting", "status": "True", "lastTransitionTime": since}]
    status: dict[str, Any] = {"phase": phase, "conditions": conditions}
    if pending is not None:
        status["pendingRequest"] = pending
    return {"metadata": {"namespace": "team-a", "name": name, "creationTimestamp": since}, "status": status}


def _action(request: Any = None, **override: Any) -> dict[str, Any]:
    digest = request_digest("create_ticket", "tickets", request)
    return {
        "tool": "create_ticket",
        "target": "tickets",
        "idempotencyKey": "k1",
        "request": request,
        "requestDigest": digest,
        **override,
    }


def test_the_inbox_lists_every_kind_of_request_newest_first() -> None:
    question = {"requestId": "q-1", "reason": "input_required", "checkpointId": "c1", "prompt": "Which?"}
    paused = {"requestId": "p-1", "reason": "paused", "checkpointId": "c1"}
    action = _action({"title": "t"})
    approval_id = approval_request_id("ap-k1", action["requestDigest"])
    approval = {"requestId": approval_id, "reason": "auth_required", "checkpointId": "c1", "action": action}
    runs = [
        _run("ask", {**question, "acceptedSchema": PRIORITY}, "2026-03-01T12:00:03Z"),
        _run("stopped", {**paused}, "2026-03-01T12:00:01Z", "Paused"),
        _run("ap", approval, "2026-03-01T12:00:02Z", "AuthRequired"),
        _run("recon", None, "2026-03-01T12:00:00Z", "NeedsReconciliation"),
        _run("fine", None, "2026-03-01T12:00:05Z", "Running"),
    ]
    unknown = {
        "metadata": {"namespace": "team-a", "name": "recon-k2", "creationTimestamp": "2026-03-01T11:59:00Z"},
        "spec": {"runName": "recon", "tool": "pay", "idempotencyKey": "k2", "reversible": False},
        "status": {"state": "Unknown", "sends": [{"sendId": "s1", "attempt": "recon-a1", "time": "x"}]},
    }
    items = inbox.items(runs, [unknown])
    assert [(i["kind"], i["run"]) for i in items] == [
        ("question", "ask"),
        ("approval", "ap"),
        ("pause", "stopped"),
        ("reconcile", "recon"),  # its Run waits for it: no separate retry item until it is resolved
    ]
    assert items[0]["formSchema"] == PRIORITY and items[0]["prompt"] == "Which?"
    assert items[1]["approval"]["verified"] is True
    assert items[3]["sends"][0]["sendId"] == "s1" and items[3]["reversible"] is False

    resolved = {**unknown, "status": {"state": "Failed"}}
    assert [(i["kind"], i["run"]) for i in inbox.items(runs, [resolved])][-1] == ("retry", "recon")


def test_approve_is_offered_only_when_the_digest_is_that_of_the_request_shown() -> None:
    good = _action({"title": "t", "n": 1.0})
    request_id = approval_request_id("r-k1", good["requestDigest"])
    assert inbox.approval_check(request_id, good)["verified"] is True
    assert good["requestDigest"] == request_digest("create_ticket", "tickets", {"n": 1, "title": "t"})

    swapped = {**good, "request": {"title": "something else"}}
    verdict = inbox.approval_check(request_id, swapped)
    assert verdict["verified"] is False and "not the digest of the request it shows" in verdict["problem"]
    assert verdict["recomputedDigest"] != verdict["requestDigest"]

    other = approval_request_id("r-k1", request_digest("create_ticket", "tickets", {"title": "x"}))
    assert "another request" in inbox.approval_check(other, good)["problem"]

    by_reference = {k: v for k, v in good.items() if k != "request"} | {"requestRef": "s3://b/k"}
    assert "by reference" in inbox.approval_check(request_id, by_reference)["problem"]
    assert "did not describe the action" in inbox.approval_check(request_id, None)["problem"]


def test_a_schema_too_deep_or_too_big_for_a_form_gets_the_json_editor() -> None:
    assert inbox.schema_for_form(PRIORITY) == PRIORITY
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(inbox.MAX_SCHEMA_DEPTH + 1):
        deep = {"type": "object", "properties": {"x": deep}}
    assert inbox.schema_for_form(deep) is None
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(300)}}
    assert inbox.schema_for_form(wide) is None
    assert inbox.schema_for_form(["not", "an", "object"]) is None


# ---- actions are CLI commands ----------------------------------------------------------------------


def test_each_action_is_the_command_a_person_would_type() -> None:
    answer = {"namespace": "ns", "run": "ask", "requestId": "q-1", "checkpointId": "c1"}
    argv = actions.command_line("answer", {**answer, "value": {"priority": "high"}})
    args = parse(argv)
    assert (args.command_name, args.run, args.request_id, args.checkpoint) == ("resume", "ask", "q-1", "c1")
    assert args.value == '{"priority": "high"}' and args.key is None

    denied = parse(actions.command_line("approve", {**answer, "approved": False}))
    assert denied.value == '{"approved": false}'
    assert parse(actions.command_line("release", answer)).value == "{}"

    cancel = parse(actions.command_line("cancel", {"namespace": "ns", "run": "r", "reason": "--wait"}))
    assert (cancel.command_name, cancel.reason, cancel.wait) == ("cancel", "--wait", False)

    resolve = {"namespace": "ns", "effect": "r-k2", "verdict": "confirmed", "reference": "T-1", "retry": True}
    args = parse(actions.command_line("resolve", resolve))
    assert (args.command_name, args.name, args.confirmed, args.reference, args.retry) == (
        "resolve-effect",
        "r-k2",
        True,
        "T-1",
        True,
    )
    retry = parse(actions.command_line("retry", {"namespace": "ns", "run": "r", "fromCheckpoint": "c1"}))
    assert (retry.command_name, retry.from_checkpoint) == ("retry", "c1")

    refused: list[tuple[str, dict[str, Any], str]] = [
        ("answer", answer, "value is required"),
        ("approve", {**answer, "approved": "yes"}, "approved must be true or false"),
        ("resolve", {**resolve, "verdict": "maybe"}, "verdict must be"),
        ("resolve", {**resolve, "reference": None}, "reference is required"),
        ("cancel", {"namespace": "ns", "run": ["r"]}, "run must be a short string"),
    ]
    for action, body, why in refused:
        with pytest.raises(actions.BadAction, match=why):
            actions.command_line(action, body)
