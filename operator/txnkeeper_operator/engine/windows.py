"""Maintenance windows: when the engine may restart healthy pods (``spec.maintenanceWindows``).

Why: a rollout restarts pods one at a time, and every restart moves clients and replays a store;
operators of production clusters want that to happen when they say (Strimzi's
``maintenanceTimeWindows``). A window is a cron expression in UTC; the time is inside the window
during every minute the expression matches, so ``* 22-23 * * SAT,SUN`` is 22:00-23:59 on weekends.
Only planned restarts wait: a pod that is already down is still restarted at once (recovery), and the
steps that restart nothing (templates, batch-log switches, rollovers, the verifier) go on, so the
rollout is as far along as it can be when the window opens. Pure: the caller passes the time.

Syntax (five fields: minute hour day-of-month month day-of-week): ``*``, ``N``, ``N-M``, each optionally
``/STEP``, comma-separated lists; months ``1-12`` or ``JAN``-``DEC``, weekdays ``0-7`` (0 and 7 are
Sunday) or ``SUN``-``SAT``. As in cron, when both day fields are restricted a day matching either one
matches.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

MAX_WINDOWS = 16
MAX_EXPRESSION_LENGTH = 200
# How far ahead the engine looks for the next opening (to say when a waiting restart will happen).
LOOKAHEAD_DAYS = 366

_MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_DAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    low: int
    high: int
    digits: str  # RE2 for the numbers low..high, one or two digits (the CRD's check)
    names: tuple[str, ...] = ()
    names_from: int = 0


_FIELDS = (
    _Field("minute", 0, 59, "[0-5]?[0-9]"),
    _Field("hour", 0, 23, "[01]?[0-9]|2[0-3]"),
    _Field("day-of-month", 1, 31, "0?[1-9]|[12][0-9]|3[01]"),
    _Field("month", 1, 12, "0?[1-9]|1[0-2]", _MONTHS, 1),
    _Field("day-of-week", 0, 7, "0?[0-7]", _DAYS, 0),
)
EXAMPLE = "* 22-23 * * SAT,SUN"


class WindowError(ValueError):
    """An expression that is not a maintenance window; the message says which part and why."""


@dataclass(frozen=True, slots=True)
class MaintenanceWindow:
    expression: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday .. 6 = Saturday
    days_restricted: bool
    weekdays_restricted: bool

    @classmethod
    def parse(cls, expression: str) -> MaintenanceWindow:
        text = expression.strip()
        if not text or len(expression) > MAX_EXPRESSION_LENGTH:
            raise WindowError(
                f"a maintenance window is 1..{MAX_EXPRESSION_LENGTH} characters, e.g. {EXAMPLE!r}"
            )
        parts = text.split()
        if len(parts) != len(_FIELDS):
            raise WindowError(
                f"{expression!r} has {len(parts)} fields; a maintenance window has 5 (minute hour "
                f"day-of-month month day-of-week, in UTC), e.g. {EXAMPLE!r}"
            )
        sets = [_parse_field(part, spec, expression) for part, spec in zip(parts, _FIELDS, strict=True)]
        weekdays = frozenset(d % 7 for d in sets[4])
        return cls(
            expression=text,
            minutes=sets[0],
            hours=sets[1],
            days=sets[2],
            months=sets[3],
            weekdays=weekdays,
            days_restricted=parts[2] != "*",
            weekdays_restricted=parts[4] != "*",
        )

    def _day_matches(self, moment: datetime) -> bool:
        if moment.month not in self.months:
            return False
        in_days = moment.day in self.days
        in_weekdays = (moment.isoweekday() % 7) in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return in_days or in_weekdays
        return in_days and in_weekdays

    def contains(self, moment: datetime) -> bool:
        return self._day_matches(moment) and moment.hour in self.hours and moment.minute in self.minutes

    def next_opening(self, moment: datetime) -> datetime | None:
        """The first minute at or after ``moment`` inside this window (None within the lookahead)."""
        start = moment.replace(second=0, microsecond=0)
        if start < moment:
            start += timedelta(minutes=1)
        day = start.replace(hour=0, minute=0)
        for offset in range(LOOKAHEAD_DAYS + 1):
            current = day + timedelta(days=offset)
            if not self._day_matches(current):
                continue
            for hour in sorted(self.hours):
                for minute in sorted(self.minutes):
                    candidate = current.replace(hour=hour, minute=minute)
                    if candidate >= start:
                        return candidate
        return None


def parse_windows(expressions: list[str] | tuple[str, ...]) -> tuple[MaintenanceWindow, ...]:
    if len(expressions) > MAX_WINDOWS:
        raise WindowError(f"at most {MAX_WINDOWS} maintenance windows, got {len(expressions)}")
    return tuple(MaintenanceWindow.parse(e) for e in expressions)


def inside(windows: tuple[MaintenanceWindow, ...], moment: datetime) -> bool:
    """No windows: always (restarts are not restricted)."""
    return not windows or any(w.contains(moment) for w in windows)


def next_opening(windows: tuple[MaintenanceWindow, ...], moment: datetime) -> datetime | None:
    openings = [o for o in (w.next_opening(moment) for w in windows) if o is not None]
    return min(openings, default=None)


def crd_pattern() -> str:
    """An RE2 pattern (the CRD's CEL check) for what ``parse`` accepts, but backwards ranges: values in
    range, names case-insensitive, five fields."""
    fields = []
    for spec in _FIELDS:
        value = f"(?:{spec.digits}|{'|'.join(spec.names)})" if spec.names else f"(?:{spec.digits})"
        # [*], not a backslash: the pattern sits in a CEL string literal, where "\*" is no escape.
        element = f"(?:[*]|{value}(?:-{value})?)(?:/[0-9]{{1,2}})?"
        fields.append(f"{element}(?:,{element})*")
    return "(?i)^ *" + " +".join(fields) + " *$"


def _parse_field(part: str, spec: _Field, expression: str) -> frozenset[int]:
    values: set[int] = set()
    for item in part.split(","):
        where = f"{spec.name} {item!r} in {expression!r}"
        body, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not (step_text.isascii() and step_text.isdecimal()) or not 1 <= int(step_text) <= spec.high:
                raise WindowError(f"{where}: the step must be 1..{spec.high}")
            step = int(step_text)
        if body == "*":
            low, high = spec.low, spec.high
        else:
            first, dash, last = body.partition("-")
            low = _value(first, spec, where)
            high = _value(last, spec, where) if dash else (spec.high if slash else low)
            if high < low:
                raise WindowError(f"{where}: the range runs backwards ({low} > {high})")
        values.update(range(low, high + 1, step))
    return frozenset(values)


def _value(text: str, spec: _Field, where: str) -> int:
    upper = text.upper()
    if upper in spec.names:
        return spec.names.index(upper) + spec.names_from
    if text.isascii() and text.isdecimal() and len(text) <= 2 and spec.low <= int(text) <= spec.high:
        return int(text)
    names = f" or {spec.names[0]}-{spec.names[-1]}" if spec.names else ""
    raise WindowError(f"{where}: {text!r} is out of range for {spec.name} ({spec.low}-{spec.high}{names})")
