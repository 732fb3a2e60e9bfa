"""Tests of the Spark verifier (a package so module names never clash with other test folders)."""
