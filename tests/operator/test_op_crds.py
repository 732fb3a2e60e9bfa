"""The CRDs: generated files are committed and identical in the chart, valid for every supported
Kubernetes, explained field by field, and their CEL rules accept and reject what they claim to.

CEL rules are evaluated with cel-python on objects defaulted from the schema the way the API server
defaults them; the e2e suite then proves the same against a real kube-apiserver.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import kubernetes_validate
import pytest
import yaml
from celpy.adapter import json_to_cel

from txnkeeper_operator.crdgen import definitions, render

ROOT = Path(__file__).resolve().parents[2]
K8S_VERSIONS = [f"1.{minor}.0" for minor in range(29, 38)]


def _load(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "crds" / name).read_text())
    return doc


def _schema(name: str, part: str) -> dict[str, Any]:
    schema: dict[str, Any] = _load(name)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    properties: dict[str, Any] = schema["properties"][part]
    return properties


@pytest.mark.parametrize("name", sorted(definitions()))
def test_committed_crds_are_generated_and_identical_in_the_chart(name: str) -> None:
    expected = render(definitions()[name])
    assert (ROOT / "crds" / name).read_text() == expected, "run: python -m txnkeeper_operator.crdgen crds"
    assert (ROOT / "helm/txnkeeper/crds" / name).read_bytes() == (ROOT / "crds" / name).read_bytes()


def test_chart_has_no_other_crds() -> None:
    assert sorted(p.name for p in (ROOT / "helm/txnkeeper/crds").iterdir()) == sorted(definitions())


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", sorted(definitions()))
def test_crds_validate_strictly_on_every_supported_kubernetes(name: str, version: str) -> None:
    kubernetes_validate.validate(_load(name), version, strict=True)


def _walk(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for key, sub in (schema.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{key}")
    if "items" in schema:
        yield from _walk(schema["items"], f"{path}[]")


@pytest.mark.parametrize("name", sorted(definitions()))
def test_every_field_is_explained(name: str) -> None:
    root = _load(name)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    missing = [p for p, s in _walk(root, "") if p != ".metadata" and not s.get("description")]
    assert missing == []


def test_printer_columns_scale_and_short_names() -> None:
    for name, short in (("transactioncoordinators.yaml", "tc"), ("pendingackstores.yaml", "pas")):
        spec = _load(name)["spec"]
        assert spec["names"]["shortNames"] == [short]
        version = spec["versions"][0]
        columns = [c["name"] for c in version["additionalPrinterColumns"]]
        assert columns[:5] == ["Version", "Running", "Batch Log", "Phase", "Ready"] and columns[-1] == "Age"
        assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
        assert "status" in version["subresources"]


# ---- defaults and CEL, evaluated like the API server does ------------------------------------------


def _default(schema: dict[str, Any], value: Any) -> Any:
    if value is None and "default" in schema:
        value = copy.deepcopy(schema["default"])
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            defaulted = _default(sub, value.get(key))
            if defaulted is not None:
                value[key] = defaulted
    return value


def _rules(schema: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(path, schema, rule) for every CEL rule, with path as a list of property names."""
    for path, sub in _walk(schema, ""):
        for rule in sub.get("x-kubernetes-validations") or []:
            yield path, sub, rule


