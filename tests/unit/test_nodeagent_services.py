"""The process node's stand-in for Service links: the variables the kubelet sets for a namespace's
Services, pointed at this machine (no kube-proxy, one shared network)."""

from __future__ import annotations

from typing import Any

from devcluster.nodeagent.podenv import service_environment


def service(name: str, namespace: str = "agents", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec}


def test_a_service_with_a_selector_points_at_the_port_its_pods_listen_on() -> None:
    tickets = service(
        "tickets",
        selector={"app": "tickets"},
        clusterIP="10.0.0.42",
        ports=[{"name": "http", "port": 80, "targetPort": 8088}, {"name": "admin-api", "port": 9000}],
    )
    assert service_environment([tickets]) == {
        "TICKETS_SERVICE_HOST": "127.0.0.1",
        "TICKETS_SERVICE_PORT": "8088",
        "TICKETS_SERVICE_PORT_HTTP": "8088",
        "TICKETS_SERVICE_PORT_ADMIN_API": "9000",
    }


def test_dashes_become_underscores() -> None:
    env = service_environment(
        [service("ticket-db", selector={"a": "b"}, clusterIP="10.0.0.3", ports=[{"port": 5}])]
    )
    assert env == {"TICKET_DB_SERVICE_HOST": "127.0.0.1", "TICKET_DB_SERVICE_PORT": "5"}


def test_services_no_pod_here_can_answer_for_are_left_out() -> None:
    services = [
        service("kubernetes", "default", selector={"a": "b"}, clusterIP="10.0.0.1", ports=[{"port": 443}]),
        service("headless", selector={"a": "b"}, clusterIP="None", ports=[{"port": 1}]),
        service("external", clusterIP="10.0.0.5", ports=[{"port": 2}]),  # no selector: endpoints elsewhere
        service("named", selector={"a": "b"}, clusterIP="10.0.0.6", ports=[{"port": 3, "targetPort": "web"}]),
    ]
    assert service_environment(services) == {}
