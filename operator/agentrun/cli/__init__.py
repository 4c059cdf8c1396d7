"""The kubectl plugin `kubectl agentrun` (console script kubectl-agentrun = agentrun.cli:main).

Layout: app (the command line, exit codes), commands/ (one module per area), cluster (every read, write
and wait, through KubeApi), config (kubeconfig and its namespace), controls (the control requests: default
keys, local checks, patches), render and timeline (text for people), output (text or the raw objects), errors.
"""

from agentrun.cli.app import main

__all__ = ["main"]