def _at(value: Any, path: str) -> Any:
    for key in [k for k in path.split(".") if k]:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def cel_errors(name: str, spec: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    schema = _schema(name, "spec")
    spec = _default(schema, copy.deepcopy(spec))
    old = _default(schema, copy.deepcopy(old)) if old is not None else None
    jsonschema.validate(spec, _plain(schema))
    env = celpy.Environment()
    errors = []
    for path, _sub, rule in _rules(schema):
        current = _at(spec, path)
        if current is None:
            continue
        activation = {"self": json_to_cel(current)}
        if "oldSelf" in rule["rule"]:
            previous = _at(old, path) if old is not None else None
            if previous is None:
                continue  # transition rules only run on update
            activation["oldSelf"] = json_to_cel(previous)
        if not env.program(env.compile(rule["rule"])).evaluate(activation):
            errors.append(rule["message"])
    return errors


def _plain(schema: Any) -> Any:
    """The schema as plain JSON Schema (drop Kubernetes extensions jsonschema does not know)."""
    if isinstance(schema, dict):
        return {k: _plain(v) for k, v in schema.items() if not k.startswith("x-kubernetes")}
    if isinstance(schema, list):
        return [_plain(v) for v in schema]
    return schema


TC = "transactioncoordinators.yaml"
PAS = "pendingackstores.yaml"


def test_minimal_resources_are_valid_and_defaulted() -> None:
    assert cel_errors(TC, {"version": "2.0.0"}) == []
    assert cel_errors(PAS, {"version": "1.0.0"}) == []
    spec = _default(_schema(TC, "spec"), {"version": "2.0.0"})
    assert spec["replicas"] == 3 and spec["coordinators"] == 16
    assert spec["batchedWrite"] == {
        "enabled": False,
        "maxRecords": 512,
        "maxSizeBytes": 4194304,
        "maxDelayMillis": 1,
    }
    assert spec["storage"]["size"] == "1Gi"


@pytest.mark.parametrize(
    ("name", "spec", "fragment"),
    [
        (TC, {"version": "1.2.0", "batchedWrite": {"enabled": True}}, "needs version 2.x"),
        (PAS, {"version": "1.2.0", "batchedWrite": {"enabled": True}}, "needs version 2.x"),
        (TC, {"version": "3.0.0"}, "known release line"),
        (TC, {"version": "2.0.0", "batchedWrite": {"enabled": True, "maxRecords": 1}}, "at least 2"),
        (TC, {"version": "2.0.0", "replicas": 5, "coordinators": 2}, "at least spec.replicas"),
    ],
)
def test_cel_rejects_with_a_message_that_says_what_to_fix(
    name: str, spec: dict[str, Any], fragment: str
) -> None:
    errors = cel_errors(name, spec)
    assert any(fragment in e for e in errors), errors


def test_schema_rejects_out_of_range_values() -> None:
    for bad in ({"version": "two"}, {"version": "2.0.0", "batchedWrite": {"maxRecords": 0}}):
        with pytest.raises(jsonschema.ValidationError):
            cel_errors(TC, bad)


def test_storage_and_coordinators_are_immutable() -> None:
    old = {"version": "2.0.0", "storage": {"size": "1Gi"}}
    assert cel_errors(TC, {**old, "version": "2.1.0"}, old) == []
    errors = cel_errors(TC, {"version": "2.0.0", "storage": {"size": "2Gi"}}, old)
    assert any("storage is immutable" in e for e in errors)
    errors = cel_errors(TC, {"version": "2.0.0", "coordinators": 32}, {"version": "2.0.0"})
    assert any("coordinators is immutable" in e for e in errors)


def test_replicas_are_immutable_because_data_is_placed_by_pod() -> None:
    errors = cel_errors(TC, {"version": "2.0.0", "replicas": 4}, {"version": "2.0.0"})
    assert any("replicas of a TransactionCoordinator is immutable" in e for e in errors)
    errors = cel_errors(PAS, {"version": "2.0.0", "replicas": 4}, {"version": "2.0.0"})
    assert any("replicas of a PendingAckStore is immutable" in e for e in errors)
    assert cel_errors(PAS, {"version": "2.1.0", "replicas": 3}, {"version": "2.0.0"}) == []


def test_defaults_satisfy_their_own_rules_as_written() -> None:
    """The API server checks a default against CEL without filling nested defaults (found on a real one)."""
    env = celpy.Environment()
    for name in (TC, PAS):
        for _path, sub, rule in _rules(_schema(name, "spec")):
            if "default" in sub and "oldSelf" not in rule["rule"]:
                activation = {"self": json_to_cel(sub["default"])}
                assert env.program(env.compile(rule["rule"])).evaluate(activation), rule["message"]
