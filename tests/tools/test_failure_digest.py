"""The test digest read from the JUnit report pytest itself writes (not a hand-made XML)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from failure_digest import main, read_report, render

SUITE = """
import pytest

@pytest.fixture
def broken():
    raise RuntimeError("the fixture could not reach the cluster")

def test_passes():
    assert True

def test_fails():
    ledger_entries = 3
    assert ledger_entries == 4, "entry 3 of ledger 7 was lost"

def test_errors(broken):
    pass

@pytest.mark.skip(reason="not here")
def test_skipped():
    pass
"""


@pytest.fixture(scope="module")
def junit_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One pytest run of SUITE for the whole module (a subprocess: a few seconds)."""
    tmp_path = tmp_path_factory.mktemp("sample")
    (tmp_path / "test_sample.py").write_text(SUITE)
    report = tmp_path / "report.xml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            f"--junitxml={report}",
            str(tmp_path / "test_sample.py"),
        ],
        cwd=tmp_path,
        capture_output=True,
        timeout=120,
        check=False,
    )
    return report


def test_counts_and_each_failure_with_its_assertion(junit_report: Path) -> None:
    digest = read_report("unit", junit_report)
    assert (digest.tests, digest.failed, digest.errors, digest.skipped) == (4, 1, 1, 1)
    assert digest.headline().startswith("unit: 1 passed, 1 failed, 1 errors, 1 skipped in ")
    by_id = dict(digest.failures)
    assert any("entry 3 of ledger 7 was lost" in line for line in by_id["test_sample::test_fails"])
    errored = by_id["test_sample::test_errors (error in set-up or tear-down)"]
    assert any("the fixture could not reach the cluster" in line for line in errored)


def test_a_missing_or_cut_report_is_said_not_raised(tmp_path: Path) -> None:
    cut = tmp_path / "cut.xml"
    cut.write_text("<testsuites><testsuite tests='3'")
    lines = render([("e2e", tmp_path / "absent.xml"), ("unit", cut)])
    assert any(line.startswith("e2e: no report at") for line in lines)
    assert any(line.startswith("unit: unreadable report") for line in lines)


def test_the_command_line_names_each_report(junit_report: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([f"unit={junit_report}"]) == 0
    assert "unit: 1 passed, 1 failed, 1 errors, 1 skipped in " in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"expected NAME=REPORT\.xml"):
        main([str(junit_report)])


def test_a_suite_that_never_started_is_explained_by_its_set_up_log(tmp_path: Path) -> None:
    """The kind scripts' `log` lines land in the set-up log the digest quotes, the last ones last."""
    setup_log = tmp_path / "e2e.setup.log"
    lib = Path(__file__).resolve().parents[2] / "e2e" / "kind" / "lib.sh"
    steps = 'for i in $(seq 1 9); do log "step $i"; done; log "the API server does not answer"'
    script = f'source "{lib}"; {steps}'
    subprocess.run(
        ["bash", "-c", script],
        check=True,
        env={**os.environ, "E2E_SETUP_LOG": str(setup_log)},
        capture_output=True,
    )
    lines = render([("e2e", tmp_path / "e2e.xml")])
    assert lines[-1].endswith("the API server does not answer")
    assert any(line.endswith("step 9") for line in lines)
    assert not any(line.endswith("step 1") for line in lines)
    assert any(line.strip() == f"set-up log {setup_log}:" for line in lines)
