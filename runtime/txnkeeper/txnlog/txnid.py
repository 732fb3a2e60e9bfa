"""The transaction id as the stores key records by it: (most = coordinator id, least = sequence).

It lives in layer 3 because both stores group records by it and the coordinator (layer 4) hands it
down; ``txnkeeper.coordinator.txnid`` re-exports this very class.
"""

from __future__ import annotations

import re
from typing import NamedTuple, Protocol

_TEXT = re.compile(r"^\(?\s*(\d+)\s*,\s*(\d+)\s*\)?$")


class TxnIdLike(Protocol):
    """Anything carrying a transaction id's two halves (so callers may pass their own TxnID class)."""

    @property
    def most(self) -> int: ...

    @property
    def least(self) -> int: ...


class TxnID(NamedTuple):
    """Pulsar's TxnID: (mostSigBits, leastSigBits), printed ``(most,least)``.

    A named tuple for the same reason as ``ledger.Position``: one is hashed on every request that
    names a transaction. It compares equal to the plain ``(most, least)`` tuple.
    """

    most: int
    least: int

    def __str__(self) -> str:
        return f"({self.most},{self.least})"

    @classmethod
    def parse(cls, text: str) -> TxnID:
        """Parse ``(most,least)`` or ``most,least``."""
        match = _TEXT.match(text.strip())
        if match is None:
            raise ValueError(f"transaction id {text!r} is not (most,least)")
        return cls(int(match[1]), int(match[2]))
