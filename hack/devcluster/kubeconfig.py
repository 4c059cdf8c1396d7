"""Writing kubeconfig files (plain YAML, so every client — kubectl, kopf, the Python client — reads them)."""

from __future__ import annotations

from pathlib import Path

import yaml


def write_kubeconfig(
    path: Path,
    server: str,
    ca_path: Path,
    user: str,
    *,
    client_cert: Path | None = None,
    client_key: Path | None = None,
    token_file: Path | None = None,
    namespace: str = "default",
) -> Path:
    credentials: dict[str, str] = {}
    if client_cert and client_key:
        credentials = {"client-certificate": str(client_cert), "client-key": str(client_key)}
    if token_file:
        credentials["tokenFile"] = str(token_file)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "devcluster", "cluster": {"server": server, "certificate-authority": str(ca_path)}}
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [
            {"name": "devcluster", "context": {"cluster": "devcluster", "user": user, "namespace": namespace}}
        ],
        "current-context": "devcluster",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
