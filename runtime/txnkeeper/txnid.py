"""The transaction id: (most = coordinator id, least = sequence), Pulsar's TxnID.

Why here, in the shared low layer: the stores key their records by it, the coordinator mints it, topics,
the wire and the client carry it. One class, imported from this one module, so every layer's id compares
and hashes as the same value and no layer has to import another just to name a transaction.
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
