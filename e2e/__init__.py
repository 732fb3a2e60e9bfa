"""Cluster tests for txnkeeper and the local control plane they run on (see e2e/README.md)."""
