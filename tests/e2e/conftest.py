"""Fixtures of the end-to-end tests: the real Kubernetes control plane is shared by the session."""

from tests.e2e.kube_harness import kube_cluster

__all__ = ["kube_cluster"]
