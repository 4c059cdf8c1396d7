"""agentrun.kubeapi against the real API server: credentials, refusals, watches of a collection."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import pytest
import yaml

from agentrun import kubeauth
from agentrun.kubeapi import ApiError, KubeApi, load_configuration
from support.kube import Kube

REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


def _token(kube: Kube, namespace: str, account: str) -> str:
    kube.core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    answer = kube.core.create_namespaced_service_account_token(
        account, namespace, {"spec": {"expirationSeconds": 600}}
    )
    token: str = answer.status.token
    return token


async def _who(api: KubeApi) -> str:
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    answer = await api.create(REVIEWS, review)
    return str(answer["status"]["userInfo"]["username"])


def test_a_rotated_token_file_is_who_the_next_request_is(
    kube: Kube, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kubeconfig's tokenFile is read again when it changes (bound tokens rotate): the same KubeApi
    is the new token's identity from its next request after the next look at the file on."""
    now = [0.0]  # the file is looked at once a second: the test moves that clock, not the wall's
    monkeypatch.setattr(kubeauth, "_clock", lambda: now[0])
    token_file = tmp_path / "token"
    token_file.write_text(_token(kube, namespace, "first"))
    config = yaml.safe_load(kube.kubeconfig.read_text())
    config["users"] = [{"name": "sa", "user": {"tokenFile": "token"}}]
    config["contexts"][0]["context"]["user"] = "sa"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))

    async def scenario() -> tuple[str, str]:
        api = KubeApi(load_configuration(str(kubeconfig)))
        try:
            before = await _who(api)
            replacement = tmp_path / "token.new"  # as a kubelet does: a new file moved into place
            replacement.write_text(_token(kube, namespace, "second"))
            replacement.replace(token_file)
            now[0] += kubeauth.TOKEN_FILE_CHECK_SECONDS
            return before, await _who(api)
        finally:
            await api.aclose()

    assert asyncio.run(scenario()) == (
        f"system:serviceaccount:{namespace}:first",
        f"system:serviceaccount:{namespace}:second",
    )


def test_inline_certificates_reach_the_server_as_files_do(kube: Kube, tmp_path: Path) -> None:
    """The admin kubeconfig's CA, client certificate and key, inlined as base64 data (as cloud
    kubeconfigs carry them): the same identity, over a verified connection."""
    config = yaml.safe_load(kube.kubeconfig.read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    for key in ("certificate-authority", "client-certificate", "client-key"):
        holder = cluster if key == "certificate-authority" else user
        holder[f"{key}-data"] = base64.b64encode(Path(holder.pop(key)).read_bytes()).decode()
    inlined = tmp_path / "inline.kubeconfig"
    inlined.write_text(yaml.safe_dump(config))

    async def who(path: Path) -> str:
        api = KubeApi(load_configuration(str(path)))
        try:
            return await _who(api)
        finally:
            await api.aclose()

    assert asyncio.run(who(inlined)) == asyncio.run(who(kube.kubeconfig))


def test_refusals_carry_status_reason_and_kind(kube: Kube, namespace: str) -> None:
    configmaps = KubeApi.core_path("configmaps", namespace)
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "v"}}

    async def scenario() -> dict[str, ApiError | object]:
        api = KubeApi(load_configuration(str(kube.kubeconfig)))
        seen: dict[str, ApiError | object] = {"missing": await api.get(f"{configmaps}/nope")}
        await api.create(configmaps, body)
        for name, write in {
            "exists": api.create(configmaps, body),
            "stale": api.merge_patch(f"{configmaps}/c", {"metadata": {"resourceVersion": "1"}}),
            "invalid": api.create(configmaps, {**body, "metadata": {"name": "Not_A_Name"}}),
            "too-large": api.create(configmaps, {**body, "data": {"k": "x" * (3 * 1024 * 1024 + 1)}}),
        }.items():
            try:
                await write
            except ApiError as exc:
                seen[name] = exc
        await api.aclose()
        return seen

    seen = asyncio.run(scenario())
    assert seen["missing"] is None
    exists, stale, invalid, too_large = (seen[k] for k in ("exists", "stale", "invalid", "too-large"))
    assert isinstance(exists, ApiError) and (exists.conflict, exists.reason) == (True, "AlreadyExists")
    assert isinstance(stale, ApiError) and (stale.conflict, stale.permanent) == (True, False)
    assert isinstance(invalid, ApiError) and (invalid.status, invalid.permanent) == (422, True)
    assert isinstance(too_large, ApiError) and too_large.too_large


@pytest.mark.parametrize("bookmarks", [False, True])
def test_a_collection_watch_by_label_sees_only_its_objects(
    kube: Kube, namespace: str, bookmarks: bool
) -> None:
    """label_selector filters on the server; from a resourceVersion on, every change after it comes."""
    configmaps = KubeApi.core_path("configmaps", namespace)

    def configmap(name: str, team: str) -> dict[str, object]:
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": {"team": team}}}

    async def scenario() -> list[tuple[str, str]]:
        api = KubeApi(load_configuration(str(kube.kubeconfig)))
        try:
            await api.create(configmaps, configmap("ours-1", "a"))
            await api.create(configmaps, configmap("theirs", "b"))
            listed = await api.request("GET", configmaps, query={"labelSelector": "team=a"})
            since = listed["metadata"]["resourceVersion"]
            await api.create(configmaps, configmap("ours-2", "a"))
            await api.create(configmaps, configmap("theirs-2", "b"))
            await api.merge_patch(f"{configmaps}/ours-1", {"data": {"k": "v"}})
            events = []
            async for event in api.watch(
                configmaps, label_selector="team=a", resource_version=since, bookmarks=bookmarks
            ):
                if event["type"] == "BOOKMARK":
                    continue
                events.append((event["type"], event["object"]["metadata"]["name"]))
                if len(events) == 2:
                    break  # leaving early closes the stream
            return events
        finally:
            await api.aclose()

    assert asyncio.run(scenario()) == [("ADDED", "ours-2"), ("MODIFIED", "ours-1")]


def test_a_watch_event_larger_than_a_chunk_arrives_whole(kube: Kube, namespace: str) -> None:
    """An event is one line of a whole object: one of 600 KiB comes in many chunks, joined once."""
    configmaps = KubeApi.core_path("configmaps", namespace)
    value = "x" * (600 * 1024)

    async def scenario() -> tuple[str, int]:
        api = KubeApi(load_configuration(str(kube.kubeconfig)))
        try:
            body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"}}
            await api.create(configmaps, {**body, "data": {"k": value}})
            async for event in api.watch(configmaps, "big"):
                return event["type"], len(event["object"]["data"]["k"])
            raise AssertionError("the watch ended without an event")
        finally:
            await api.aclose()

    assert asyncio.run(scenario()) == ("ADDED", len(value))
