"""Operator settings: read from the environment, handed to kopf as chosen."""

from __future__ import annotations

import kopf
import pytest

from agentrun.operator.settings import OperatorSettings, apply_settings


def test_defaults_reach_kopf() -> None:
    settings = kopf.OperatorSettings()
    apply_settings(settings, OperatorSettings())

    assert settings.watching.chunk_size == 500
    assert settings.queueing.worker_limit == 200
    assert settings.queueing.idle_timeout == 0.5
    assert settings.watching.server_timeout == 300


@pytest.mark.parametrize(("value", "chunk_size"), [("200", 200), ("0", None)])
def test_list_chunk_size_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str, chunk_size: int | None
) -> None:
    monkeypatch.setenv("AGENTRUN_LIST_CHUNK_SIZE", value)
    settings = kopf.OperatorSettings()
    apply_settings(settings, OperatorSettings.from_env())

    assert settings.watching.chunk_size == chunk_size
