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

from txnkeeper.contract import store_settings
from txnkeeper.server import offload_settings, serve, srk_config
from txnkeeper.server.config import ConfigError
from txnkeeper.topic.writers import SingleKeySettings
from txnkeeper_operator import builders
from txnkeeper_operator.engine import BatchSettings
from txnkeeper_operator.resource import Resource

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
    for field, key in store_settings.OFFLOAD_KEYS.items():
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
        assert store_config.fileSystemURI == store_settings.OFFLOAD_MOUNT_DIR
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
