"""The last screen of `make test`: each suite's counts and, for every failed test, its id and its error.

Why it exists: the unit suite and the e2e suite run side by side and each one's output is printed whole
when it ends, so a failure in the suite that ends first scrolls far up, under the other's output and
(for e2e) the cluster diagnostics. A CI run keeps only part of that output, mostly its end. This reads
the JUnit XML reports both pytest runs write and prints, last, what failed and why, in a few lines.

Usage: python tests/tools/failure_digest.py NAME=REPORT.xml ...   (never fails: it only reports)
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

MAX_FAILURES_SHOWN = 8
ERROR_LINES_SHOWN = 6
LINE_WIDTH = 220
SETUP_LINES_SHOWN = 6


@dataclass
class SuiteDigest:
    """What one JUnit report says: counts, time, and the failed tests' ids with their error lines."""

    name: str
    tests: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    seconds: float = 0.0
    failures: list[tuple[str, list[str]]] = field(default_factory=list)

    def headline(self) -> str:
        passed = self.tests - self.failed - self.errors - self.skipped
        parts = [f"{passed} passed"]
        for count, word in ((self.failed, "failed"), (self.errors, "errors"), (self.skipped, "skipped")):
            if count:
                parts.append(f"{count} {word}")
        return f"{self.name}: {', '.join(parts)} in {self.seconds:.0f} s"


def error_lines(element: ET.Element) -> list[str]:
    """The lines that say why: pytest's 'E ' lines (the assertion and its explanation), else the message."""
    text = element.text or ""
    marked = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    lines = marked or [element.get("message", "").strip() or "(no message)"]
    return [line[:LINE_WIDTH] for line in lines if line][:ERROR_LINES_SHOWN]


def read_report(name: str, path: Path) -> SuiteDigest:
    """Parse one pytest JUnit report (both the xunit1 and xunit2 families have these attributes)."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    digest = SuiteDigest(name)
    for suite in suites:
        digest.tests += int(suite.get("tests", "0"))
        digest.failed += int(suite.get("failures", "0"))
        digest.errors += int(suite.get("errors", "0"))
        digest.skipped += int(suite.get("skipped", "0"))
        digest.seconds += float(suite.get("time", "0") or 0)
        for case in suite.iter("testcase"):
            for outcome in ("failure", "error"):
                element = case.find(outcome)
                if element is not None:
                    test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
                    label = "" if outcome == "failure" else " (error in set-up or tear-down)"
                    digest.failures.append((test_id + label, error_lines(element)))
    return digest


def setup_log_tail(report: Path) -> list[str]:
    """The last lines of the suite's set-up log beside its report (`e2e.setup.log` for `e2e.xml`).

    A suite that never started wrote no report; its set-up (for e2e: the kind cluster) says why there.
    """
    log = report.with_suffix(".setup.log")
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return []
    tail = [line[:LINE_WIDTH] for line in text.splitlines() if line.strip()][-SETUP_LINES_SHOWN:]
    return [f"set-up log {log}:"] + [f"  {line}" for line in tail] if tail else []


def render(named_reports: list[tuple[str, Path]]) -> list[str]:
    lines = ["", "===== test digest (each suite's full output is above) ====="]
    for name, path in named_reports:
        if not path.is_file():
            lines.append(f"{name}: no report at {path} (the suite was skipped or did not start; see above)")
            lines.extend(f"  {line}" for line in setup_log_tail(path))
            continue
        try:
            digest = read_report(name, path)
        except (ET.ParseError, ValueError) as exc:
            lines.append(f"{name}: unreadable report {path}: {exc} (the run was cut short; see above)")
            continue
        lines.append(digest.headline())
        for test_id, why in digest.failures[:MAX_FAILURES_SHOWN]:
            lines.append(f"  FAILED {test_id}")
            lines.extend(f"      {line}" for line in why)
        hidden = len(digest.failures) - MAX_FAILURES_SHOWN
        if hidden > 0:
            lines.append(f"  ... and {hidden} more failures (see above)")
    return lines


def parse_args(argv: list[str]) -> list[tuple[str, Path]]:
    named = []
    for arg in argv:
        name, sep, path = arg.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"failure_digest: expected NAME=REPORT.xml, got {arg!r}")
        named.append((name, Path(path)))
    return named


def main(argv: list[str]) -> int:
    print("\n".join(render(parse_args(argv))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
