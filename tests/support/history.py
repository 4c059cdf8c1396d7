"""The release before the state store, built from this repository's history for the version-skew tests:
its agent SDK (and operator) as a directory to put first on a PYTHONPATH, its Helm chart as a directory to
install and upgrade from. "Before" is the parent of the commit that added the state store's references to
the API (agentrun/api/blobref.py): the last agentrun whose objects held no reference into a store."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REFERENCES_ADDED_IN = "operator/agentrun/api/blobref.py"


def _git(*args: str) -> bytes:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, check=True).stdout


def previous_release() -> str:
    """The commit of the release before the state store (see the module's docstring)."""
    added = _git("log", "--format=%H", "--diff-filter=A", "--", REFERENCES_ADDED_IN).decode().split()
    assert added, f"{REFERENCES_ADDED_IN} was never added: is this a shallow clone?"
    return added[-1] + "^"


def extract(path: str, destination: Path, commit: str | None = None) -> Path:
    """`path` of the repository at `commit` (default: the previous release), extracted under
    `destination`: returns destination/path."""
    archive = _git("archive", commit or previous_release(), path)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(destination, filter="data")
    return destination / path


def previous_sdk(destination: Path) -> Path:
    """The previous release's package, for PYTHONPATH: `import agentrun` finds it first."""
    package = extract("operator/agentrun", destination).parent
    assert not (package / "agentrun" / "api" / "blobref.py").exists()
    return package


def previous_chart(destination: Path) -> Path:
    """The previous release's Helm chart, as a directory `helm install` takes."""
    return extract("charts/agentrun", destination)
