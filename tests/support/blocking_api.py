"""A blocking JSON request on the official client, for callers without an event loop (the chaos harness,
the HTTP client benchmark): test and benchmark code, kept out of the installed package."""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from agentrun.kubeapi import ApiError, JsonDict


def to_api_error(exc: ApiException) -> ApiError:
    """The official client's exception as agentrun's ApiError (the API server's Status in it)."""
    return ApiError.of_answer(int(exc.status or 0), str(exc.body or exc.reason or ""))


def call_json(
    api_client: client.ApiClient,
    method: str,
    path: str,
    body: Any = None,
    *,
    query: dict[str, str] | None = None,
    content_type: str = "application/json",
    timeout: tuple[float, float] | None = None,
) -> JsonDict:
    """One request, JSON in and out; an answer that refuses it raises agentrun's ApiError (a request
    nobody answered raises urllib3's errors, which agentrun.kubeapi.unanswered recognises)."""
    try:
        result = api_client.call_api(
            path,
            method,
            query_params=list((query or {}).items()),
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            response_type="object",
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _request_timeout=timeout,
        )
    except ApiException as exc:
        raise to_api_error(exc) from None
    return result if isinstance(result, dict) else {}
