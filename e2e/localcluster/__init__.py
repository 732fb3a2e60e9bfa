"""A local Kubernetes control plane without containers.

Why it exists: kind needs a Docker engine, which these machines lack, yet the operator must be proven
against a real API server. This package starts etcd (Debian package) and kube-apiserver,
kube-controller-manager and kube-scheduler (built from the Go module proxy), plus a one-node "kubelet"
written here that runs each pod's containers as local processes.
"""
