"""The kubelet's containerLogs endpoint, so that `pods/log` through the API server works on this node.

The API server proxies `GET /api/v1/namespaces/{ns}/pods/{pod}/log` to the Node's kubelet endpoint
(status.daemonEndpoints.kubeletEndpoint.Port at its InternalIP): `/containerLogs/{ns}/{pod}/{container}`
with tailLines, limitBytes and follow. It is served over HTTPS with a certificate of the cluster's CA, and
only to the API server's kubelet client certificate (a real kubelet asks the API server whether the
caller may; here only the API server can present that certificate). Each container's output is the file
the runner writes it to; it goes with the Pod's sandbox when the Pod is deleted, as on a real node.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Final

from aiohttp import web

# Who may read logs: the API server, with the client certificate it uses for kubelets.
KUBELET_CLIENT: Final = "kube-apiserver-kubelet-client"
FOLLOW_POLL_SECONDS: Final = 0.5
_BLOCK: Final = 64 * 1024

# (namespace, pod, container) -> the container's log file and whether it may still grow; None: no such
# container on this node.
Locate = Callable[[str, str, str], tuple[Path, Callable[[], bool]] | None]


def last_lines(path: Path, count: int) -> bytes:
    """The last `count` lines of a file (a last line without its newline counts), reading from its end."""
    with path.open("rb") as f:
        f.seek(0, 2)
        end = position = f.tell()
        data = b""
        while position > 0 and data.count(b"\n") <= count:
            step = min(_BLOCK, position)
            position -= step
            f.seek(position)
            data = f.read(step) + data
    lines = data.splitlines(keepends=True) if end else []
    return b"".join(lines[-count:]) if count > 0 else b""


def selected(path: Path, tail_lines: int | None, limit_bytes: int | None) -> bytes:
    """What the kubelet sends: the last tailLines lines (all without), at most limitBytes from their start."""
    if not path.exists():
        return b""
    data = path.read_bytes() if tail_lines is None else last_lines(path, tail_lines)
    return data if limit_bytes is None else data[:limit_bytes]


def _number(request: web.Request, name: str) -> int | None:
    value = request.query.get(name)
    if value is None or value == "":
        return None
    try:
        parsed = int(value)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name} must be an integer") from None
    if parsed < 0:
        raise web.HTTPBadRequest(text=f"{name} must not be negative")
    return parsed


class ContainerLogServer:
    def __init__(self, locate: Locate, cert: Path, key: Path, client_ca: Path) -> None:
        self.locate = locate
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(client_ca))
        self.context.load_cert_chain(cert, key)
        self.context.verify_mode = ssl.CERT_REQUIRED
        self._runner: web.AppRunner | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Starts serving; returns the port (0: any free one)."""
        app = web.Application()
        app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self.container_logs)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=self.context)
        await site.start()
        return int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def container_logs(self, request: web.Request) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        subject = (peer or {}).get("subject", ())
        names = [value for rdn in subject for key, value in rdn if key == "commonName"]
        if KUBELET_CLIENT not in names:
            raise web.HTTPForbidden(text="only the API server reads container logs here")
        ns, pod, container = (request.match_info[k] for k in ("namespace", "pod", "container"))
        tail_lines, limit_bytes = _number(request, "tailLines"), _number(request, "limitBytes")
        found = self.locate(ns, pod, container)
        if found is None:
            raise web.HTTPNotFound(text=f'container "{container}" of pod "{ns}/{pod}" is not on this node')
        path, running = found
        data = selected(path, tail_lines, limit_bytes)
        if request.query.get("follow") not in ("true", "1"):
            return web.Response(body=data, content_type="text/plain")
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        await response.write(data)
        sent = path.stat().st_size if path.exists() else 0
        while running() or (path.exists() and path.stat().st_size > sent):
            if path.exists() and path.stat().st_size > sent:
                with path.open("rb") as f:
                    f.seek(sent)
                    more = f.read()
                sent += len(more)
                await response.write(more)
            else:
                await asyncio.sleep(FOLLOW_POLL_SECONDS)
        await response.write_eof()
        return response
