"""Where the API server is and who we are to it: a kubeconfig (as kubectl reads it) or the in-cluster
service account, for agentrun.kubeapi's HTTP transport.

The official client's loader parses the kubeconfig (contexts, merged KUBECONFIG lists, certificate and
token files or inline data, exec plugins, auth providers); this module adds what that loader lacks for
long-lived processes: a kubeconfig's `tokenFile` is read again whenever the file changes, seen within a
second (bound service-account tokens rotate; the loader reads it once). In-cluster, the loader itself
re-reads the mounted token every minute. The bearer token is asked for at every request, so a
refreshing credential (an exec plugin's expiring token) is renewed as the loader does. Not supported:
a client certificate that an exec plugin renews (the one it returned at start is kept), and proxies (a
kubeconfig's `proxy-url` is not read by the loader; HTTPS_PROXY is not read either).
"""

from __future__ import annotations

import os
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml
from kubernetes import client, config


def load_configuration(kubeconfig: str | None = None, context: str | None = None) -> client.Configuration:
    """KUBECONFIG (or the given file) when present, else the in-cluster service account; `context`
    chooses a context other than the kubeconfig's current one."""
    configuration = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path or os.path.exists(os.path.expanduser("~/.kube/config")):
        config.load_kube_config(config_file=path, context=context, client_configuration=configuration)
        if token_file := _token_file(path or os.path.expanduser("~/.kube/config"), context):
            _follow_token_file(configuration, token_file)
    else:
        config.load_incluster_config(client_configuration=configuration)
    return configuration


def active_context(paths: str, name: str | None = None) -> dict[str, Any] | None:
    """The current context of a kubeconfig (or the one called `name`) as {cluster, user, namespace}, or
    None if there is none (or it cannot be read). `paths` may list several files, as KUBECONFIG does."""
    try:
        contexts, active = config.list_kube_config_contexts(config_file=paths)
    except (config.ConfigException, OSError):
        return None
    if name is not None:
        active = next((c for c in contexts or [] if c.get("name") == name), None)
    context = (active or {}).get("context")
    return dict(context) if isinstance(context, dict) else None


def current_context_name(paths: str) -> str | None:
    """The name of a kubeconfig's current context, None if it has none (or cannot be read)."""
    try:
        _, active = config.list_kube_config_contexts(config_file=paths)
    except (config.ConfigException, OSError):
        return None
    name = (active or {}).get("name")
    return str(name) if name else None


# libyaml when the wheel has it: a kubeconfig is read at every process start (a worker, the CLI).
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _token_file(paths: str, chosen: str | None = None) -> Path | None:
    """The current (or `chosen`) context's user's tokenFile, if it has one (relative to its kubeconfig's
    folder).
    Each file is parsed once; in a KUBECONFIG list the first file to set a value wins, as in kubectl."""
    documents: list[tuple[Path, dict[str, Any]]] = []
    for path in paths.split(os.pathsep):
        try:
            file = Path(path).expanduser()
            document = yaml.load(file.read_text(), Loader=_YAML_LOADER) or {}
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(document, dict):
            documents.append((file, document))
    current = chosen or next((d["current-context"] for _, d in documents if d.get("current-context")), None)
    context = _first_named(documents, "contexts", current)
    user = _first_named(
        documents, "users", (context[1].get("context") or {}).get("user") if context else None
    )
    if user is None:
        return None
    found = (user[1].get("user") or {}).get("tokenFile")
    return user[0].parent / str(found) if found else None


def _first_named(
    documents: list[tuple[Path, dict[str, Any]]], section: str, name: object
) -> tuple[Path, dict[str, Any]] | None:
    """The first entry called `name` in the kubeconfigs' `section`, with the file it is in."""
    if name is None:
        return None
    for file, document in documents:
        for entry in document.get(section) or []:
            if isinstance(entry, dict) and entry.get("name") == name:
                return file, entry
    return None


# How often a followed tokenFile's modification time is looked at: the hook runs at every request, and a
# stat per request was 1 % of the operator's CPU; a rotated token stays valid long past its successor.
TOKEN_FILE_CHECK_SECONDS: Final = 1.0
_clock = time.monotonic  # a module attribute, for tests


def _follow_token_file(configuration: client.Configuration, token_file: Path) -> None:
    """Re-reads the token whenever the file's modification time changes (a rotated bound token). It
    replaces the loader's hook, which only renews expiring tokens (exec plugins, auth providers)."""
    # the modification time of the token last read (None: read at the first request), and when it was
    # last looked at
    seen: dict[str, float | None] = {"mtime": None, "checked": None}

    def refresh(conf: client.Configuration) -> None:
        now = _clock()
        checked = seen["checked"]
        if checked is not None and now - checked < TOKEN_FILE_CHECK_SECONDS:
            return
        seen["checked"] = now
        mtime = _mtime(token_file)
        if mtime == seen["mtime"]:
            return
        try:
            token = token_file.read_text().strip()
        except OSError:
            seen["checked"] = None  # being replaced: the next request reads it
            return
        seen["mtime"] = mtime
        conf.api_key["authorization"] = f"Bearer {token}"

    configuration.refresh_api_key_hook = refresh


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


@dataclass(frozen=True)
class Endpoint:
    """What the HTTP transport needs from a Configuration."""

    base_url: str
    ssl: ssl.SSLContext | bool
    server_hostname: str | None
    proxy: str | None
    configuration: client.Configuration

    @classmethod
    def of(cls, configuration: client.Configuration) -> Endpoint:
        tls: ssl.SSLContext | bool = True
        if configuration.host.startswith("https"):
            tls = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
            if not configuration.verify_ssl:
                tls.check_hostname = False
                tls.verify_mode = ssl.CERT_NONE
            if configuration.cert_file:
                tls.load_cert_chain(configuration.cert_file, configuration.key_file or None)
        return cls(
            base_url=configuration.host.rstrip("/"),
            ssl=tls,
            server_hostname=getattr(configuration, "tls_server_name", None) or None,
            proxy=configuration.proxy or None,
            configuration=configuration,
        )

    def headers(self) -> dict[str, Any]:
        """The Authorization header now (refreshed by the loader's hook, or a followed tokenFile)."""
        token = self.configuration.get_api_key_with_prefix("authorization")
        return {"Authorization": token} if token else {}
