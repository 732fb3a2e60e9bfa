"""The query of ``GET /admin/v1/topics/entries`` (contracts §5), checked as hostile input.

Every parameter is named once, known, and a plain ASCII decimal within its range; anything else is a
QueryError saying which parameter was wrong and what it accepts (the HTTP layer answers 400).
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

from txnkeeper.ledger.position import Position

# Ledger and entry ids are non-negative signed 64-bit numbers in the ledger format.
MAX_ID = 2**63 - 1
_MAX_DIGITS = 19
_KNOWN = frozenset({"topic", "ledger", "entry", "maxEntries", "maxBytes"})


class QueryError(ValueError):
    """The query is malformed; the message says what was wrong."""


@dataclass(frozen=True, slots=True)
class EntriesQuery:
    topic: str
    start: Position
    max_entries: int
    max_bytes: int


def parse(raw_query: str, *, max_entries: int, max_bytes: int, defaults: tuple[int, int]) -> EntriesQuery:
    """``defaults``: (entries, bytes) when the query does not say."""
    try:
        pairs = urllib.parse.parse_qsl(
            raw_query, keep_blank_values=True, encoding="utf-8", errors="strict", max_num_fields=16
        )
    except UnicodeDecodeError as exc:
        raise QueryError(f"query string is not UTF-8 once percent-decoded: {exc.reason}") from exc
    except ValueError as exc:  # more fields than max_num_fields
        raise QueryError(f"query string has too many parameters: {exc}") from exc
    seen: dict[str, str] = {}
    for key, value in pairs:
        if key not in _KNOWN:
            raise QueryError(f"unknown query parameter {key[:40]!r}; known: {', '.join(sorted(_KNOWN))}")
        if key in seen:
            raise QueryError(f"query parameter {key!r} is given more than once")
        seen[key] = value
    topic = seen.get("topic", "")
    if not topic:
        raise QueryError("query parameter 'topic' is required (e.g. ?topic=persistent://public/default/t)")
    for required in ("ledger", "entry"):
        if required not in seen:
            raise QueryError(f"query parameter {required!r} is required (ledger id and first entry id)")
    ledger = _number(seen, "ledger", 0, MAX_ID, 0)
    entry = _number(seen, "entry", 0, MAX_ID, 0)
    return EntriesQuery(
        topic,
        Position(ledger, entry),
        _number(seen, "maxEntries", 1, max_entries, defaults[0]),
        _number(seen, "maxBytes", 1, max_bytes, defaults[1]),
    )


def _number(seen: dict[str, str], key: str, low: int, high: int, default: int) -> int:
    text = seen.get(key)
    if text is None:
        return default
    # str.isdigit() and int() accept non-ASCII digits ("\u0661", "\u00b2") and "+1", " 1", "1_0".
    if not (text.isascii() and text.isdecimal() and len(text) <= _MAX_DIGITS) or not low <= int(text) <= high:
        raise QueryError(
            f"query parameter {key!r} must be an integer in {low}..{high} (digits 0-9), got {text[:40]!r}"
        )
    return int(text)
