"""Where the plugin talks to: the kubeconfig (as kubectl reads it) and its context's namespace."""

from __future__ import annotations

import os
from pathlib import Path

from agentrun.kubeapi import KubeApi
from agentrun.kubeauth import active_context, current_context_name, load_configuration

IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def kubeconfig_path(explicit: str | None) -> str | None:
    """--kubeconfig, else $KUBECONFIG (a list like kubectl's), else ~/.kube/config when it exists."""
    if explicit:
        return explicit
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"]
    default = os.path.expanduser("~/.kube/config")
    return default if os.path.exists(default) else None


def default_namespace(kubeconfig: str | None, context: str | None = None) -> str:
    """The current (or chosen) context's namespace, the service account's inside a Pod, else "default"."""
    path = kubeconfig_path(kubeconfig)
    if path:
        namespace = (active_context(path, context) or {}).get("namespace")
        return str(namespace) if namespace else "default"
    if IN_CLUSTER_NAMESPACE.exists():
        return IN_CLUSTER_NAMESPACE.read_text().strip() or "default"
    return "default"


def context_user(kubeconfig: str | None, context: str | None = None) -> str | None:
    """The user name of the current (or chosen) kubeconfig context (a fallback for who resolved a side
    effect)."""
    path = kubeconfig_path(kubeconfig)
    if not path:
        return None
    user = (active_context(path, context) or {}).get("user")
    return str(user) if user else None


def other_context(kubeconfig: str | None, context: str | None) -> str | None:
    """`context` when it is not the kubeconfig's current one (so a printed command must name it)."""
    if not context:
        return None
    path = kubeconfig_path(kubeconfig)
    return None if path and current_context_name(path) == context else context


def connect(kubeconfig: str | None, context: str | None = None) -> KubeApi:
    return KubeApi(load_configuration(kubeconfig_path(kubeconfig), context), threads=4)
