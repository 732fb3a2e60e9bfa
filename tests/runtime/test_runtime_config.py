"""``txnkeeper serve`` settings: coordinator id assignment, config file shapes, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from txnkeeper.bufferedwriter.config import BatchedWriteConfig
from txnkeeper.server.config import ConfigError, batch_configs, coordinator_ids


def test_coordinator_ids() -> None:
    assert coordinator_ids(None, None) == (0,)
    assert coordinator_ids(3, None) == (0, 1, 2)
    assert coordinator_ids(None, "4,2") == (4, 2)
    # auto: one StatefulSet template, ids spread by ordinal
    assert coordinator_ids(6, "auto", replicas=3, pod_name="tc-1") == (1, 4)
    assert coordinator_ids(6, "auto", replicas=3, pod_name="txn-tc-0") == (0, 3)
    for bad in ("a,b", "1,1", "-1"):
        with pytest.raises(ConfigError):
            coordinator_ids(None, bad)
    with pytest.raises(ConfigError, match="--replicas"):
        coordinator_ids(6, "auto", pod_name="tc-1")
    with pytest.raises(ConfigError, match="ordinal"):
        coordinator_ids(6, "auto", replicas=3, pod_name="tc")
    with pytest.raises(ConfigError, match="serves no coordinator"):
        coordinator_ids(2, "auto", replicas=3, pod_name="tc-2")


def test_batch_config_shapes(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"batchedWrite": {"enabled": True, "maxRecords": 64}}))
    txnlog, pending = batch_configs(path)
    assert txnlog == pending == BatchedWriteConfig(enabled=True, max_records=64)
    path.write_text(json.dumps({"coordinator": {"batchEnabled": True}, "pendingAck": {"maxDelayMillis": 5}}))
    txnlog, pending = batch_configs(path)
    assert txnlog.enabled and not pending.enabled and pending.max_delay_millis == 5
    assert batch_configs(None) == (BatchedWriteConfig(), BatchedWriteConfig())
    path.write_text(json.dumps({"batchedWrite": {"enabled": True, "maxRecrods": 64}}))
    with pytest.raises(ConfigError, match="maxRecrods"):
        batch_configs(path)
    path.write_text(json.dumps({"batchedWrite": {"maxRecords": 0}}))
    with pytest.raises(ConfigError, match="maxRecords"):
        batch_configs(path)
    with pytest.raises(ConfigError, match="cannot read"):
        batch_configs(tmp_path / "missing.json")
    path.write_bytes(b'{"batchedWrite": {"enabled": true}}\xff')
    with pytest.raises(ConfigError, match=rf"cannot read config file {path}: 'utf-8' codec"):
        batch_configs(path)
