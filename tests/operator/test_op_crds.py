"""The CRDs: generated files are committed and identical in the chart, valid for every supported
Kubernetes, explained field by field, and their CEL rules accept and reject what they claim to.

CEL rules are evaluated with cel-python on objects defaulted from the schema the way the API server
defaults them; the e2e suite then proves the same against a real kube-apiserver.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import kubernetes_validate
import pytest
import yaml
from celpy import celtypes
from celpy.adapter import json_to_cel

from txnkeeper.contract import batching, connections, coordinator_settings, memory, names, store_settings
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


# ---- Kubernetes' CEL quantity library (k8s.io/apiserver/pkg/cel/library/quantity.go), for cel-python --

_SUFFIXES = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    **{s: Fraction(1024**i) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), start=1)},
}
_QUANTITY_TEXT = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$"
)


class Quantity:
    """A parsed resource.Quantity: an exact rational value, compared like Kubernetes compares them."""

    def __init__(self, text: str) -> None:
        match = _QUANTITY_TEXT.match(text)
        if match is None:
            raise ValueError(f"quantities must match the regular expression: {text!r}")
        number, exponent, suffix = match.groups()
        scale = Fraction(10) ** int(exponent[1:]) if exponent else _SUFFIXES[suffix or ""]
        self.value = Fraction(number) * scale


def _compare(a: Quantity, b: Quantity) -> int:
    return (a.value > b.value) - (a.value < b.value)


QUANTITY_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": lambda text: Quantity(str(text)),
    "isQuantity": lambda text: celtypes.BoolType(_QUANTITY_TEXT.match(str(text)) is not None),
    "compareTo": lambda a, b: celtypes.IntType(_compare(a, b)),
    "isLessThan": lambda a, b: celtypes.BoolType(_compare(a, b) < 0),
    "isGreaterThan": lambda a, b: celtypes.BoolType(_compare(a, b) > 0),
    "sign": lambda a: celtypes.IntType((a.value > 0) - (a.value < 0)),
}


def test_quantity_library_compares_like_kubernetes() -> None:
    assert Quantity("1Gi").value == Quantity("1024Mi").value == 1024**3
    assert Quantity("500m").value == Fraction(1, 2) and Quantity("1e3").value == Quantity("1k").value
    assert Quantity("-0.5").value < 0 and Quantity(".5").value == Quantity("500m").value
    with pytest.raises(ValueError, match="regular expression"):
        Quantity("1GiB")


def _evaluate(rule: str, activation: dict[str, Any]) -> bool:
    env = celpy.Environment()
    result = env.program(env.compile(rule), functions=QUANTITY_FUNCTIONS).evaluate(activation)
    if isinstance(result, Exception):  # cel-python returns evaluation errors; the API server refuses
        raise result
    return bool(result)


def cel_errors(name: str, spec: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    schema = _schema(name, "spec")
    spec = _default(schema, copy.deepcopy(spec))
    old = _default(schema, copy.deepcopy(old)) if old is not None else None
    jsonschema.validate(spec, _plain(schema))
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
        if not _evaluate(rule["rule"], activation):
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
        "flushMode": "adaptive",
    }
    assert spec["storage"]["size"] == "1Gi"


@pytest.mark.parametrize(
    ("name", "spec", "fragment"),
    [
        (TC, {"version": "1.2.0", "batchedWrite": {"enabled": True}}, "needs version 2.x"),
        (PAS, {"version": "1.2.0", "batchedWrite": {"enabled": True}}, "needs version 2.x"),
        (TC, {"version": "9.0.0"}, "known release line"),
        (TC, {"version": "2.0.0", "batchedWrite": {"enabled": True, "maxRecords": 1}}, "at least 2"),
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


def test_replicas_are_mutable_for_both_kinds() -> None:
    """kubectl scale: placement moves with the count, so any replica count is accepted, also one above
    spec.coordinators (a pod that owns no coordinator id only waits)."""
    assert cel_errors(TC, {"version": "2.0.0", "replicas": 4}, {"version": "2.0.0"}) == []
    assert cel_errors(TC, {"version": "2.0.0", "replicas": 5, "coordinators": 2}) == []
    assert cel_errors(PAS, {"version": "2.0.0", "replicas": 4}, {"version": "2.0.0"}) == []
    spec = _default(_schema(PAS, "spec"), {"version": "2.0.0"})
    assert spec["scaling"] == {"maxConcurrentMoves": 1, "precopyMiBPerSecond": 10} and "shards" not in spec
    spec = _default(_schema(PAS, "spec"), {"version": "2.0.0", "scaling": {"maxConcurrentMoves": 2}})
    assert spec["scaling"] == {"maxConcurrentMoves": 2, "precopyMiBPerSecond": 10}, "the nested default"
    assert cel_errors(PAS, {"version": "2.0.0", "scaling": {"precopyMiBPerSecond": 0}}) == []
    for bad in ({"maxConcurrentMoves": 0}, {"maxConcurrentMoves": 17}, {"precopyMiBPerSecond": -1}):
        with pytest.raises(jsonschema.ValidationError):
            cel_errors(TC, {"version": "2.0.0", "scaling": bad})


def test_shards_are_fixed_once_the_resource_exists() -> None:
    old = {"version": "2.0.0", "replicas": 2, "shards": 32}
    assert cel_errors(PAS, {**old, "replicas": 3}, old) == []
    errors = cel_errors(PAS, {**old, "shards": 64}, old)
    assert any("spec.shards is immutable" in e for e in errors)
    errors = cel_errors(PAS, {"version": "2.0.0", "replicas": 2}, old)
    assert any("cannot be added or removed" in e for e in errors)
    errors = cel_errors(PAS, old, {"version": "2.0.0", "replicas": 2})
    assert any("cannot be added or removed" in e for e in errors)
    for bad in (0, 4097):
        with pytest.raises(jsonschema.ValidationError):
            cel_errors(PAS, {"version": "2.0.0", "shards": bad})


def _root_errors(obj: dict[str, Any]) -> list[str]:
    root = _load(PAS)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    obj = {**obj, "spec": _default(root["properties"]["spec"], copy.deepcopy(obj["spec"]))}
    return [
        r["message"]
        for r in root["x-kubernetes-validations"]
        if not _evaluate(r["rule"], {"self": json_to_cel(obj)})
    ]


def test_shards_must_be_a_multiple_of_replicas_until_the_first_record_exists() -> None:
    """On create (the API server drops status there) spec.shards must divide by spec.replicas; once the
    operator wrote status.placement any replica count is accepted (kubectl scale 2 -> 3 with 32)."""
    errors = _root_errors({"spec": {"version": "2.0.0", "replicas": 3, "shards": 32}})
    assert any("multiple of spec.replicas" in e for e in errors)
    assert _root_errors({"spec": {"version": "2.0.0", "replicas": 2, "shards": 32}}) == []
    assert _root_errors({"spec": {"version": "2.0.0", "replicas": 3}}) == []
    placed = {
        "spec": {"version": "2.0.0", "replicas": 3, "shards": 32},
        "status": {"placement": {"epoch": 1}},
    }
    assert _root_errors(placed) == []


def test_defaults_satisfy_their_own_rules_as_written() -> None:
    """The API server checks a default against CEL without filling nested defaults (found on a real one)."""
    for name in (TC, PAS):
        for _path, sub, rule in _rules(_schema(name, "spec")):
            if "default" in sub and "oldSelf" not in rule["rule"]:
                assert _evaluate(rule["rule"], {"self": json_to_cel(sub["default"])}), rule["message"]


# ---- limits shared with the runtime, and specs that used to be accepted and fail later ----------------


@pytest.mark.parametrize("name", [TC, PAS])
def test_batched_write_limits_and_defaults_are_the_runtimes(name: str) -> None:
    block = _schema(name, "spec")["properties"]["batchedWrite"]
    fields = block["properties"]
    bounds = {
        key: (fields[key]["minimum"], fields[key]["maximum"], fields[key]["default"])
        for key in fields
        if key not in {"enabled", "flushMode"}
    }
    assert fields["flushMode"]["enum"] == list(batching.FLUSH_MODES)
    assert bounds == {
        "maxRecords": (batching.MIN_MAX_RECORDS, batching.MAX_MAX_RECORDS, batching.DEFAULT_MAX_RECORDS),
        "maxSizeBytes": (
            batching.MIN_MAX_SIZE_BYTES,
            batching.MAX_MAX_SIZE_BYTES,
            batching.DEFAULT_MAX_SIZE_BYTES,
        ),
        "maxDelayMillis": (
            batching.MIN_MAX_DELAY_MILLIS,
            batching.MAX_MAX_DELAY_MILLIS,
            batching.DEFAULT_MAX_DELAY_MILLIS,
        ),
    }
    assert block["default"] == {k: v["default"] for k, v in fields.items()}


def _batch(**block: Any) -> dict[str, Any]:
    return {"version": "2.0.0", "batchedWrite": {"enabled": True, **block}}


@pytest.mark.parametrize(
    "spec",
    [
        _batch(maxSizeBytes=batching.MAX_MAX_SIZE_BYTES + 1),
        _batch(maxSizeBytes=64 * 1024 * 1024),
        _batch(maxSizeBytes=batching.MIN_MAX_SIZE_BYTES - 1),
        _batch(maxDelayMillis=batching.MAX_MAX_DELAY_MILLIS + 1),
        _batch(maxDelayMillis=10**12),
        _batch(maxDelayMillis=-1),
        _batch(maxRecords=batching.MAX_MAX_RECORDS + 1),
        {"version": "2.0.0", "maxUnavailable": 0},
        {"version": "2.0.0", "image": ""},
        {"version": "2.0.0", "image": "repo/image :tag"},
        {"version": "2.0.0", "storage": {"size": "1Gi", "storageClassName": "Fast_SSD"}},
        {"version": "2.0.0", "storage": {"size": "1Gi", "storageClassName": "-ssd"}},
        {"version": "2.0.0", "storage": {"size": "1GB"}},
        {"version": "2.0.0", "verifier": {"schedule": "every hour"}},
        {"version": "2.0.0", "verifier": {"schedule": "*/5 * * *"}},
        {"version": "2.0.0", "verifier": {"schedule": "TZ=UTC 0 * * * *"}},
        {"version": "2.0.0", "verifier": {"sparkMaster": ""}},
        {"version": "2.0.0", "verifier": {"sparkMaster": "yarn"}},
        {"version": "2.0.0", "verifier": {"sparkMaster": "spark://host"}},
        {"version": "2.0.0", "verifier": {"sparkMaster": "local[0]"}},
        {"version": "2.0.0", "verifier": {"sparkMaster": "http://spark:7077"}},
        {"version": "2.0.0", "resources": {"requests": {"cpu": "1 core"}}},
    ],
)
def test_schema_refuses_specs_that_would_fail_later(spec: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        cel_errors(PAS, spec)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"version": "2.0.0", "storage": {"size": "0"}}, "storage.size must be greater than zero"),
        ({"version": "2.0.0", "storage": {"size": 0}}, "storage.size must be greater than zero"),
        ({"version": "2.0.0", "storage": {"size": "0.0Gi"}}, "storage.size must be greater than zero"),
        ({"version": "2.0.0", "storage": {"size": "-1Gi"}}, "storage.size must be greater than zero"),
        ({"version": "2.0.0", "resources": {"requests": {"cpu": "-100m"}}}, "requests must not be negative"),
        ({"version": "2.0.0", "resources": {"limits": {"memory": "-1Gi"}}}, "limits must not be negative"),
        (
            {"version": "2.0.0", "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1500m"}}},
            "requests must not exceed resources.limits",
        ),
        (
            {
                "version": "2.0.0",
                "resources": {"requests": {"memory": "1Gi"}, "limits": {"memory": "1000Mi"}},
            },
            "requests must not exceed resources.limits",
        ),
    ],
)
def test_cel_refuses_specs_that_would_fail_later(spec: dict[str, Any], fragment: str) -> None:
    for name in (TC, PAS):
        errors = cel_errors(name, spec)
        assert any(fragment in e for e in errors), (name, errors)


@pytest.mark.parametrize(
    "spec",
    [
        _batch(maxRecords=batching.MAX_MAX_RECORDS, maxSizeBytes=batching.MAX_MAX_SIZE_BYTES),
        _batch(maxDelayMillis=batching.MAX_MAX_DELAY_MILLIS, maxSizeBytes=batching.MIN_MAX_SIZE_BYTES),
        _batch(maxDelayMillis=0),
        {"version": "2.0.0", "replicas": 3, "maxUnavailable": 3},
        {"version": "2.0.0", "replicas": 1, "maxUnavailable": 2},  # kubectl scale is never refused for it
        {"version": "2.0.0", "scaling": {"maxConcurrentMoves": 16}},
        {"version": "2.0.0", "image": "ghcr.io/txnkeeper/txnkeeper:2.0.0"},
        {"version": "2.0.0", "storage": {"size": 1073741824, "storageClassName": "fast-ssd.example.com"}},
        {"version": "2.0.0", "storage": {"size": "500M", "storageClassName": ""}},
        {"version": "2.0.0", "storage": {"size": "1e9"}},
        {"version": "2.0.0", "verifier": {"schedule": "*/30 * * * *"}},
        {"version": "2.0.0", "verifier": {"schedule": "0 3 * * MON-FRI"}},
        {"version": "2.0.0", "verifier": {"schedule": "@daily"}},
        {"version": "2.0.0", "verifier": {"sparkMaster": "local"}},
        {"version": "2.0.0", "verifier": {"sparkMaster": "local[4]"}},
        {"version": "2.0.0", "verifier": {"sparkMaster": "spark://master-0.spark:7077,master-1.spark:7077"}},
        {"version": "2.0.0", "verifier": {"sparkMaster": "k8s://https://kubernetes.default.svc:443"}},
        {
            "version": "2.0.0",
            "resources": {
                "requests": {"cpu": "500m", "memory": "1Gi", "ephemeral-storage": 0},
                "limits": {"cpu": 1, "memory": "1024Mi"},
            },
        },
        {"version": "2.0.0", "resources": {"requests": {"cpu": "4"}}},
        {"version": "2.0.0", "resources": {"limits": {"cpu": "100m"}}},
    ],
)
def test_valid_specs_at_the_edges_are_accepted(spec: dict[str, Any]) -> None:
    assert cel_errors(TC, {**spec, "coordinators": 16}) == []
    assert cel_errors(PAS, spec) == []


# ---- PendingAckStore.spec.offload / spec.singleKeyTransactions: limits, CEL and the release gate -----

FS = {"driver": "filesystem", "filesystem": {"claimName": "offload-rwx"}}
S3 = {"driver": "aws-s3", "bucket": "ledgers", "region": "eu-west-1", "credentialsSecret": {"name": "s3"}}


@pytest.mark.parametrize(
    "spec",
    [
        {"version": "3.0.0", "offload": FS},
        {"version": "3.1.0", "offload": S3},
        {"version": "3.0.0", "offload": {**S3, "driver": "S3", "endpoint": "http://minio:9000"}},
        {
            "version": "3.0.0",
            "offload": {**FS, "minSegmentRolloverSeconds": 600, "maxSegmentRolloverSeconds": 600},
        },
        {"version": "3.0.0", "singleKeyTransactions": {"enabled": True}},
        {
            "version": "3.0.0",
            "singleKeyTransactions": {
                "enabled": True,
                "maxBlockBytes": store_settings.SRK_MAX_BLOCK_BYTES,
                "writerInactivityMinutes": 1,
                "maxWritersPerTopic": 1,
            },
        },
        # Disabled single-key transactions are allowed on any release (a CR written for 3.x, kept).
        {"version": "2.0.0", "singleKeyTransactions": {"enabled": False}},
        # A 3.x -> 2.x downgrade keeps the location, disabled, so tier-only ledgers can be restored.
        {"version": "2.0.0", "offload": {**FS, "enabled": False}},
        {"version": "3.0.0", "offload": {**FS, "verifySchedule": "0 3 * * *"}},
        {"version": "3.0.0", "offload": {**S3, "verifySchedule": "@daily"}},
        {"version": "3.0.0", "offload": {**S3, "verifySchedule": ""}},
    ],
)
def test_valid_gated_specs_are_accepted(spec: dict[str, Any]) -> None:
    assert cel_errors(PAS, spec) == []


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"version": "2.0.0", "offload": FS}, "spec.offload needs the 'offload-segments' feature"),
        ({"version": "1.0.0", "offload": S3}, "only release lines 3.x have"),
        (
            {"version": "2.3.0", "singleKeyTransactions": {"enabled": True}},
            "spec.singleKeyTransactions needs the 'single-key-transactions' feature",
        ),
        ({"version": "3.0.0", "offload": {"driver": "aws-s3"}}, "offload.bucket is required"),
        ({"version": "3.0.0", "offload": {"driver": "S3"}}, "offload.bucket is required"),
        ({"version": "3.0.0", "offload": {"driver": "filesystem"}}, "offload.filesystem.claimName"),
        ({"version": "3.0.0", "offload": {"driver": "filesystem", "filesystem": {}}}, "claimName"),
        (
            {"version": "3.0.0", "offload": {**FS, "minSegmentRolloverSeconds": 700}},
            "minSegmentRolloverSeconds must not exceed offload.maxSegmentRolloverSeconds",
        ),
    ],
)
def test_cel_refuses_gated_specs_saying_what_to_fix(spec: dict[str, Any], fragment: str) -> None:
    errors = cel_errors(PAS, spec)
    assert any(fragment in e for e in errors), errors


@pytest.mark.parametrize(
    "spec",
    [
        {"version": "3.0.0", "offload": {"driver": "gcs"}},
        {"version": "3.0.0", "offload": {"bucket": "x"}},
        {"version": "3.0.0", "offload": {**FS, "maxSegmentSizeBytes": 0}},
        {"version": "3.0.0", "offload": {**FS, "maxBlockSizeBytes": 0}},
        {"version": "3.0.0", "offload": {**FS, "maxSegmentRolloverSeconds": 0}},
        # over a week: the pods refuse such a config file (contracts §9), so it never starts a pod
        {"version": "3.0.0", "offload": {**FS, "maxSegmentRolloverSeconds": 7 * 24 * 3600 + 1}},
        {"version": "3.0.0", "offload": {**FS, "minSegmentRolloverSeconds": 7 * 24 * 3600 + 1}},
        {"version": "3.0.0", "offload": {**FS, "thresholdBytes": -2}},
        {"version": "3.0.0", "offload": {**FS, "deletionLagMs": -1}},
        {"version": "3.0.0", "offload": {**S3, "endpoint": "minio:9000"}},
        {"version": "3.0.0", "offload": {**FS, "verifySchedule": "every day"}},
        {"version": "3.0.0", "offload": {**FS, "verifySchedule": "0 3 * *"}},
        {"version": "3.0.0", "offload": {**FS, "verifySchedule": "TZ=UTC 0 3 * * *"}},
        {"version": "3.0.0", "singleKeyTransactions": {"maxBlockBytes": 16 * 1024 * 1024 + 1}},
        {"version": "3.0.0", "singleKeyTransactions": {"maxBlockBytes": 0}},
        {"version": "3.0.0", "singleKeyTransactions": {"writerInactivityMinutes": 0}},
        {"version": "3.0.0", "singleKeyTransactions": {"maxWritersPerTopic": 0}},
    ],
)
def test_schema_refuses_out_of_range_gated_settings(spec: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        cel_errors(PAS, spec)


def test_defaults_are_pulsars_and_only_stores_have_the_sections() -> None:
    spec = _default(_schema(PAS, "spec"), {"version": "3.0.0", "offload": dict(FS)})
    offload = spec["offload"]
    assert offload["thresholdBytes"] == -1 and offload["deletionLagMs"] == 4 * 3600 * 1000
    assert offload["maxSegmentSizeBytes"] == 1024**3 and offload["maxBlockSizeBytes"] == 64 * 1024**2
    assert "offload" not in _schema(TC, "spec")["properties"]
    assert "singleKeyTransactions" not in _schema(TC, "spec")["properties"]
    assert _schema(PAS, "spec")["properties"]["batchedWrite"]["properties"]["flushMode"]["enum"] == [
        "adaptive",
        "delay",
    ]


def test_the_offload_example_passes_schema_and_cel() -> None:
    example = yaml.safe_load((ROOT / "examples" / "pendingackstore-offload.yaml").read_text())
    assert example["kind"] == "PendingAckStore"
    assert cel_errors(PAS, example["spec"]) == []
    downgrade = copy.deepcopy(example["spec"])
    downgrade["version"] = "2.0.0"
    downgrade["singleKeyTransactions"]["enabled"] = False
    assert any("offload-segments" in e for e in cel_errors(PAS, downgrade))
    downgrade["offload"]["enabled"] = False
    assert cel_errors(PAS, downgrade) == []


# ---- ungated pod settings: PendingAckStore.spec.topicPolicies, TransactionCoordinator.spec.transactions,
# ---- spec.connectionLimits of both: the runtime's limits, refused at admission -----------------------

TOPIC_POLICIES_AT_THE_EDGES = [
    {
        "retentionMinutes": -1,
        "retentionSizeMB": -1,
        "messageTTLSeconds": 0,
        "backlogQuotaLimitBytes": -1,
        "backlogQuotaLimitSeconds": -1,
        "backlogQuotaPolicy": "producer_request_hold",
        "checkIntervalSeconds": store_settings.MIN_CHECK_INTERVAL_SECONDS,
    },
    {
        "retentionMinutes": store_settings.JAVA_INT_MAX,
        "retentionSizeMB": store_settings.JAVA_LONG_MAX // store_settings.MIB,
        "messageTTLSeconds": store_settings.JAVA_INT_MAX,
        "backlogQuotaLimitBytes": store_settings.JAVA_LONG_MAX,
        "backlogQuotaLimitSeconds": store_settings.JAVA_INT_MAX,
        "backlogQuotaPolicy": "consumer_backlog_eviction",
        "checkIntervalSeconds": store_settings.MAX_CHECK_INTERVAL_SECONDS,
    },
    {"retentionMinutes": 0, "retentionSizeMB": 0},  # Pulsar's default, set explicitly
    {"backlogQuotaLimitBytes": 0, "backlogQuotaPolicy": "producer_exception"},
]


def test_topic_policy_fields_carry_the_runtimes_limits_and_no_defaults() -> None:
    fields = _schema(PAS, "spec")["properties"]["topicPolicies"]["properties"]
    assert set(fields) == set(store_settings.TOPIC_POLICY_FIELDS)
    for field, (_block, key) in store_settings.TOPIC_POLICY_FIELDS.items():
        assert "default" not in fields[field], f"{field}: a default would switch the policy on for every CR"
        if key == "policy":
            assert fields[field]["enum"] == list(store_settings.BACKLOG_POLICIES)
            continue
        low, high, _text = store_settings.topic_policy_bounds(key)
        assert (fields[field]["type"], fields[field]["minimum"], fields[field]["maximum"]) == (
            "integer",
            low,
            high,
        ), field
    assert "topicPolicies" not in _schema(TC, "spec")["properties"]


@pytest.mark.parametrize("policies", TOPIC_POLICIES_AT_THE_EDGES)
@pytest.mark.parametrize("version", ["1.0.0", "2.0.0", "3.0.0"])
def test_topic_policies_at_the_edges_are_accepted_on_every_release(
    policies: dict[str, Any], version: str
) -> None:
    assert cel_errors(PAS, {"version": version, "topicPolicies": policies}) == []


@pytest.mark.parametrize(
    "policies",
    [
        {"retentionMinutes": -2},
        {"retentionMinutes": store_settings.JAVA_INT_MAX + 1},
        {"retentionSizeMB": store_settings.JAVA_LONG_MAX // store_settings.MIB + 1},
        {"retentionSizeMB": "1024"},
        {"messageTTLSeconds": -1},
        {"messageTTLSeconds": 1.5},
        {"backlogQuotaLimitBytes": -2},
        {"backlogQuotaLimitSeconds": store_settings.JAVA_INT_MAX + 1},
        {"backlogQuotaPolicy": "consumer_backlog_eviction "},
        {"backlogQuotaPolicy": "ProducerException"},
        {"backlogQuotaPolicy": ""},
        {"checkIntervalSeconds": 0},
        {"checkIntervalSeconds": store_settings.MAX_CHECK_INTERVAL_SECONDS + 1},
        {"checkIntervalSeconds": True},
    ],
)
def test_schema_refuses_topic_policies_the_pods_would_refuse(policies: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        cel_errors(PAS, {"version": "3.0.0", "topicPolicies": policies})


@pytest.mark.parametrize(
    "policies", [{"retentionMinutes": 60}, {"retentionSizeMB": 1024, "messageTTLSeconds": 60}]
)
def test_cel_refuses_half_a_retention_policy(policies: dict[str, Any]) -> None:
    # Pulsar's rule deletes a consumed ledger past either limit, and a limit left out is 0: the other
    # would keep nothing (pulsar-admin set-retention asks for both too).
    errors = cel_errors(PAS, {"version": "2.0.0", "topicPolicies": policies})
    assert any(
        "set both topicPolicies.retentionMinutes and topicPolicies.retentionSizeMB" in e for e in errors
    )


def _txn(**section: Any) -> dict[str, Any]:
    return {"version": "2.0.0", "transactions": section}


def test_transaction_timeout_fields_carry_the_coordinators_limits() -> None:
    section = _schema(TC, "spec")["properties"]["transactions"]
    fields = section["properties"]
    assert fields["maxTimeoutMs"]["minimum"] == 1
    assert fields["maxTimeoutMs"]["maximum"] == coordinator_settings.HARD_MAX_TIMEOUT_MS
    assert "default" not in fields["maxTimeoutMs"]
    for kind in ("namespaces", "topics"):
        assert fields[kind]["maxItems"] == coordinator_settings.MAX_LIMITED_NAMES
        assert fields[kind]["x-kubernetes-list-type"] == "map"
        assert fields[kind]["x-kubernetes-list-map-keys"] == ["name"]
        entry = fields[kind]["items"]["properties"]["maxTimeoutMs"]
        assert (entry["minimum"], entry["maximum"]) == (1, coordinator_settings.HARD_MAX_TIMEOUT_MS)
    topic = fields["topics"]["items"]["properties"]["name"]
    assert topic["maxLength"] == names.MAX_TOPIC_NAME
    assert "transactions" not in _schema(PAS, "spec")["properties"]


@pytest.mark.parametrize(
    "spec",
    [
        _txn(maxTimeoutMs=1),
        _txn(maxTimeoutMs=coordinator_settings.HARD_MAX_TIMEOUT_MS),
        _txn(
            namespaces=[
                {"name": "public/default", "maxTimeoutMs": coordinator_settings.DEFAULT_MAX_TIMEOUT_MS}
            ]
        ),
        _txn(
            maxTimeoutMs=3_600_000,
            namespaces=[{"name": "tenant/ns", "maxTimeoutMs": 3_600_000}],
            topics=[
                {"name": "persistent://tenant/ns/orders", "maxTimeoutMs": 1},
                {"name": "x" * names.MAX_TOPIC_NAME, "maxTimeoutMs": 60_000},
                {"name": "persistent://tenant/ns/ключ ✓", "maxTimeoutMs": 60_000},
            ],
        ),
    ],
)
def test_transaction_timeouts_at_the_edges_are_accepted(spec: dict[str, Any]) -> None:
    assert cel_errors(TC, {**spec, "coordinators": 16}) == []


@pytest.mark.parametrize(
    "spec",
    [
        _txn(maxTimeoutMs=0),
        _txn(maxTimeoutMs=coordinator_settings.HARD_MAX_TIMEOUT_MS + 1),
        _txn(maxTimeoutMs="60000"),
        _txn(namespaces=[{"name": "public", "maxTimeoutMs": 1000}]),
        _txn(namespaces=[{"name": "public/default/extra", "maxTimeoutMs": 1000}]),
        _txn(namespaces=[{"name": "/default", "maxTimeoutMs": 1000}]),
        _txn(namespaces=[{"name": "public/default"}]),
        _txn(namespaces=[{"name": "public/default", "maxTimeoutMs": 0}]),
        _txn(namespaces=[{"maxTimeoutMs": 1000}]),
        _txn(topics=[{"name": "", "maxTimeoutMs": 1000}]),
        _txn(topics=[{"name": "x" * (names.MAX_TOPIC_NAME + 1), "maxTimeoutMs": 1000}]),
        _txn(topics=[{"name": "persistent://t/n/a\nb", "maxTimeoutMs": 1000}]),
        _txn(topics=[{"name": "persistent://t/n/a\x00", "maxTimeoutMs": 1000}]),
        _txn(topics=[{"name": "t", "maxTimeoutMs": coordinator_settings.HARD_MAX_TIMEOUT_MS + 1}]),
        _txn(
            topics=[
                {"name": f"t{i}", "maxTimeoutMs": 1}
                for i in range(coordinator_settings.MAX_LIMITED_NAMES + 1)
            ]
        ),
    ],
)
def test_schema_refuses_transaction_timeouts_the_coordinators_would_refuse(spec: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        cel_errors(TC, {**spec, "coordinators": 16})


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        (
            _txn(
                namespaces=[
                    {"name": "tenant/ns", "maxTimeoutMs": coordinator_settings.DEFAULT_MAX_TIMEOUT_MS + 1}
                ]
            ),
            "transactions.namespaces[].maxTimeoutMs must not exceed transactions.maxTimeoutMs",
        ),
        (
            _txn(maxTimeoutMs=60_000, topics=[{"name": "persistent://t/n/x", "maxTimeoutMs": 60_001}]),
            "transactions.topics[].maxTimeoutMs must not exceed transactions.maxTimeoutMs",
        ),
        (
            _txn(topics=[{"name": "persistent://t/n/x__transaction_pending_ack", "maxTimeoutMs": 1}]),
            "may not end with __transaction_pending_ack",
        ),
    ],
)
def test_cel_refuses_transaction_timeouts_saying_what_to_fix(spec: dict[str, Any], fragment: str) -> None:
    errors = cel_errors(TC, {**spec, "coordinators": 16})
    assert any(fragment in e for e in errors), errors


def test_connection_limit_fields_are_the_runtimes_flags_with_its_floors() -> None:
    for name in (TC, PAS):
        fields = _schema(name, "spec")["properties"]["connectionLimits"]["properties"]
        assert set(fields) == set(connections.CONNECTION_LIMITS)
        for field, limit in connections.CONNECTION_LIMITS.items():
            schema = fields[field]
            assert schema["type"] == ("integer" if limit.kind is int else "number"), field
            assert schema["minimum"] == limit.minimum and "default" not in schema, field
            assert schema.get("maximum") == limit.maximum, field
            assert f"Default {limit.default_text}" in schema["description"], field


def test_memory_fields_are_the_store_runtimes_flags_with_its_floors() -> None:
    assert "memory" not in _schema(TC, "spec")["properties"]  # coordinators keep no tail cache
    fields = _schema(PAS, "spec")["properties"]["memory"]["properties"]
    assert set(fields) == set(memory.MEMORY_SETTINGS)
    for field, setting in memory.MEMORY_SETTINGS.items():
        schema = fields[field]
        assert schema["type"] == "integer" and "default" not in schema, field
        assert (schema["minimum"], schema["maximum"]) == (setting.minimum, setting.maximum), field
        assert f"Default {setting.default_text}" in schema["description"], field
    assert cel_errors(PAS, {"version": "1.0.0", "memory": {"tailCacheBytes": 0}}) == []
    for bad in (-1, 1.5, "64Mi", 2**40 + 1):
        with pytest.raises(jsonschema.ValidationError):
            cel_errors(PAS, {"version": "1.0.0", "memory": {"tailCacheBytes": bad}})


@pytest.mark.parametrize(
    "limits",
    [
        {field: limit.minimum for field, limit in connections.CONNECTION_LIMITS.items()},
        {field: limit.maximum or 2**40 for field, limit in connections.CONNECTION_LIMITS.items()},
        {"maxConnections": 4096, "handshakeTimeoutSeconds": 2.5},
    ],
    ids=["minima", "maxima", "some"],
)
def test_connection_limits_at_the_edges_are_accepted(limits: dict[str, Any]) -> None:
    assert cel_errors(TC, {"version": "1.0.0", "connectionLimits": limits, "coordinators": 16}) == []
    assert cel_errors(PAS, {"version": "1.0.0", "connectionLimits": limits}) == []


@pytest.mark.parametrize(
    "limits",
    [
        {"maxConnections": 0},
        {"maxConnectionsPerAddress": -1},
        {"maxHandshakingConnections": 0},
        {"maxPendingBytes": connections.CONNECTION_LIMITS["maxPendingBytes"].minimum - 1},
        {"maxUnsentBytes": connections.CONNECTION_LIMITS["maxUnsentBytes"].minimum - 1},
        {"maxTotalUnsentBytes": connections.CONNECTION_LIMITS["maxTotalUnsentBytes"].minimum - 1},
        {"handshakeTimeoutSeconds": 0},
        {"idleTimeoutSeconds": -5},
        {"frameTimeoutSeconds": connections.MAX_TIMEOUT_SECONDS + 1},
        {"writeTimeoutSeconds": "120"},
        {"maxConnections": 1.5},
    ],
)
def test_schema_refuses_connection_limits_the_pods_would_refuse(limits: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        cel_errors(PAS, {"version": "2.0.0", "connectionLimits": limits})


def test_client_authentication_needs_a_secret_name_and_a_plain_key() -> None:
    ok = {"version": "3.0.0", "clientAuthentication": {"tokenKeySecret": {"name": "client-keys"}}}
    assert cel_errors(PAS, ok) == []
    for bad in (
        {"version": "3.0.0", "clientAuthentication": {}},
        {"version": "3.0.0", "clientAuthentication": {"tokenKeySecret": {"key": "key"}}},
        {"version": "3.0.0", "clientAuthentication": {"tokenKeySecret": {"name": ""}}},
        {"version": "3.0.0", "clientAuthentication": {"tokenKeySecret": {"name": "k", "key": "../etc"}}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            cel_errors(PAS, bad)
