"""Cluster tests for txnkeeper on kind, and the scripts that build the cluster (see e2e/README.md)."""
