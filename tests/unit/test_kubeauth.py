"""Reading a kubeconfig (and the Pod's service account) as kubectl does, without the official client."""

from __future__ import annotations

import base64
import datetime
import ssl
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agentrun import kubeauth
from agentrun.kubeauth import ConfigError, Endpoint, active_context, load_configuration


def _write(path: Path, document: dict[str, Any]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document))
    return str(path)


def _config(cluster: dict[str, Any], user: dict[str, Any], **context: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u", **context}}],
        "current-context": "ctx",
    }


def _pem_pair() -> tuple[bytes, bytes]:
    """A self-signed certificate and its key, PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "agentrun-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_the_server_and_an_inline_ca_make_a_verifying_tls_context(tmp_path: Path) -> None:
    cert, _ = _pem_pair()
    path = _write(
        tmp_path / "kubeconfig",
        _config(
            {"server": "https://10.0.0.1:6443/", "certificate-authority-data": _b64(cert)}, {"token": "t"}
        ),
    )
    endpoint = Endpoint.of(load_configuration(path))

    assert endpoint.base_url == "https://10.0.0.1:6443"
    assert isinstance(endpoint.ssl, ssl.SSLContext)
    assert endpoint.ssl.verify_mode == ssl.CERT_REQUIRED and endpoint.ssl.check_hostname
    assert [c["subject"] for c in endpoint.ssl.get_ca_certs()] == [((("commonName", "agentrun-test"),),)]
    assert endpoint.headers() == {"Authorization": "Bearer t"}


def test_files_are_relative_to_the_kubeconfig_that_names_them(tmp_path: Path) -> None:
    cert, key = _pem_pair()
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "ca.crt").write_bytes(cert)
    (tmp_path / "pki" / "me.crt").write_bytes(cert)
    (tmp_path / "pki" / "me.key").write_bytes(key)
    cluster = {"server": "https://h:1", "certificate-authority": "pki/ca.crt"}
    user = {"client-certificate": "pki/me.crt", "client-key": "pki/me.key"}
    configuration = load_configuration(_write(tmp_path / "kubeconfig", _config(cluster, user)))

    assert (configuration.ca_file, configuration.cert_file, configuration.key_file) == tuple(
        str(tmp_path / "pki" / name) for name in ("ca.crt", "me.crt", "me.key")
    )
    assert Endpoint.of(configuration).headers() == {}  # a client certificate: no header


def test_inline_client_credentials_are_loaded_and_leave_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = _pem_pair()
    _, other_key = _pem_pair()
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    user = {"client-certificate-data": _b64(cert), "client-key-data": _b64(key)}
    path = _write(tmp_path / "kubeconfig", _config({"server": "https://h:1"}, user))

    assert isinstance(Endpoint.of(load_configuration(path)).ssl, ssl.SSLContext)
    assert list((tmp_path / "tmp").iterdir()) == []
    mismatched = {**user, "client-key-data": _b64(other_key)}  # proof that the pair is really loaded
    path = _write(tmp_path / "kubeconfig", _config({"server": "https://h:1"}, mismatched))
    with pytest.raises(ssl.SSLError):
        Endpoint.of(load_configuration(path))


def test_insecure_skip_tls_verify_and_tls_server_name(tmp_path: Path) -> None:
    cluster = {"server": "https://h:1", "insecure-skip-tls-verify": True, "tls-server-name": "api.internal"}
    endpoint = Endpoint.of(load_configuration(_write(tmp_path / "k", _config(cluster, {"token": "t"}))))

    assert isinstance(endpoint.ssl, ssl.SSLContext)
    assert (endpoint.ssl.verify_mode, endpoint.ssl.check_hostname) == (ssl.CERT_NONE, False)
    assert endpoint.server_hostname == "api.internal"


def test_username_and_password_are_basic_credentials(tmp_path: Path) -> None:
    user = {"username": "admin", "password": "s3cret"}
    endpoint = Endpoint.of(load_configuration(_write(tmp_path / "k", _config({"server": "http://h"}, user))))
    assert endpoint.headers() == {"Authorization": f"Basic {_b64(b'admin:s3cret')}"}


def test_a_token_file_wins_over_an_inline_token(tmp_path: Path) -> None:
    """As client-go: the file's token is the one sent (it rotates; the inline one cannot)."""
    (tmp_path / "token").write_text("from-file\n")
    user = {"token": "inline", "tokenFile": "token"}
    endpoint = Endpoint.of(load_configuration(_write(tmp_path / "k", _config({"server": "http://h"}, user))))
    assert endpoint.headers() == {"Authorization": "Bearer from-file"}


