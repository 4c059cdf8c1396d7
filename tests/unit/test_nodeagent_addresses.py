"""The process node gives each Pod a loopback address of its own, so Pods that listen do not clash."""

from __future__ import annotations

import ipaddress
import socket

from devcluster.nodeagent.podenv import field_value, pod_ip


def pod(uid: str) -> dict[str, object]:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": uid}, "spec": {}, "status": {}}


def test_each_pod_gets_its_own_stable_loopback_address() -> None:
    addresses = {pod_ip(pod(f"uid-{n}")) for n in range(500)}
    assert len(addresses) == 500
    assert all(ipaddress.ip_address(a).is_loopback for a in addresses)
    assert pod_ip(pod("uid-1")) == pod_ip(pod("uid-1"))
    assert field_value(pod("uid-1"), "status.podIP") == pod_ip(pod("uid-1"))


def test_two_pods_listen_on_one_port_each_on_its_own_address() -> None:
    first, second = socket.socket(), socket.socket()
    try:
        first.bind((pod_ip(pod("replica-a")), 0))
        port = first.getsockname()[1]
        second.bind((pod_ip(pod("replica-b")), port))  # would be EADDRINUSE on one shared address
        first.listen()
        second.listen()
    finally:
        first.close()
        second.close()
