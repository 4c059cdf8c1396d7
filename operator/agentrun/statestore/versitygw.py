"""The bundled object store: versitygw (Apache-2.0, an S3-compatible gateway in one process) serving a
posix directory with object versioning and its internal IAM. One definition of how it is started, for the
local control plane (hack/devcluster/objectstore.py runs the binary hack/build-versitygw.sh builds) and
for the Helm chart (agentrun.deploy.generate writes the StatefulSet that runs the upstream image): the same
version, flags, directories and bucket. The bucket is created and versioned by whoever holds the root
credentials (agentrun.statestore.principals.BundledStore.prepare_bucket): the local control plane at its
start, the chart's operator at its own.
"""

from __future__ import annotations

from typing import Final

# The pinned release: hack/build-versitygw.sh builds its Go module at this version (it reads this line),
# and the chart runs the upstream image of the same tag.
VERSION: Final = "v1.8.0"
IMAGE: Final = "ghcr.io/versity/versitygw"
BUCKET: Final = "agentrun"
REGION: Final = "us-east-1"
HEALTH_PATH: Final = "/health"
PORT: Final = 7070  # the chart's (the local control plane binds a free port on loopback)
# The server's root credentials come from its environment, never its command line (`ps` shows that).
ROOT_ACCESS_KEY_ENV: Final = "ROOT_ACCESS_KEY_ID"
ROOT_SECRET_KEY_ENV: Final = "ROOT_SECRET_ACCESS_KEY"
# Under its data directory: the buckets (the posix backend's root), every overwritten or deleted object's
# earlier versions, and the internal IAM (a user per agent namespace). Each must exist before it starts.
BUCKETS_DIR: Final = "buckets"
VERSIONS_DIR: Final = "versions"
IAM_DIR: Final = "iam"
DATA_DIRS: Final = (BUCKETS_DIR, VERSIONS_DIR, IAM_DIR)


def server_args(*, listen: str, data_dir: str) -> list[str]:
    """versitygw's arguments (after the binary): listening on `listen` (HOST:PORT, or :PORT for every
    address), its data under `data_dir`."""
    data = data_dir.rstrip("/")
    return [
        f"--port={listen}",
        f"--health={HEALTH_PATH}",
        f"--region={REGION}",
        "--quiet",
        # Its internal IAM: a user per agent namespace (agentrun.statestore.principals).
        f"--iam-dir={data}/{IAM_DIR}",
        "posix",
        # Versioning keeps every overwritten or deleted object's earlier versions here.
        f"--versioning-dir={data}/{VERSIONS_DIR}",
        f"{data}/{BUCKETS_DIR}",
    ]
