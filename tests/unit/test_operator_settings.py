"""Operator settings: read from the environment, handed to kopf as chosen."""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path

import kopf
import pytest

from agentrun.operator.settings import OperatorSettings, apply_settings, own_account


def test_defaults_reach_kopf() -> None:
    settings = kopf.OperatorSettings()
    apply_settings(settings, OperatorSettings())

    assert settings.watching.chunk_size == 500
    assert settings.queueing.worker_limit == 200
    assert settings.queueing.idle_timeout == 0.05
    assert settings.watching.server_timeout == 300


@pytest.mark.parametrize("value", ["0", "-1"])
def test_an_event_worker_idle_time_of_zero_is_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """kopf's worker waits for its next event with asyncio.wait_for(get, idle): with no time left the get
    is cancelled before it runs, so an event already queued would never be taken."""
    monkeypatch.setenv("AGENTRUN_EVENT_WORKER_IDLE_SECONDS", value)

    with pytest.raises(ValueError, match="event_worker_idle_seconds"):
        OperatorSettings.from_env(auto_priority=-1)


@pytest.mark.parametrize(("value", "chunk_size"), [("200", 200), ("0", None)])
def test_list_chunk_size_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str, chunk_size: int | None
) -> None:
    monkeypatch.setenv("AGENTRUN_LIST_CHUNK_SIZE", value)
    settings = kopf.OperatorSettings()
    apply_settings(settings, OperatorSettings.from_env(auto_priority=-1))

    assert settings.watching.chunk_size == chunk_size


def _token(claims: dict[str, object]) -> str:
    payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"eyJhbGciOiJSUzI1NiJ9.{payload}.c2ln"


OWN_ACCOUNTS = {
    "env": (
        {"AGENTRUN_SERVICE_ACCOUNT": "op", "AGENTRUN_SERVICE_ACCOUNT_NAMESPACE": "sys"},
        {},
        ("sys", "op"),
    ),
    "env name, token namespace": ({"AGENTRUN_SERVICE_ACCOUNT": "op"}, {"namespace": "sys\n"}, ("sys", "op")),
    "token subject": ({}, {"token": _token({"sub": "system:serviceaccount:sys:op"})}, ("sys", "op")),
    "a user's token": ({}, {"token": _token({"sub": "alice"})}, None),
    "no token (a kubeconfig)": ({}, {}, None),
}


@pytest.mark.parametrize(("env", "files", "expected"), OWN_ACCOUNTS.values(), ids=OWN_ACCOUNTS.keys())
def test_own_account(
    tmp_path: Path, env: dict[str, str], files: dict[str, str], expected: tuple[str, str] | None
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    account = own_account(env, tmp_path)
    assert (None if account is None else (account.namespace, account.name)) == expected


def test_the_state_store_is_off_unless_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTRUN_STATE_STORE_URL", raising=False)
    monkeypatch.delenv("AGENTRUN_STATE_STORE_SECRET", raising=False)
    assert OperatorSettings.from_env(auto_priority=-1).state_store_pod_env() is None


def test_the_state_store_url_and_secret_name_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRUN_STATE_STORE_URL", "s3://agentrun/runs?endpoint=http://127.0.0.1:7070")
    monkeypatch.delenv("AGENTRUN_STATE_STORE_SECRET", raising=False)
    store = OperatorSettings.from_env(auto_priority=-1).state_store_pod_env()
    assert store is not None
    assert store.url == "s3://agentrun/runs?endpoint=http://127.0.0.1:7070"
    assert store.secret == "agentrun-state-store"
    monkeypatch.setenv("AGENTRUN_STATE_STORE_SECRET", "team-store")
    store = OperatorSettings.from_env(auto_priority=-1).state_store_pod_env()
    assert store is not None
    assert store.secret == "team-store"


def test_a_state_store_url_with_credentials_is_refused_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRUN_STATE_STORE_URL", "s3://AKIA:secret@agentrun/runs")
    with pytest.raises(ValueError, match=r"credential|user info") as caught:
        OperatorSettings.from_env(auto_priority=-1)
    assert "secret@" not in str(caught.value)


@pytest.mark.parametrize(("value", "provision"), [("", False), ("versitygw", True), (" versitygw ", True)])
def test_the_operator_provisions_namespaces_only_on_the_bundled_server(
    monkeypatch: pytest.MonkeyPatch, value: str, provision: bool
) -> None:
    monkeypatch.setenv("AGENTRUN_STATE_STORE_PROVISION", value)
    assert OperatorSettings.from_env(auto_priority=-1).state_store_provision is provision


def test_an_unknown_provisioner_is_refused_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRUN_STATE_STORE_PROVISION", "minio")
    with pytest.raises(ValueError, match="versitygw"):
        OperatorSettings.from_env(auto_priority=-1)


STORE = "s3://agentrun?endpoint=http://127.0.0.1:7070"


@pytest.mark.parametrize(
    ("env", "mode", "level", "says"),
    [
        (
            {"AGENTRUN_STATE_STORE_URL": STORE, "AGENTRUN_STATE_STORE_PROVISION": "versitygw"},
            "Bundled",
            logging.INFO,
            "the bundled server at s3://agentrun?endpoint=http://127.0.0.1:7070&buckets=namespace",
        ),
        ({"AGENTRUN_STATE_STORE_URL": STORE}, "External", logging.INFO, "an administrator provides"),
        ({"AGENTRUN_STATE_STORE_INLINE": "true"}, "Inline", logging.INFO, "as configured"),
        ({}, "Inline", logging.WARNING, "set AGENTRUN_STATE_STORE_INLINE=true to say that this is meant"),
    ],
    ids=["bundled", "external", "inline-chosen", "inline-unsaid"],
)
def test_the_operator_says_where_it_keeps_agent_state(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], mode: str, level: int, says: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = OperatorSettings.from_env(auto_priority=-1)

    assert config.state_store_mode.value == mode
    said_level, said = config.state_store_said()
    assert said.startswith(f"state store: {mode}")
    assert says in said
    assert said_level == level


def test_no_store_chosen_with_a_store_url_is_refused_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRUN_STATE_STORE_URL", STORE)
    monkeypatch.setenv("AGENTRUN_STATE_STORE_INLINE", "true")
    with pytest.raises(ValueError, match="set one of them"):
        OperatorSettings.from_env(auto_priority=-1)


def test_the_inline_choice_is_true_or_false(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRUN_STATE_STORE_INLINE", "yes")
    with pytest.raises(ValueError, match="true or false"):
        OperatorSettings.from_env(auto_priority=-1)
