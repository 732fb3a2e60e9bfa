"""``txnkeeper serve`` refuses settings that switch on a feature its ``--release`` lacks: single-key
transactions (flag or config section) and an offload section on a 2.x pod exit 2 before anything is
written, naming the setting, the feature and the release lines that have it; the same settings start
at 3.x, and a 2.x pod with the features left off starts. Real ``serve`` processes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from runtime_pods import ServePod, http

pytestmark = pytest.mark.timeout(240)

EXIT_TIMEOUT = 120.0  # a refused start only parses flags, but imports are slow on a loaded machine


def _refused(tmp_path: Path, name: str, **kwargs: Any) -> tuple[ServePod, str]:
    pod = ServePod(tmp_path, name, "store", release="2.0.0", **kwargs)
    pod.start(wait=False)
    assert pod.process is not None
    assert pod.process.wait(EXIT_TIMEOUT) == 2, pod.log()
    # Refused before the pod touched its volume: nothing was created, so nothing can be half-written.
    assert not pod.data_dir.exists()
    return pod, pod.log()


def _names_the_gate(log: str, feature: str) -> None:
    assert "txnkeeper serve:" in log and "Traceback" not in log
    assert f"needs the {feature!r} feature (format level 3)" in log
    assert "which release 2.0.0 lacks" in log and "(3.x)" in log and "--release" in log


def test_srk_flag_on_a_2x_pod_is_refused(tmp_path: Path) -> None:
    _, log = _refused(tmp_path, "pas-flag", extra=["--srk-enabled", "true"])
    _names_the_gate(log, "single-key-transactions")
    assert "--srk-enabled true" in log


def test_srk_section_on_a_2x_pod_is_refused_naming_the_file(tmp_path: Path) -> None:
    pod, log = _refused(tmp_path, "pas-file", config={"singleKeyTransactions": {"enabled": True}})
    _names_the_gate(log, "single-key-transactions")
    assert f"{pod.config_path}: singleKeyTransactions.enabled: true" in log


@pytest.mark.parametrize(
    ("section", "shown"),
    [
        # automatic offload by threshold, driver left to its default
        ({"managedLedgerOffloadThresholdInBytes": 0}, "managedLedgerOffloadThresholdInBytes 0"),
        # manual offload only (threshold -1): the admin verbs could still offload
        ({"managedLedgerOffloadDriver": "filesystem"}, "managedLedgerOffloadDriver 'filesystem'"),
    ],
)
def test_offload_section_on_a_2x_pod_is_refused(tmp_path: Path, section: dict[str, Any], shown: str) -> None:
    tier = tmp_path / "tier"
    tier.mkdir()
    config = {"offload": {**section, "fileSystemURI": str(tier)}}
    pod, log = _refused(tmp_path, "pas-offload", config=config)
    _names_the_gate(log, "offload-segments")
    assert f"{pod.config_path}: the 'offload' section" in log and shown in log
    assert list(tier.iterdir()) == []


def test_a_malformed_section_is_reported_as_such_before_the_gate(tmp_path: Path) -> None:
    _, log = _refused(tmp_path, "pas-bad", config={"singleKeyTransactions": {"enabled": "yes"}})
    assert "enabled must be true or false" in log and "feature" not in log


def test_the_same_settings_start_at_3x_and_a_2x_pod_without_them_starts(
    tmp_path: Path, pods: Callable[..., ServePod]
) -> None:
    tier = tmp_path / "tier"
    tier.mkdir()
    config = {
        "singleKeyTransactions": {"enabled": True},
        "offload": {"managedLedgerOffloadDriver": "filesystem", "fileSystemURI": str(tier)},
    }
    new = pods("pas-3", "store", release="3.0.0", config=config)
    status, summary = http("GET", f"{new.admin_url()}/admin/v1/offload/summary")
    assert status == 200 and summary["release"] == "3.0.0"
    # Features off (flag false overrides nothing on; a disabled section) are fine on 2.x.
    old = pods(
        "pas-2",
        "store",
        release="2.0.0",
        config={"singleKeyTransactions": {"enabled": False}},
        extra=["--srk-enabled", "false"],
    )
    status, _ = http("GET", f"{old.admin_url()}/ready")
    assert status == 200
