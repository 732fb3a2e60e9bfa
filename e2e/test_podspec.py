"""The pod-spec rules the local node applies ($(VAR) expansion, downward API, command lookup), checked
without a cluster: these are the Kubernetes API's documented semantics, so they are worth pinning."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.localcluster.podspec import ConfigError, expand, field_ref, resolve_command, resource_field_ref


def test_expand_follows_kubernetes_rules() -> None:
    env = {"A": "1", "B": "x$(A)"}
    assert expand("$(A)-$(B)", env) == "1-x$(A)"  # no recursive expansion
    assert expand("$$(A)", env) == "$(A)"  # $$ escapes
    assert expand("$(MISSING)", env) == "$(MISSING)"  # undefined stays literal
    assert expand("cost $5 and $", env) == "cost $5 and $"  # lone $ stays
    assert expand("$(A", env) == "$(A"  # unterminated reference stays


def test_field_refs() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"a": "b"}, "annotations": {}},
        "spec": {"nodeName": "n", "serviceAccountName": "sa"},
        "status": {"podIP": "127.0.0.9", "hostIP": "127.0.0.1"},
    }
    assert field_ref(pod, "status.podIP") == "127.0.0.9"
    assert field_ref(pod, "metadata.labels['a']") == "b"
    assert field_ref(pod, "metadata.labels") == 'a="b"'
    with pytest.raises(ConfigError):
        field_ref(pod, "spec.bogus")


def test_resource_field_ref_rounds_up_by_divisor() -> None:
    container = {"resources": {"limits": {"memory": "256Mi", "cpu": "500m"}}}
    assert resource_field_ref(container, {"resource": "limits.memory", "divisor": "1Mi"}, {}) == "256"
    assert resource_field_ref(container, {"resource": "limits.cpu"}, {}) == "1"
    assert resource_field_ref({}, {"resource": "limits.cpu"}, {"cpu": "2"}) == "2"


def test_commands_missing_on_this_machine_map_to_path(tmp_path: Path) -> None:
    exe = tmp_path / "txnkeeper"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    env = {"PATH": str(tmp_path)}
    assert resolve_command("/opt/venv/bin/txnkeeper", env) == str(exe)
    assert resolve_command("txnkeeper", env) == str(exe)
    with pytest.raises(FileNotFoundError):
        resolve_command("nope", env)
