"""The pod config file the operator renders from a PendingAckStore is one the runtime accepts, with the
same values: spec.offload through server/offload_settings.py (Pulsar's keys, the OffloadPolicy it
builds), spec.singleKeyTransactions through server/srk_config.py, and the whole file through
``txnkeeper serve``'s own argument handling at the release the template names. Specs are defaulted by
the committed CRD's schema first, as the API server would, and include every field at its CRD limits,
so a limit the CRD allows but the runtime refuses fails here. No cluster, no process."""

from __future__ import annotations

import argparse
import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from txnkeeper.contract import connections, coordinator_settings, memory, names, store_settings
from txnkeeper.contract.settings import offload as offload_declared
from txnkeeper.coordinator import timeouts
from txnkeeper.coordinator.timeouts import TxnTimeoutPolicy
from txnkeeper.protocol.limits import ConnectionLimits, InvalidLimitsError
from txnkeeper.server import offload_settings, serve, srk_config, topic_policies
from txnkeeper.server.config import ConfigError, ServeConfig
from txnkeeper.topic import tailcache
from txnkeeper.topic.writers import SingleKeySettings
from txnkeeper_operator import builders
from txnkeeper_operator.engine import BatchSettings, Template
from txnkeeper_operator.resource import Resource
from txnkeeper_operator.settings import OperatorSettings

ROOT = Path(__file__).resolve().parents[2]
BATCH = BatchSettings(enabled=True, max_records=64, max_size_bytes=65536, max_delay_millis=1)


