"""The singleKeyTransactions config section and the --srk-* serve flags: precedence and clear errors."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from txnkeeper.bufferedwriter.config import BatchedWriteConfig
from txnkeeper.server import srk_config
from txnkeeper.server.config import ConfigError, batch_configs
from txnkeeper.topic.writers import SingleKeySettings


def _flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    srk_config.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_section_flags_and_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ENABLED", "MAX_BLOCK_BYTES", "WRITER_INACTIVITY_MINUTES", "MAX_WRITERS_PER_TOPIC"):
        monkeypatch.delenv(f"TXNKEEPER_SRK_{name}", raising=False)
    assert srk_config.single_key_settings(_flags(), None) == SingleKeySettings()
    assert not SingleKeySettings().enabled
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "batchedWrite": {"enabled": True, "maxRecords": 64},
                "singleKeyTransactions": {"enabled": True, "maxBlockBytes": 4096, "maxWritersPerTopic": 5},
            }
        )
    )
    settings = srk_config.single_key_settings(_flags(), path)
    assert settings == SingleKeySettings(True, 4096, SingleKeySettings().writer_inactivity_minutes, 5)
    # The batchedWrite parser ignores the section (and still reads its own).
    assert batch_configs(path)[0] == BatchedWriteConfig(enabled=True, max_records=64)
    flagged = srk_config.single_key_settings(
        _flags("--srk-enabled", "false", "--srk-writer-inactivity-minutes", "30"), path
    )
    assert not flagged.enabled and flagged.writer_inactivity_minutes == 30 and flagged.max_block_bytes == 4096
    path.write_text(json.dumps({"singleKeyTransactions": {"enabled": True}}))
    assert batch_configs(path) == (BatchedWriteConfig(), BatchedWriteConfig())


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"enabled": "yes"}, "enabled must be true or false"),
        ({"maxBlockBytes": 0}, "maxBlockBytes must be an integer in 1..16777216"),
        ({"maxWritersPerTopic": True}, "maxWritersPerTopic must be an integer"),
        ({"maxBlockSize": 5}, "unknown key(s) ['maxBlockSize']"),
        ([], "must be an object"),
    ],
)
def test_bad_section_is_a_clear_error(tmp_path: Path, section: object, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"singleKeyTransactions": section}))
    with pytest.raises(ConfigError) as refused:
        srk_config.single_key_settings(_flags(), path)
    assert message in str(refused.value) and str(path) in str(refused.value)


def test_bad_flag_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"--srk-max-block-bytes must be an integer in 1\.\.16777216"):
        srk_config.single_key_settings(_flags("--srk-max-block-bytes", "-1"), None)
