"""``txnkeeper serve`` settings: coordinator id assignment, config file shapes, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from txnkeeper.bufferedwriter.config import BatchedWriteConfig
from txnkeeper.server.config import (
    OTHER_SECTIONS,
    ConfigError,
    batch_configs,
    coordinator_ids,
    load_document,
    section,
)


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


@pytest.mark.parametrize("ids", ["\u0661,\u0662", "\u00b2", "1,\uff13", "1" * 10])
def test_coordinator_ids_are_ascii_digits(ids: str) -> None:
    """int() accepts Arabic-Indic and full-width digits (and isdigit() superscripts int() then refuses)."""
    with pytest.raises(ConfigError, match="integers 0-9"):
        coordinator_ids(None, ids)


@pytest.mark.parametrize("pod_name", ["tc-\u0661", "tc-\u00b2"])
def test_auto_ordinal_is_ascii_digits(pod_name: str) -> None:
    with pytest.raises(ConfigError, match="ending in -<ordinal>"):
        coordinator_ids(6, "auto", replicas=3, pod_name=pod_name)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"batchedWrite": {"maxDelayMillis": 1000000000000}}', r"maxDelayMillis .* to 60000"),
        ('{"batchedWrite": {"maxSizeBytes": 33554432}}', r"maxSizeBytes .* to 16777216"),
        ('{"batchedWrite": {"maxRecords": 65537}}', r"maxRecords .* to 65536"),
        ('{"batchedWrite": {"maxDelayMillis": NaN}}', r"NaN is not a number"),
        ('{"batchedWrite": {"maxRecords": ' + "9" * 5000 + "}}", r"config file .*: Exceeds the limit"),
        ("[" * 100_000 + "]" * 100_000, r"nests too deeply"),
        (
            '{"batchedWrite": {"maxRecords": ' + "[" * 900 + "]" * 900 + "}}",
            r"maxRecords .* got a JSON array",
        ),
        (
            '{"batchedWrite": {"enabled": ' + "[" * 900 + "]" * 900 + "}}",
            r"enabled must be true or false, got a JSON array",
        ),
        ('{"batchedWrite": {"enabled": true, "batchedWriteMaxRecords": 4}}', r"not a mix"),
        ('{"batchedWrite": {"maxRecord": 4}}', r"unknown batchedWrite key\(s\) \['maxRecord'\]"),
        ('{"batchedWrite": {"flushMode": "eager"}}', r"flushMode must be one of \['adaptive', 'delay'\]"),
        # Once silently ignored next to batchedWrite: a misspelt section must not vanish.
        ('{"batchedWrite": {}, "ofload": {}}', r"unknown top-level key\(s\) \['ofload'\]"),
        ('{"coordinator": {}, "batchedWrite": {}}', r"unknown top-level key\(s\) \['coordinator'\]"),
        ('{"coordinator": {}, "extra": 1}', r"unknown key\(s\) \['extra'\] next to coordinator"),
    ],
)
def test_bad_config_files_are_refused_naming_the_file(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as refused:
        batch_configs(path)
    assert str(path) in str(refused.value)


def test_config_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(b'{"batchedWrite": {"enabled": tru\xff}}')
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 32\)"):
        batch_configs(path)


def test_config_file_accepts_the_contract_bounds(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    block = {"enabled": True, "maxRecords": 65536, "maxSizeBytes": 16 * 1024 * 1024, "maxDelayMillis": 60000}
    path.write_text(json.dumps({"batchedWrite": block}))
    txnlog, _pending = batch_configs(path)
    assert (txnlog.max_records, txnlog.max_size_bytes, txnlog.max_delay_millis) == (65536, 1 << 24, 60000)


def test_other_modules_sections_sit_next_to_the_batch_settings(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    doc = {
        "batchedWrite": {"enabled": True, "maxRecords": 8, "flushMode": "delay"},
        "offload": {"driver": "filesystem"},
        "singleKeyTransactions": {"enabled": True},
        "transactions": {"maxTimeoutMs": 60_000},
        "topicPolicies": {"checkIntervalSeconds": 5},
        "pulsar": {"partitionedTopics": {"persistent://t/n/orders": 2}},
        "tls": {"certFile": "/etc/txnkeeper/tls/tls.crt"},
        "connectionLimits": {"maxConnections": 10},
        "memory": {"tailCacheBytes": 0},
    }
    path.write_text(json.dumps(doc))
    txnlog, pending = batch_configs(path)
    assert txnlog == pending == BatchedWriteConfig(enabled=True, max_records=8, flush_mode="delay")
    loaded = load_document(path)
    assert section(loaded, "offload") == {"driver": "filesystem"}
    assert section(loaded, "singleKeyTransactions") == {"enabled": True}
    assert section(loaded, "transactions") == {"maxTimeoutMs": 60_000}
    assert section(loaded, "topicPolicies") == {"checkIntervalSeconds": 5}
    assert section(loaded, "pulsar") == {"partitionedTopics": {"persistent://t/n/orders": 2}}
    assert section(loaded, "tls") == {"certFile": "/etc/txnkeeper/tls/tls.crt"}
    assert section(loaded, "connectionLimits") == {"maxConnections": 10}
    assert set(OTHER_SECTIONS) == {
        "offload",
        "singleKeyTransactions",
        "transactions",
        "topicPolicies",
        "pulsar",
        "tls",
        "connectionLimits",
        "memory",
    }
    # Beside the bare CR block too, and a file holding only another module's section is all defaults.
    path.write_text(json.dumps({"enabled": True, "offload": {}}))
    assert batch_configs(path)[0].enabled
    path.write_text(json.dumps({"singleKeyTransactions": {}}))
    assert batch_configs(path) == (BatchedWriteConfig(), BatchedWriteConfig())
    assert section(load_document(path), "offload") is None
    with pytest.raises(ConfigError, match="section offload must be an object"):
        section({"offload": []}, "offload")
    with pytest.raises(ValueError, match="not a known config-file section"):
        section(loaded, "offlaod")
