"""Fixtures shared by the unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agentrun.kubeapi import KubeApi, load_configuration


@pytest.fixture
def unreachable_api(tmp_path: Path) -> KubeApi:
    """A KubeApi whose every request fails at once (connection refused): a test that passes made none,
    or handled the failure."""
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(document))
    return KubeApi(load_configuration(str(path)))