def _spec_schema() -> dict[str, Any]:
    crd = yaml.safe_load((ROOT / "crds" / "pendingackstores.yaml").read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


SPEC = _spec_schema()
OFFLOAD = SPEC["properties"]["offload"]["properties"]
SRK = SPEC["properties"]["singleKeyTransactions"]["properties"]


def _defaulted(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting as the API server does it (only where a parent object exists)."""
    if value is None and "default" in schema:
        value = copy.deepcopy(schema["default"])
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            filled = _defaulted(sub, value.get(key))
            if filled is not None:
                value[key] = filled
    return value


def _store(version: str, **spec: Any) -> Resource:
    full = _defaulted(SPEC, {"version": version, "replicas": 3, **copy.deepcopy(spec)})
    return Resource.from_body(
        {
            "apiVersion": "txnkeeper.io/v1",
            "kind": "PendingAckStore",
            "metadata": {"name": "pas", "namespace": "prod", "uid": "u-1", "generation": 1},
            "spec": full,
        }
    )


def _rendered(tmp_path: Path, cr: Resource, version: str, name: str = "config") -> Path:
    path = tmp_path / f"{name}-{version}.json"
    path.write_text(builders.config_map(cr, BATCH, version)["data"]["config.json"])
    return path


def _serve_args(path: Path, release: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """``txnkeeper serve``'s own flags as the operator's StatefulSet passes them (contracts §6)."""
    for name in [n for n in os.environ if n.startswith("TXNKEEPER_")]:
        monkeypatch.delenv(name)
    parser = argparse.ArgumentParser()
    serve.register(parser.add_subparsers())
    ns = parser.parse_args(
        ["serve", "--role", "store", "--data-dir", str(tmp_path / "data"), "--release", release,
         "--pod-name", "pas-0", "--config", str(path)]
    )  # fmt: skip
    return ns


FS = {"driver": "filesystem", "filesystem": {"claimName": "tier-rwx"}}
S3_EDGES = {
    # Every field at the edge the CRD allows.
    "driver": "aws-s3",
    "bucket": "abc",
    "region": "eu-west-1",
    "endpoint": "http://minio:9000",
    "credentialsSecret": {"name": "s3"},
    "thresholdBytes": OFFLOAD["thresholdBytes"]["minimum"] + 1,
    "deletionLagMs": OFFLOAD["deletionLagMs"]["minimum"],
    "maxSegmentSizeBytes": OFFLOAD["maxSegmentSizeBytes"]["minimum"],
    "maxSegmentRolloverSeconds": OFFLOAD["maxSegmentRolloverSeconds"]["minimum"],
    "minSegmentRolloverSeconds": OFFLOAD["minSegmentRolloverSeconds"]["minimum"],
    "maxBlockSizeBytes": OFFLOAD["maxBlockSizeBytes"]["minimum"],
    "verifySchedule": "@daily",
}
S3_TOP = {
    **S3_EDGES,
    "maxBlockSizeBytes": OFFLOAD["maxBlockSizeBytes"]["maximum"],
    "maxSegmentRolloverSeconds": 86400,
    "minSegmentRolloverSeconds": 86400,
}


@pytest.mark.parametrize(
    "offload",
    [FS, {**FS, "thresholdBytes": 0, "enabled": False}, S3_EDGES, S3_TOP],
    ids=["filesystem-defaults", "filesystem-disabled", "s3-low-edges", "s3-high-edges"],
)
def test_rendered_offload_section_is_what_the_runtime_reads(
    offload: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cr = _store("3.0.0", offload=offload)
    spec = cr.section("offload")
    path = _rendered(tmp_path, cr, "3.0.0")
    settings = offload_settings.load(path)
    assert settings is not None
    policy = offload_settings.policy(settings, str(path))
    # Every CR field arrives under its Pulsar key with the CR's value (threshold -1 when disabled).
    for field, key in offload_declared.OFFLOAD_KEYS.items():
        if field in spec:
            assert key in settings, f"spec.offload.{field} was not rendered"
    threshold = -1 if spec.get("enabled") is False else spec["thresholdBytes"]
    assert policy.managedLedgerOffloadThresholdInBytes == threshold
    assert policy.managedLedgerOffloadDeletionLagMs == spec["deletionLagMs"]
    assert policy.maxOffloadSegmentSizeInBytes == spec["maxSegmentSizeBytes"]
    assert policy.maxOffloadSegmentRolloverTimeInSeconds == spec["maxSegmentRolloverSeconds"]
    assert policy.minOffloadSegmentRolloverTimeInSeconds == spec["minSegmentRolloverSeconds"]
    store_config = policy.config
    assert store_config.managedLedgerOffloadDriver == spec["driver"]
    assert store_config.managedLedgerOffloadMaxBlockSizeInBytes == spec["maxBlockSizeBytes"]
    if spec["driver"] == "filesystem":
        assert store_config.fileSystemURI == offload_declared.OFFLOAD_MOUNT_DIR
    else:
        assert store_config.managedLedgerOffloadBucket == spec["bucket"]
        assert store_config.managedLedgerOffloadServiceEndpoint == spec["endpoint"]
    # The whole file, through serve's own flag handling (and its release gate), at 3.x.
    config = serve.build_config(_serve_args(path, "3.0.0", monkeypatch, tmp_path))
    assert config.offload == settings


@pytest.mark.parametrize(
    "section",
    [
        {"enabled": True},
        {
            "enabled": True,
            "maxBlockBytes": SRK["maxBlockBytes"]["maximum"],
            "writerInactivityMinutes": SRK["writerInactivityMinutes"]["maximum"],
            "maxWritersPerTopic": SRK["maxWritersPerTopic"]["maximum"],
        },
        {
            "enabled": True,
            "maxBlockBytes": SRK["maxBlockBytes"]["minimum"],
            "writerInactivityMinutes": SRK["writerInactivityMinutes"]["minimum"],
            "maxWritersPerTopic": SRK["maxWritersPerTopic"]["minimum"],
        },
    ],
    ids=["defaults", "maxima", "minima"],
)
def test_rendered_single_key_section_is_what_the_runtime_reads(
    section: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cr = _store("3.0.0", singleKeyTransactions=section)
    spec = cr.section("singleKeyTransactions")
    path = _rendered(tmp_path, cr, "3.0.0")
    ns = _serve_args(path, "3.0.0", monkeypatch, tmp_path)
    expected = SingleKeySettings(
        enabled=True,
        max_block_bytes=spec["maxBlockBytes"],
        writer_inactivity_minutes=spec["writerInactivityMinutes"],
        max_writers_per_topic=spec["maxWritersPerTopic"],
    )
    assert srk_config.single_key_settings(ns, path) == expected
    # The CRD's defaults are the runtime's defaults.
    assert SingleKeySettings(enabled=True) == srk_config.single_key_settings(
        ns, _rendered(tmp_path, _store("3.0.0", singleKeyTransactions={"enabled": True}), "3.0.0", "plain")
    )
    assert serve.build_config(ns).single_key == expected


def test_a_2x_template_gets_a_config_its_release_accepts_and_never_the_3x_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An upgrade in flight: the spec already says 3.x with both features, the template still starts 2.x.
    cr = _store("3.0.0", offload=FS, singleKeyTransactions={"enabled": True})
    old = _rendered(tmp_path, cr, "2.0.0")
    assert set(json.loads(old.read_text())) == {"batchedWrite"}
    config = serve.build_config(_serve_args(old, "2.0.0", monkeypatch, tmp_path))
    assert config.offload is None and not config.single_key.enabled
    # Had the 3.x file reached a 2.x pod, serve would refuse it rather than write what 2.x cannot read.
    new = _rendered(tmp_path, cr, "3.0.0")
    with pytest.raises(ConfigError, match="'single-key-transactions' feature"):
        serve.build_config(_serve_args(new, "2.0.0", monkeypatch, tmp_path))


# ---- ungated pod settings: what the operator renders is what the runtime reads, at the CRD's edges ---

TC_SPEC = yaml.safe_load((ROOT / "crds" / "transactioncoordinators.yaml").read_text())["spec"]["versions"][0][
    "schema"
]["openAPIV3Schema"]["properties"]["spec"]
POLICY_FIELDS = SPEC["properties"]["topicPolicies"]["properties"]
LIMIT_FIELDS = SPEC["properties"]["connectionLimits"]["properties"]


def _coordinator(version: str, **spec: Any) -> Resource:
    full = _defaulted(TC_SPEC, {"version": version, "replicas": 3, "coordinators": 3, **copy.deepcopy(spec)})
    return Resource.from_body(
        {
            "apiVersion": "txnkeeper.io/v1",
            "kind": "TransactionCoordinator",
            "metadata": {"name": "tc", "namespace": "prod", "uid": "u-2", "generation": 1},
            "spec": full,
        }
    )


def _edge(which: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field, schema in POLICY_FIELDS.items():
        out[field] = schema["enum"][-1 if which == "maximum" else 0] if "enum" in schema else schema[which]
    return out


@pytest.mark.parametrize(
    "policies",
    [
        _edge("minimum"),
        _edge("maximum"),
        {"retentionMinutes": 60, "retentionSizeMB": -1},
        {"backlogQuotaLimitSeconds": 0},
    ],
    ids=["minima", "maxima", "retention-by-time", "quota-time-only"],
)
@pytest.mark.parametrize("release", ["1.0.0", "3.0.0"])
def test_rendered_topic_policies_are_what_the_store_reads(
    policies: dict[str, Any], release: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cr = _store(release, topicPolicies=policies)
    path = _rendered(tmp_path, cr, release)
    pod = topic_policies.load(path)
    assert pod is not None
    expected_interval = policies.get("checkIntervalSeconds", store_settings.DEFAULT_CHECK_INTERVAL_SECONDS)
    assert pod.check_interval_seconds == expected_interval
    for field, (block, key) in store_settings.TOPIC_POLICY_FIELDS.items():
        if block is not None and field in policies:
            assert pod.blocks[block][key] == policies[field], field
    assert serve.build_config(_serve_args(path, release, monkeypatch, tmp_path)).topic_policies == pod


@pytest.mark.parametrize(
    "transactions",
    [
        {"maxTimeoutMs": 1},
        {"maxTimeoutMs": coordinator_settings.HARD_MAX_TIMEOUT_MS},
        {
            "namespaces": [
                {"name": "public/default", "maxTimeoutMs": coordinator_settings.DEFAULT_MAX_TIMEOUT_MS}
            ],
            "topics": [
                {"name": "persistent://public/default/orders", "maxTimeoutMs": 1},
                {"name": "x" * names.MAX_TOPIC_NAME, "maxTimeoutMs": 60_000},
            ],
        },
    ],
    ids=["process-minimum", "process-maximum", "namespace-and-topics"],
)
def test_rendered_transaction_timeouts_are_what_the_coordinator_reads(
    transactions: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cr = _coordinator("2.0.0", transactions=transactions)
    path = tmp_path / "tc.json"
    path.write_text(builders.config_map(cr, BATCH, "2.0.0")["data"]["config.json"])
    ns = _serve_args(path, "2.0.0", monkeypatch, tmp_path)
    ns.role = "coordinator"
    policy = serve.build_config(ns).txn_timeouts
    assert policy.max_timeout_ms == transactions.get(
        "maxTimeoutMs", coordinator_settings.DEFAULT_MAX_TIMEOUT_MS
    )
    assert dict(policy.namespaces) == {
        e["name"]: e["maxTimeoutMs"] for e in transactions.get("namespaces", [])
    }
    assert dict(policy.topics) == {e["name"]: e["maxTimeoutMs"] for e in transactions.get("topics", [])}
    # The CRD's constants are the coordinator's own.
    assert coordinator_settings.HARD_MAX_TIMEOUT_MS == timeouts.HARD_MAX_TIMEOUT_MS
    assert TxnTimeoutPolicy().max_timeout_ms == coordinator_settings.DEFAULT_MAX_TIMEOUT_MS


def _limits_env(cr: Resource) -> dict[str, str]:
    sts = builders.statefulset(cr, Template("2.0.0", BATCH), OperatorSettings())
    env = sts["spec"]["template"]["spec"]["containers"][0]["env"]
    return {e["name"]: e["value"] for e in env if e["name"].startswith("TXNKEEPER_") and "value" in e}


def _limits_read(
    env: dict[str, str], path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> ConnectionLimits:
    return _store_config_read(env, path, monkeypatch, tmp_path).connection_limits


def _store_config_read(
    env: dict[str, str], path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> ServeConfig:
    for name in [n for n in os.environ if n.startswith("TXNKEEPER_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser()  # built after the environment is set: its defaults read it
    serve.register(parser.add_subparsers())
    ns = parser.parse_args(
        [
            "serve",
            "--role",
            "store",
            "--data-dir",
            str(tmp_path / "data"),
            "--pod-name",
            "pas-0",
            "--config",
            str(path),
        ]
    )
    return serve.build_config(ns)


@pytest.mark.parametrize("which", ["minimum", "maximum"])
def test_rendered_memory_settings_are_what_the_store_reads_at_the_crds_edges(
    which: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fields = SPEC["properties"][memory.MEMORY_SECTION]["properties"]
    assert set(fields) == set(memory.MEMORY_SETTINGS)
    cr = _store("3.0.0", memory={"tailCacheBytes": fields["tailCacheBytes"][which]})
    config = _store_config_read(_limits_env(cr), _rendered(tmp_path, cr, "3.0.0"), monkeypatch, tmp_path)
    assert config.tail_cache_bytes == fields["tailCacheBytes"][which]


def test_memory_defaults_are_the_runtimes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert memory.MEMORY_SETTINGS["tailCacheBytes"].default == tailcache.DEFAULT_MAX_BYTES
    cr = _store("3.0.0")  # no spec.memory: no variable, the runtime's default
    env = _limits_env(cr)
    assert "TXNKEEPER_TAIL_CACHE_BYTES" not in env
    config = _store_config_read(env, _rendered(tmp_path, cr, "3.0.0"), monkeypatch, tmp_path)
    assert config.tail_cache_bytes == tailcache.DEFAULT_MAX_BYTES


_LIMIT_ATTRS = {
    "maxConnections": "max_connections",
    "maxConnectionsPerAddress": "max_connections_per_address",
    "maxHandshakingConnections": "max_handshaking_connections",
    "handshakeTimeoutSeconds": "handshake_timeout_s",
    "idleTimeoutSeconds": "idle_timeout_s",
    "frameTimeoutSeconds": "frame_timeout_s",
    "writeTimeoutSeconds": "write_timeout_s",
    "maxPendingBytes": "max_pending_bytes",
    "maxUnsentBytes": "max_unsent_bytes",
    "maxTotalUnsentBytes": "max_total_unsent_bytes",
    "maxRequestsInFlight": "max_requests_in_flight",
    "maxTotalRequestBytes": "max_total_request_bytes",
}


@pytest.mark.parametrize("which", ["minimum", "maximum"])
def test_rendered_connection_limits_are_what_the_pods_read_at_the_crds_edges(
    which: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert set(_LIMIT_ATTRS) == set(LIMIT_FIELDS)
    limits = {field: schema.get(which, 2**40) for field, schema in LIMIT_FIELDS.items()}
    cr = _store("2.0.0", connectionLimits=limits)
    read = _limits_read(_limits_env(cr), _rendered(tmp_path, cr, "2.0.0"), monkeypatch, tmp_path)
    for field, attr in _LIMIT_ATTRS.items():
        assert getattr(read, attr) == limits[field], field


def test_connection_limit_floors_are_the_runtimes_and_defaults_its_defaults() -> None:
    defaults = ConnectionLimits()
    for field, attr in _LIMIT_ATTRS.items():
        limit = connections.CONNECTION_LIMITS[field]
        assert limit.default == getattr(defaults, attr), field
        at_floor: dict[str, Any] = {attr: limit.minimum}
        ConnectionLimits(**at_floor)  # the floor is accepted ...
        below: dict[str, Any] = {attr: limit.minimum - 1 if limit.kind is int else 0}
        with pytest.raises(InvalidLimitsError):  # ... and anything under it (the timeouts: 0) refused
            ConnectionLimits(**below)
