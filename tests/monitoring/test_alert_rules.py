"""The chart's alert rules, checked by the real promtool: `promtool check rules` on what helm renders
with `metrics.prometheusRule.enabled=true`, and `promtool test rules` with a unit test for every alert
(alerts_*_test.yaml beside this file: input series, when each alert fires and when it must not)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from monitoring_tools import (
    HELM,
    HELM_MISSING,
    HERE,
    PROMETHEUS_MISSING,
    PROMTOOL,
    alert_names,
    render_rules,
)

pytestmark = [
    pytest.mark.skipif(HELM is None, reason=HELM_MISSING),
    pytest.mark.skipif(PROMTOOL is None, reason=PROMETHEUS_MISSING),
]
UNIT_TESTS = sorted(HERE.glob("alerts_*_test.yaml"))
RUNBOOK = Path(__file__).resolve().parents[2] / "docs" / "monitoring.md"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def rules_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The rendered rules as rules.yaml, with the unit tests beside it (they name it relatively)."""
    workdir = tmp_path_factory.mktemp("rules")
    (workdir / "rules.yaml").write_text(yaml.safe_dump(render_rules(), sort_keys=False))
    for test in UNIT_TESTS:
        shutil.copy(test, workdir / test.name)
    return workdir


def test_rendered_rules_pass_promtool_check(rules_dir: Path) -> None:
    result = _promtool("check", "rules", str(rules_dir / "rules.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_promtool_unit_test_and_they_pass(rules_dir: Path) -> None:
    alerts = alert_names(yaml.safe_load((rules_dir / "rules.yaml").read_text()))
    tested = {
        case["alertname"]
        for path in UNIT_TESTS
        for test in yaml.safe_load(path.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")  # a test that only says "does not fire" proves nothing alone
    }
    assert sorted(set(alerts) - tested) == [], "alerts without a unit test in which they fire"
    result = _promtool("test", "rules", *(str(rules_dir / p.name) for p in UNIT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_links_a_runbook_section_that_exists() -> None:
    text = RUNBOOK.read_text()
    anchors = {
        line.removeprefix("### ").strip().lower() for line in text.splitlines() if line.startswith("### ")
    }
    for group in render_rules()["groups"]:
        for rule in group["rules"]:
            url = rule["annotations"]["runbook_url"]
            assert url.endswith("docs/monitoring.md#" + rule["alert"].lower()), url
            assert rule["alert"].lower() in anchors, f"docs/monitoring.md has no '### {rule['alert']}'"


def test_thresholds_come_from_values() -> None:
    rules = render_rules(
        "metrics.prometheusRule.alerts.downgradeBlockedHours=48",
        "metrics.prometheusRule.runbookUrl=https://example.org/ops.md",
    )
    blocked = next(
        r for g in rules["groups"] for r in g["rules"] if r["alert"] == "TxnkeeperDowngradeBlocked"
    )
    assert blocked["for"] == "48h"
    assert blocked["annotations"]["runbook_url"] == "https://example.org/ops.md#txnkeeperdowngradeblocked"
