"""Certificates and keys for the local control plane.

One CA signs the API server's serving certificate and every client certificate; the identities follow
the upstream conventions so the API server's RBAC and Node authorizers treat each component as they
would in a real cluster.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class ClientIdentity:
    """A client certificate: the CN is the user name, each O is a group."""

    file_stem: str
    common_name: str
    organizations: tuple[str, ...] = ()


def node_identity(node_name: str) -> ClientIdentity:
    return ClientIdentity(f"node-{node_name}", f"system:node:{node_name}", ("system:nodes",))


ADMIN = ClientIdentity("admin", "agentrun-admin", ("system:masters",))
CONTROLLER_MANAGER = ClientIdentity("controller-manager", "system:kube-controller-manager")
SCHEDULER = ClientIdentity("scheduler", "system:kube-scheduler")
# The API server's client certificate towards kubelets (pods/log, exec...): the node agent serves logs to it.
KUBELET_CLIENT = ClientIdentity(
    "apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",)
)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


class CertificateAuthority:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.cert_path = directory / "ca.crt"
        key_path = directory / "ca.key"
        if self.cert_path.exists() and key_path.exists():
            self.key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
            self.cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
            return
        directory.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = _name("agentrun-devcluster-ca")
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )
        _write_key(key_path, self.key)
        self.cert_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def _issue(
        self,
        stem: str,
        subject: x509.Name,
        usage: x509.ObjectIdentifier,
        sans: list[x509.GeneralName] | None = None,
    ) -> tuple[Path, Path]:
        cert_path = self.directory / f"{stem}.crt"
        key_path = self.directory / f"{stem}.key"
        if cert_path.exists() and key_path.exists():
            return cert_path, key_path
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        assert isinstance(self.key, ec.EllipticCurvePrivateKey)
        cert = builder.sign(self.key, hashes.SHA256())
        _write_key(key_path, key)
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return cert_path, key_path

    def serving_cert(self, stem: str, dns_names: list[str], ips: list[str]) -> tuple[Path, Path]:
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        return self._issue(stem, _name(dns_names[0]), ExtendedKeyUsageOID.SERVER_AUTH, sans)

    def client_cert(self, identity: ClientIdentity) -> tuple[Path, Path]:
        subject = _name(identity.common_name, identity.organizations)
        return self._issue(identity.file_stem, subject, ExtendedKeyUsageOID.CLIENT_AUTH)


def service_account_keys(directory: Path) -> tuple[Path, Path]:
    """The RSA key pair that signs service-account tokens (private) and verifies them (public)."""
    private_path, public_path = directory / "sa.key", directory / "sa.pub"
    if not private_path.exists():
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        _write_key(private_path, key)
        public_path.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
    return private_path, public_path