def test_the_first_file_of_a_list_sets_the_current_context_and_its_namespace(tmp_path: Path) -> None:
    first = _config({"server": "http://first"}, {"token": "a"}, namespace="team-a")
    second = _config({"server": "http://second"}, {"token": "b"}, namespace="team-b")
    second["contexts"].append({"name": "other", "context": {"cluster": "c", "user": "u"}})
    second["current-context"] = "other"
    paths = ":".join([_write(tmp_path / "a", first), _write(tmp_path / "b", second)])

    assert Endpoint.of(load_configuration(paths)).base_url == "http://first"
    assert active_context(paths) == {"cluster": "c", "user": "u", "namespace": "team-a"}


def test_files_of_a_list_that_do_not_exist_are_skipped(tmp_path: Path) -> None:
    path = _write(tmp_path / "k", _config({"server": "http://h"}, {"token": "t"}))
    assert load_configuration(f"{tmp_path / 'missing'}:{path}").host == "http://h"


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({**_config({"server": "http://h"}, {}), "current-context": None}, "no current-context"),
        ({**_config({"server": "http://h"}, {}), "current-context": "nope"}, "no entry named 'nope'"),
        (_config({}, {"token": "t"}), "has no server"),
        (_config({"server": "http://h"}, {"tokenFile": "absent"}), "cannot read the tokenFile"),
        (_config({"server": "https://h", "certificate-authority": "absent"}, {}), "does not exist"),
    ],
    ids=["no-current-context", "unknown-context", "no-server", "missing-token-file", "missing-ca"],
)
def test_a_kubeconfig_that_does_not_say_where_or_who_is_a_clear_error(
    tmp_path: Path, document: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_configuration(_write(tmp_path / "k", document))


def test_no_kubeconfig_at_all_is_a_clear_error_and_no_context(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("")
    with pytest.raises(ConfigError, match="empty"):
        load_configuration(str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="no kubeconfig found"):
        load_configuration(str(tmp_path / "missing"))
    assert active_context(str(tmp_path / "missing")) is None


def _service_account(tmp_path: Path, token: str = "sa-token") -> Path:
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(token)
    (account / "ca.crt").write_bytes(_pem_pair()[0])
    return account


@pytest.mark.parametrize(
    ("host", "url"), [("10.96.0.1", "https://10.96.0.1:443"), ("fd00::1", "https://[fd00::1]:443")]
)
def test_in_a_pod_the_service_account_is_who_we_are(tmp_path: Path, host: str, url: str) -> None:
    account = _service_account(tmp_path)
    env = {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": "443"}
    configuration = kubeauth._in_cluster(env, account)

    assert (configuration.host, configuration.ca_file) == (url, str(account / "ca.crt"))
    assert Endpoint.of(configuration).headers() == {"Authorization": "Bearer sa-token"}


def test_outside_a_pod_without_a_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="KUBERNETES_SERVICE_HOST"):
        kubeauth._in_cluster({}, _service_account(tmp_path))
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(ConfigError, match="token"):
        kubeauth._in_cluster(env, tmp_path / "nowhere")


EXEC_PLUGIN = """
import json, os, sys
spec = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
print(json.dumps({"apiVersion": spec["apiVersion"], "kind": "ExecCredential",
                  "status": {"token": "from-plugin-" + os.environ["PLUGIN_SUFFIX"]}}))
"""


def test_an_exec_plugin_is_run_by_the_official_loader(tmp_path: Path) -> None:
    (tmp_path / "plugin.py").write_text(EXEC_PLUGIN)
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(tmp_path / "plugin.py")],
            "env": [{"name": "PLUGIN_SUFFIX", "value": "42"}],
            "interactiveMode": "Never",
        }
    }
    endpoint = Endpoint.of(load_configuration(_write(tmp_path / "k", _config({"server": "http://h"}, user))))
    assert endpoint.headers() == {"Authorization": "Bearer from-plugin-42"}
