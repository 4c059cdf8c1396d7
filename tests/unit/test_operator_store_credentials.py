"""operator.store_credentials as configured: the bundled server is administered only when asked, with the
operator's own credentials; no lookup is made where no Secret is needed. Against the real API server and
object store: tests/integration/test_store_access.py."""

from __future__ import annotations

import asyncio

import pytest

from agentrun.clock import SystemClock
from agentrun.kubeapi import KubeApi
from agentrun.operator.settings import OperatorSettings
from agentrun.operator.store_credentials import StoreCredentials

S3 = "s3://agentrun/runs?endpoint=http://127.0.0.1:7070&region=us-east-1"
ROOT = {"AWS_ACCESS_KEY_ID": "ROOT", "AWS_SECRET_ACCESS_KEY": "root-secret"}


def configured(api: KubeApi, environ: dict[str, str], **settings: object) -> StoreCredentials:
    return StoreCredentials.for_settings(api, SystemClock(), OperatorSettings(**settings), environ=environ)  # type: ignore[arg-type]


def test_the_bundled_server_is_administered_only_when_asked(unreachable_api: KubeApi) -> None:
    assert configured(unreachable_api, ROOT, state_store_url=S3).bundled is None
    assert configured(unreachable_api, ROOT, state_store_provision=True).bundled is None  # no store
    bundled = configured(unreachable_api, ROOT, state_store_url=S3, state_store_provision=True).bundled
    assert bundled is not None
    assert (bundled.endpoint, bundled.admin.access_key) == ("http://127.0.0.1:7070", "ROOT")
    assert bundled.namespace_resource("team-a") == "arn:aws:s3:::agentrun-team-a/runs/team-a/*"
    assert bundled.location.per_namespace  # the bundled server keeps a bucket per namespace


def test_administering_the_bundled_server_needs_its_root_credentials(unreachable_api: KubeApi) -> None:
    with pytest.raises(ValueError, match="AWS_ACCESS_KEY_ID"):
        configured(unreachable_api, {}, state_store_url=S3, state_store_provision=True)


@pytest.mark.parametrize("url", [None, "file:///var/lib/agentrun", "gs://agentrun/runs"])
def test_no_secret_is_looked_for_where_none_is_needed(unreachable_api: KubeApi, url: str | None) -> None:
    checks = configured(unreachable_api, {}, state_store_url=url)

    assert asyncio.run(checks.missing("team-a")) is False  # no request was made
