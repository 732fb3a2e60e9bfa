"""engine/windows.py: cron-style maintenance windows, matched per minute in UTC, with the next opening
found for the reason a waiting restart gives; every malformed expression refused naming its part."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from txnkeeper_operator.engine.windows import (
    MaintenanceWindow,
    WindowError,
    crd_pattern,
    inside,
    next_opening,
    parse_windows,
)

SAT_2159 = datetime(2026, 11, 21, 21, 59, 30, tzinfo=UTC)  # a Saturday


@pytest.mark.parametrize(
    ("expression", "moment", "expected"),
    [
        ("* 22-23 * * SAT,SUN", datetime(2026, 11, 21, 22, 0, tzinfo=UTC), True),
        ("* 22-23 * * SAT,SUN", datetime(2026, 11, 23, 22, 0, tzinfo=UTC), False),  # Monday
        ("* 22-23 * * 0", datetime(2026, 11, 22, 23, 59, tzinfo=UTC), True),  # Sunday as 0
        ("* 22-23 * * 7", datetime(2026, 11, 22, 23, 59, tzinfo=UTC), True),  # and as 7
        ("*/15 * * * *", datetime(2026, 11, 21, 3, 45, tzinfo=UTC), True),
        ("*/15 * * * *", datetime(2026, 11, 21, 3, 46, tzinfo=UTC), False),
        ("10-50/20 * * * *", datetime(2026, 11, 21, 3, 30, tzinfo=UTC), True),
        ("5/20 * * * *", datetime(2026, 11, 21, 3, 45, tzinfo=UTC), True),
        ("* * 1 jan *", datetime(2027, 1, 1, 12, 0, tzinfo=UTC), True),
        # Both day fields restricted: either matches (cron's rule).
        ("* * 1 * MON", datetime(2026, 11, 23, 12, 0, tzinfo=UTC), True),
        ("* * 1 * MON", datetime(2026, 12, 1, 12, 0, tzinfo=UTC), True),
        ("* * 1 * MON", datetime(2026, 12, 2, 12, 0, tzinfo=UTC), False),
    ],
)
def test_a_minute_is_inside_when_the_expression_matches_it(
    expression: str, moment: datetime, expected: bool
) -> None:
    assert MaintenanceWindow.parse(expression).contains(moment) is expected


def test_the_next_opening_is_the_earliest_of_all_windows() -> None:
    windows = parse_windows(["0-30 2 * * MON", "* 23 * * *"])
    assert next_opening(windows, SAT_2159) == datetime(2026, 11, 21, 23, 0, tzinfo=UTC)
    assert next_opening(parse_windows(["0-30 2 * * MON"]), SAT_2159) == datetime(
        2026, 11, 23, 2, 0, tzinfo=UTC
    )
    assert next_opening(parse_windows(["* * 31 2 *"]), SAT_2159) is None  # never: 31 February
    # Inside: the next opening is this minute.
    assert next_opening(windows, datetime(2026, 11, 21, 23, 5, 0, tzinfo=UTC)).minute == 5  # type: ignore[union-attr]
    assert inside((), SAT_2159) and not inside(windows, SAT_2159)


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("", "1..200 characters"),
        ("* * * *", "has 4 fields; a maintenance window has 5"),
        ("* * * * * *", "has 6 fields"),
        ("60 * * * *", "'60' is out of range for minute (0-59)"),
        ("* 24 * * *", "out of range for hour (0-23)"),
        ("* * 0 * *", "out of range for day-of-month (1-31)"),
        ("* * * 13 *", "month (1-12 or JAN-DEC)"),
        ("* * * * 8", "day-of-week (0-7 or SUN-SAT)"),
        ("* * * * FUNDAY", "'FUNDAY' is out of range for day-of-week"),
        ("5-1 * * * *", "the range runs backwards (5 > 1)"),
        ("*/0 * * * *", "the step must be 1..59"),
        ("*/x * * * *", "the step must be"),
        ("\u0661 * * * *", "out of range for minute"),
        ("-1 * * * *", "out of range for minute"),
        ("1,,2 * * * *", "out of range for minute"),
        ("*" * 201, "1..200 characters"),
    ],
)
def test_malformed_windows_are_refused_naming_the_part(expression: str, problem: str) -> None:
    with pytest.raises(WindowError) as refused:
        MaintenanceWindow.parse(expression)
    assert problem in str(refused.value)


def test_at_most_sixteen_windows() -> None:
    with pytest.raises(WindowError, match="at most 16"):
        parse_windows(["* * * * *"] * 17)


@pytest.mark.parametrize(
    "expression",
    ["* 22-23 * * SAT,SUN", "*/15 * * * *", "05 0 1 jan 0", " 0-30 2 * * MON ", "60 * * * *", "* 24 * * *",
     "* * * * 8", "* * * *", "1,,2 * * * *", "* * 0 * *", "* * * 13 *", "x * * * *", "* * * * FUNDAY"],
)  # fmt: skip
def test_the_crd_pattern_accepts_what_parse_accepts(expression: str) -> None:
    """The CRD refuses at `kubectl apply` what the engine would fail on (backwards ranges and zero
    steps, which a pattern cannot see, are left to the engine's Failed phase)."""
    try:
        MaintenanceWindow.parse(expression)
        parses = True
    except WindowError:
        parses = False
    assert bool(re.match(crd_pattern(), expression)) is parses
