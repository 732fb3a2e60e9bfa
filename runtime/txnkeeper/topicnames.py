"""The one rule for topic and subscription names, wherever a name enters: the store's wire requests,
the coordinator's (a name it logged must be one every store accepts at the end, which it retries until
applied) and the admin API's topic verbs.

Why a low-layer module: those are independent layers that must refuse the same names in the same
words. The rule is about characters only: ``ledger/names.py`` stores any name it allows in a bounded
file name (a long one in a hashed form), so how many bytes a name takes on disk is never the client's
concern (docs/contracts.md §1, "Name encoding").
"""

from __future__ import annotations

import re

MAX_NAME = 512  # characters (a UTF-8 name of 512 four-byte characters is 2 KiB)
PENDING_ACK_SUFFIX = "__transaction_pending_ack"  # the store's pending-ack logs are named with it
_CONTROL = re.compile(r"[\x00-\x1f]")


def name_problem(kind: str, name: str) -> str | None:
    """What is wrong with ``name`` as a ``kind`` ("topic" or "subscription") name; None if nothing."""
    if not name or len(name) > MAX_NAME or _CONTROL.search(name) is not None:
        shown = repr(name) if len(name) <= 80 else f"{name[:60]!r}... ({len(name)} characters)"
        return f"{kind} name {shown} must be 1..{MAX_NAME} printable characters"
    if name.endswith(PENDING_ACK_SUFFIX):
        return f"{kind} name {name[:80]!r} may not end with {PENDING_ACK_SUFFIX}"
    return None
