"""agentrun: a durable runtime for AI-agent work on Kubernetes.

Subpackages: ``api`` (the CRD models, single source of the schemas), ``core`` (pure decisions),
``operator`` (kopf handlers), ``worker`` (the SDK used inside attempt Pods), ``cli`` (kubectl plugin).
"""
