"""`kubectl agentrun console` as a person runs it (a process with a kubeconfig), people made of
ServiceAccount tokens, and the distribution's Chromium driven by Playwright."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from playwright.sync_api import Browser, BrowserContext, Page, Playwright, expect

from support.kube import Kube
from support.runs import GROUP

# The screenshots: into docs/console/ when asked (`make screenshots`), else beside the test run's other
# files, so that `make test` leaves the checkout as it found it.
SHOTS = Path(os.environ.get("AGENTRUN_SCREENSHOTS") or Path(tempfile.gettempdir()) / "agentrun-console-shots")
# Debian's package puts the browser here (/usr/bin/chromium is a shell wrapper around it).
CHROMIUM_CANDIDATES = ("/usr/lib/chromium/chromium", "/usr/bin/chromium", "/usr/bin/chromium-browser")


def chromium_path() -> str:
    """The distribution's Chromium; the tests fail (never skip) without it: `make chromium` installs it."""
    for candidate in (os.environ.get("AGENTRUN_CHROMIUM"), *CHROMIUM_CANDIDATES, shutil.which("chromium")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise AssertionError("no Chromium found: run `make chromium` (apt-get install chromium, as root)")


# How long an agent Pod may take to start and ask (ms): a cold Python on a busy machine.
AGENT_MS = 90_000
# Upper bounds (ms) of an expectation and of a page action: Playwright's defaults (5 s, 30 s) are a quiet
# machine's pace, and a loaded one shares its CPUs between the browser, the console and the cluster.
EXPECT_MS = 30_000
ACTION_MS = 60_000
# Posts an answer straight to the console with the page's session and CSRF token: what a person could
# send by hand, past the page's own checks.
BY_HAND = """async (body) => {
  const session = await (await fetch("/api/session")).json();
  const answer = await fetch("/api/answer", {
    method: "POST",
    headers: {"Content-Type": "application/json", "X-CSRF-Token": session.csrf},
    body: JSON.stringify(body),
  });
  return {status: answer.status, body: await answer.json()};
}"""


def launch(playwright: Playwright) -> Browser:
    expect.set_options(timeout=EXPECT_MS)
    # --no-sandbox: the build machines run the tests as root, where Chromium's sandbox cannot start.
    return playwright.chromium.launch(executable_path=chromium_path(), headless=True, args=["--no-sandbox"])


@dataclass
class ConsoleProcess:
    """One person's console: `python -m agentrun.cli console` with their kubeconfig."""

    process: subprocess.Popen[str]
    base: str  # http://127.0.0.1:<port>
    login_url: str  # the one-time URL it printed
    log: Path

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def log_tail(self) -> str:
        return self.log.read_text()[-3000:]


@contextmanager
def console(kubeconfig: Path, namespaces: list[str] | None, log: Path) -> Iterator[ConsoleProcess]:
    """The console of the kubeconfig's user, for `namespaces` (None: as it chooses them itself)."""
    argv = [sys.executable, "-m", "agentrun.cli", "--kubeconfig", str(kubeconfig), "console", "--debug"]
    argv += ["--namespaces", ",".join(namespaces)] if namespaces else []
    with log.open("w") as stderr:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, text=True)
        try:
            login = _login_url(process.stdout)
            if login is None:
                process.wait(timeout=20)
                raise AssertionError(f"the console printed no login URL:\n{log.read_text()[-3000:]}")
            base = login.split("/login?")[0]
            started = ConsoleProcess(process, base, login, log)
            yield started
        finally:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def _login_url(stdout: IO[str] | None) -> str | None:
    """The URL of the "Open (works once...)" line (blocks until the console has printed it, or exited)."""
    assert stdout is not None
    for line in stdout:
        if line.startswith("Open (") and "http://" in line:
            return line[line.index("http://") :].strip()
    return None


def signed_in(browser: Browser, started: ConsoleProcess, **options: Any) -> tuple[BrowserContext, Page]:
    """A fresh browser context signed in through the login URL, on the inbox."""
    context = browser.new_context(**options)
    context.set_default_timeout(ACTION_MS)
    page = context.new_page()
    page.goto(started.login_url)
    page.wait_for_selector("#live.on")  # the page is up and its event stream connected
    return context, page


def person(kube: Kube, namespace: str, name: str, verbs: list[str]) -> Kube:
    """A ServiceAccount standing in for a person: `verbs` on the agentrun.dev objects of the namespace
    (RBAC), signed in with a `kubectl create token` token."""
    kube.core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    objects = ["runs", "attempts", "checkpoints", "sideeffects", "sideeffects/status"]
    rules = [{"apiGroups": [GROUP], "resources": objects, "verbs": verbs}]
    kube.rbac.create_namespaced_role(namespace, {"metadata": {"name": name}, "rules": rules})
    kube.rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    )
    token = kube.kubectl("create", "token", name, "--duration=1h", namespace=namespace).stdout.strip()
    return kube.with_token(token)


READ = ["get", "list", "watch"]
ANSWER = [*READ, "patch", "update"]


def screenshot(page: Page, name: str, selector: str | None = None) -> Path:
    """A PNG for docs/console.md, of the element (or the viewport), kept small."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    if selector:
        page.locator(selector).first.screenshot(path=str(path))
    else:
        page.screenshot(path=str(path))
    return path


@dataclass
class ProxiedConsole:
    """The console as the chart runs it behind an OIDC proxy: each request must carry a person's token."""

    process: subprocess.Popen[str]
    base: str
    log: Path

    def log_tail(self) -> str:
        return self.log.read_text()[-3000:]


@contextmanager
def proxied_console(
    kubeconfig: Path, namespaces: list[str], header: str, log: Path
) -> Iterator[ProxiedConsole]:
    """`console --proxy-token-header HEADER` on 127.0.0.1 with `kubeconfig` (whose own credentials must
    never act: give it an admin's to show that)."""
    argv = [sys.executable, "-m", "agentrun.cli", "--kubeconfig", str(kubeconfig), "console", "--debug"]
    argv += [
        "--namespaces",
        ",".join(namespaces),
        "--proxy-token-header",
        header,
        "--allow-host",
        "127.0.0.1",
    ]
    with log.open("w") as stderr:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=stderr, text=True)
        try:
            assert process.stdout is not None
            line = next((x for x in process.stdout if "behind a proxy" in x), None)
            if line is None:
                process.wait(timeout=20)
                raise AssertionError(f"the console did not start:\n{log.read_text()[-3000:]}")
            port = line.split(" behind a proxy")[0].rsplit(":", 1)[1]
            yield ProxiedConsole(process, f"http://127.0.0.1:{port}", log)
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def token_of(kube: Kube, namespace: str, account: str) -> str:
    """A `kubectl create token` token of a ServiceAccount: a person as the proxy would forward them."""
    return kube.kubectl("create", "token", account, "--duration=1h", namespace=namespace).stdout.strip()
