"""Every spelling of the batchedWrite settings goes through the one BatchSettings in txnkeeper.contract.

The operator writes the block into the pods' --config file and the CR; the runtime parses that file
with its own loader. This proves the two agree field by field, and that each spelling round-trips.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from txnkeeper.contract import batching
from txnkeeper.contract.batching import BatchSettings
from txnkeeper.server.config import batch_configs

ON = BatchSettings(enabled=True, max_records=100, max_size_bytes=65536, max_delay_millis=7)


def test_block_and_stat_spellings_round_trip() -> None:
    assert BatchSettings.from_block(ON.to_block()) == ON
    assert BatchSettings.from_stat(ON.to_stat()) == ON
    assert ON.to_block() == {"enabled": True, "maxRecords": 100, "maxSizeBytes": 65536, "maxDelayMillis": 7}


def test_a_missing_field_takes_the_contract_default() -> None:
    defaults = BatchSettings.from_block({})
    assert defaults == BatchSettings()
    assert defaults.to_block() == {
        "enabled": batching.DEFAULT_ENABLED,
        "maxRecords": batching.DEFAULT_MAX_RECORDS,
        "maxSizeBytes": batching.DEFAULT_MAX_SIZE_BYTES,
        "maxDelayMillis": batching.DEFAULT_MAX_DELAY_MILLIS,
    }


def test_the_runtime_reads_the_block_the_operator_writes(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"batchedWrite": ON.to_block()}))
    for parsed in batch_configs(config):
        assert (parsed.enabled, parsed.max_records, parsed.max_size_bytes, parsed.max_delay_millis) == (
            ON.enabled,
            ON.max_records,
            ON.max_size_bytes,
            ON.max_delay_millis,
        )


def test_the_block_spelling_is_strict() -> None:
    # bool("false") is True: a lenient parser would have enabled batching here.
    for block, message in (
        ({"enabled": "false"}, r"batchedWrite.enabled must be true or false, got 'false'"),
        ({"maxRecords": 1.5}, r"batchedWrite.maxRecords must be an integer"),
        ({"maxRecords": True}, r"batchedWrite.maxRecords must be an integer"),
        ({"flushMode": "eager"}, r"batchedWrite.flushMode must be one of"),
        ({"maxRecrods": 4}, r"unknown key\(s\) \['maxRecrods'\]"),
    ):
        with pytest.raises(batching.InvalidBatchSettingsError, match=message):
            BatchSettings.from_block(block)


def test_the_flush_mode_is_spelled_only_when_not_the_default() -> None:
    delay = BatchSettings(enabled=True, flush_mode="delay")
    assert BatchSettings.from_block(delay.to_block()) == delay
    assert delay.to_block()["flushMode"] == "delay"
    assert delay.to_stat()["batchedWriteFlushMode"] == "delay"
    assert "flushMode" not in BatchSettings().to_block()  # what the operator renders is unchanged


def test_the_runtime_and_the_contract_spell_every_setting_alike(tmp_path: Path) -> None:
    delay = BatchSettings(
        enabled=True, max_records=100, max_size_bytes=65536, max_delay_millis=7, flush_mode="delay"
    )
    config = tmp_path / "config.json"
    for doc in (
        {"batchedWrite": delay.to_block()},
        {"coordinator": delay.to_stat(), "pendingAck": delay.to_block()},
    ):
        config.write_text(json.dumps(doc))
        for parsed in batch_configs(config):
            assert parsed.to_stat() == delay.to_stat()
