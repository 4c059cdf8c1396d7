"""Deploying agentrun: the Helm chart's values model, the generator of the chart's generated parts and
of manifests/, and the check `helm test` runs."""
