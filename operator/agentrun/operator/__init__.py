"""The agentrun operator: kopf watches feed a cache and a work queue; each Run is reconciled by asking
agentrun.core.runs.decide what to write, and writing it through agentrun.kubeapi."""
