"""Where the API server is and who we are to it: a kubeconfig (as kubectl reads it) or the in-cluster
service account, for agentrun.kubeapi's HTTP transport.

A small parser of our own, so that a process that only talks to the API server (the worker SDK, the
CLI) never imports the official client (a third of the worker's start-up time). It reads contexts,
merged KUBECONFIG lists (the first file to name a context, cluster or user, or to set the current
context, wins; relative paths are relative to the file that names them), the server, its CA (file or
inline data), `insecure-skip-tls-verify`, `tls-server-name`, client certificates and keys (files or
inline data), a bearer `token`, a `tokenFile`, and a username and password. A `tokenFile` (and the
in-cluster service-account token) is read again whenever the file changes, seen within a second: bound
service-account tokens rotate. A user with an exec credential plugin or an auth provider is handed to
the official client's loader (imported then, and only then), which renews their expiring tokens at the
request that finds them expired. Not supported: a client certificate that an exec plugin renews (the one
it returned at start is kept), and proxies (a kubeconfig's `proxy-url` and HTTPS_PROXY are not read).
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

SERVICE_ACCOUNT_DIR: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_KUBECONFIG: Final = "~/.kube/config"


class ConfigError(Exception):
    """A kubeconfig (or the Pod's service account) that does not say where or who: the message says
    what is missing, and where."""


@dataclass
class Configuration:
    """What the HTTP transport needs to reach the API server and say who we are."""

    host: str
    ca_file: str | None = None
    ca_data: str | None = None  # PEM
    cert_file: str | None = None
    key_file: str | None = None
    cert_data: bytes | None = None  # PEM, with key_data: inline client credentials
    key_data: bytes | None = None
    verify_ssl: bool = True
    tls_server_name: str | None = None
    proxy: str | None = None
    # The Authorization header's value now (None: none), asked for at every request.
    authorization: Callable[[], str | None] = field(default=lambda: None)


def load_configuration(kubeconfig: str | None = None, context: str | None = None) -> Configuration:
    """KUBECONFIG (or the given file, or a list of them) when present, else ~/.kube/config when it
    exists, else the in-cluster service account; `context` chooses a context other than the
    kubeconfig's current one."""
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path or os.path.exists(os.path.expanduser(DEFAULT_KUBECONFIG)):
        return _from_kubeconfig(path or DEFAULT_KUBECONFIG, context)
    return _in_cluster(os.environ)


def active_context(paths: str, name: str | None = None) -> dict[str, Any] | None:
    """The current context of a kubeconfig (or the one called `name`) as {cluster, user, namespace}, or
    None if there is none (or it cannot be read). `paths` may list several files, as KUBECONFIG does."""
    try:
        merged = _Merged.read(paths)
        context = merged.named("contexts", name or merged.current_context())
    except (ConfigError, OSError):
        return None
    body = context.entry.get("context")
    return dict(body) if isinstance(body, dict) else None


def current_context_name(paths: str) -> str | None:
    """The name of a kubeconfig's current context, None if it has none (or cannot be read)."""
    try:
        return _Merged.read(paths).current_context()
    except (ConfigError, OSError):
        return None


# ---- kubeconfig files ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Named:
    """A named entry of a kubeconfig section, with the folder of the file that holds it."""

    entry: dict[str, Any]
    folder: Path

    def body(self, key: str) -> dict[str, Any]:
        value = self.entry.get(key) or {}
        if not isinstance(value, dict):
            raise ConfigError(f"kubeconfig: {key} {self.entry.get('name')!r} is not a mapping")
        return value

    def path(self, value: object) -> str:
        """A path in this entry: relative to the file that holds it, as kubectl reads it."""
        return os.path.normpath(self.folder / Path(str(value)).expanduser())


@dataclass
class _Merged:
    """One or more kubeconfig files merged as kubectl merges a KUBECONFIG list: for every value and
    every named entry, the first file that sets it wins."""

    documents: list[tuple[Path, dict[str, Any]]]

    @classmethod
    def read(cls, paths: str) -> _Merged:
        import yaml  # noqa: PLC0415 (in a Pod without a kubeconfig, no YAML is read at all)

        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when the wheel has it
        documents: list[tuple[Path, dict[str, Any]]] = []
        for name in paths.split(os.pathsep):
            if not name:
                continue
            file = Path(name).expanduser()
            if not file.exists():
                continue  # as kubectl: a KUBECONFIG list may name files that do not exist
            try:
                document = yaml.load(file.read_text(), Loader=loader)
            except yaml.YAMLError as exc:
                raise ConfigError(f"kubeconfig {file} is not valid YAML: {exc}") from None
            if not isinstance(document, dict):
                raise ConfigError(f"kubeconfig {file} is empty or not a mapping")
            documents.append((file.absolute(), document))
        if not documents:
            raise ConfigError(f"no kubeconfig found at {paths}")
        return cls(documents)

    def current_context(self) -> str:
        for _, document in self.documents:
            if document.get("current-context"):
                return str(document["current-context"])
        raise ConfigError("the kubeconfig has no current-context")

    def find(self, section: str, name: object) -> _Named | None:
        for file, document in self.documents:
            for entry in document.get(section) or []:
                if isinstance(entry, dict) and entry.get("name") == name:
                    return _Named(entry, file.parent)
        return None

    def named(self, section: str, name: object) -> _Named:
        found = self.find(section, name)
        if found is None:
            raise ConfigError(f"the kubeconfig has no entry named {name!r} in {section}")
        return found


def _from_kubeconfig(paths: str, chosen: str | None = None) -> Configuration:
    merged = _Merged.read(paths)
    context = merged.named("contexts", chosen or merged.current_context()).body("context")
    cluster_entry = merged.named("clusters", context.get("cluster"))
    user_entry = merged.find("users", context.get("user")) if context.get("user") else None
    user = user_entry.body("user") if user_entry else {}
    if "auth-provider" in user or ("exec" in user and not (user.get("token") or user.get("tokenFile"))):
        return _from_official_loader(paths, chosen)
    cluster = cluster_entry.body("cluster")
    if not cluster.get("server"):
        raise ConfigError(f"cluster {cluster_entry.entry.get('name')!r} of the kubeconfig has no server")
    configuration = Configuration(host=str(cluster["server"]).rstrip("/"))
    if configuration.host.startswith("https"):
        if cluster.get("certificate-authority-data"):
            configuration.ca_data = _decoded(cluster["certificate-authority-data"]).decode()
        elif cluster.get("certificate-authority"):
            configuration.ca_file = _existing(cluster_entry.path(cluster["certificate-authority"]))
        if user_entry is not None:
            _client_certificate(configuration, user_entry, user)
    if "insecure-skip-tls-verify" in cluster:
        configuration.verify_ssl = not cluster["insecure-skip-tls-verify"]
    if cluster.get("tls-server-name"):
        configuration.tls_server_name = str(cluster["tls-server-name"])
    if user_entry is not None:
        configuration.authorization = _authorization(user_entry, user)
    return configuration


def _client_certificate(configuration: Configuration, entry: _Named, user: dict[str, Any]) -> None:
    if user.get("client-certificate-data"):
        configuration.cert_data = _decoded(user["client-certificate-data"])
    elif user.get("client-certificate"):
        configuration.cert_file = _existing(entry.path(user["client-certificate"]))
    if user.get("client-key-data"):
        configuration.key_data = _decoded(user["client-key-data"])
    elif user.get("client-key"):
        configuration.key_file = _existing(entry.path(user["client-key"]))


def _authorization(entry: _Named, user: dict[str, Any]) -> Callable[[], str | None]:
    """A tokenFile (followed: read again when it changes) before a token, as client-go does; else
    basic credentials; else none."""
    if user.get("tokenFile"):
        return _TokenFile(Path(entry.path(user["tokenFile"])))
    if user.get("token"):
        header = f"Bearer {user['token']}"
        return lambda: header
    if "username" in user and "password" in user:
        basic = base64.b64encode(f"{user['username']}:{user['password']}".encode()).decode()
        return lambda: f"Basic {basic}"
    return lambda: None


def _decoded(data: object) -> bytes:
    try:
        return base64.b64decode(str(data), validate=False)
    except ValueError as exc:
        raise ConfigError(f"kubeconfig: inline data is not base64: {exc}") from None


def _existing(path: str) -> str:
    if not os.path.isfile(path):
        raise ConfigError(f"kubeconfig: file does not exist: {path}")
    return path


def _from_official_loader(paths: str, context: str | None) -> Configuration:
    """An exec credential plugin or an auth provider: the official client's loader runs and renews
    them (imported here only: the rest of agentrun never loads it)."""
    from kubernetes import client, config  # noqa: PLC0415

    official = client.Configuration()
    try:
        config.load_kube_config(config_file=paths, context=context, client_configuration=official)
    except config.ConfigException as exc:
        raise ConfigError(str(exc)) from None
    return Configuration(
        host=official.host,
        ca_file=official.ssl_ca_cert or None,
        cert_file=official.cert_file or None,
        key_file=official.key_file or None,
        verify_ssl=official.verify_ssl,
        tls_server_name=getattr(official, "tls_server_name", None) or None,
        authorization=lambda: official.get_api_key_with_prefix("authorization") or None,
    )


# ---- the Pod's service account ----------------------------------------------------------------------


def _in_cluster(env: Mapping[str, str], account: Path = SERVICE_ACCOUNT_DIR) -> Configuration:
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ConfigError(
            "no kubeconfig (KUBECONFIG, ~/.kube/config) and not in a Pod: "
            "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set"
        )
    token, ca = account / "token", account / "ca.crt"
    if not token.is_file() or not token.read_text():
        raise ConfigError(f"the service-account token {token} does not exist or is empty")
    if not ca.is_file() or not ca.read_text():
        raise ConfigError(f"the service-account CA {ca} does not exist or is empty")
    server = f"[{host}]" if ":" in host or "%" in host else host  # an IPv6 address
    return Configuration(host=f"https://{server}:{port}", ca_file=str(ca), authorization=_TokenFile(token))


# ---- a token file, followed -------------------------------------------------------------------------

# How often a followed token file's modification time is looked at: the header is asked for at every
# request, and a stat per request was 1 % of the operator's CPU; a rotated token stays valid long past
# its successor.
TOKEN_FILE_CHECK_SECONDS: Final = 1.0
# A module attribute, for tests.
_clock = time.monotonic  # clock-exempt: kubeauth is below agentrun.clock in the layers


class _TokenFile:
    """The bearer token in a file, read again whenever the file's modification time changes (a rotated
    bound token), looked at most once a TOKEN_FILE_CHECK_SECONDS. A file caught while it is replaced is
    tried again at the next request; meanwhile the token read last is sent."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.header: str | None = f"Bearer {path.read_text().strip()}"
        except OSError as exc:
            raise ConfigError(f"kubeconfig: cannot read the tokenFile {path}: {exc}") from None
        self.mtime: float | None = None  # of the token read last (None: read again at the first request)
        self.checked: float | None = None  # when the file was last looked at

    def __call__(self) -> str | None:
        now = _clock()
        if self.checked is not None and now - self.checked < TOKEN_FILE_CHECK_SECONDS:
            return self.header
        self.checked = now
        mtime = _mtime(self.path)
        if mtime == self.mtime:
            return self.header
        try:
            token = self.path.read_text().strip()
        except OSError:
            self.checked = None  # being replaced: the next request reads it
            return self.header
        self.mtime = mtime
        self.header = f"Bearer {token}"
        return self.header


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


# ---- the transport's view -------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """What the HTTP transport needs from a Configuration."""

    base_url: str
    ssl: ssl.SSLContext | bool
    server_hostname: str | None
    proxy: str | None
    configuration: Configuration

    @classmethod
    def of(cls, configuration: Configuration) -> Endpoint:
        tls: ssl.SSLContext | bool = True
        if configuration.host.startswith("https"):
            tls = ssl.create_default_context(
                cafile=configuration.ca_file or None, cadata=configuration.ca_data or None
            )
            if not configuration.verify_ssl:
                tls.check_hostname = False
                tls.verify_mode = ssl.CERT_NONE
            _load_client_certificate(tls, configuration)
        return cls(
            base_url=configuration.host.rstrip("/"),
            ssl=tls,
            server_hostname=configuration.tls_server_name or None,
            proxy=configuration.proxy or None,
            configuration=configuration,
        )

    def headers(self) -> dict[str, Any]:
        """The Authorization header now (a followed token file's newest token, a renewed one)."""
        token = self.configuration.authorization()
        return {"Authorization": token} if token else {}


def _load_client_certificate(tls: ssl.SSLContext, configuration: Configuration) -> None:
    """Files as they are; inline data through a private temporary folder, gone once loaded."""
    if not (configuration.cert_file or configuration.cert_data):
        return
    with tempfile.TemporaryDirectory(prefix="agentrun-") as folder:
        cert = configuration.cert_file or _written(Path(folder) / "cert", configuration.cert_data)
        key = configuration.key_file or (
            _written(Path(folder) / "key", configuration.key_data) if configuration.key_data else None
        )
        tls.load_cert_chain(cert, key)


def _written(path: Path, data: bytes | None) -> str:
    path.touch(mode=0o600)
    path.write_bytes(data or b"")
    return str(path)
