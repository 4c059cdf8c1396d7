"""A real Kubernetes control plane run as local processes, for tests and the demo.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler are the upstream binaries built by
hack/build-control-plane.sh; only the kubelet is replaced, by the process-backed node agent in
``devcluster.nodeagent``.
"""
