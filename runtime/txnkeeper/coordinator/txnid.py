"""The transaction id: (most = coordinator id, least = that coordinator's sequence), as in Pulsar."""

from __future__ import annotations

import re
from dataclasses import dataclass

_TEXT = re.compile(r"^\(?\s*(\d+)\s*,\s*(\d+)\s*\)?$")


@dataclass(frozen=True, order=True, slots=True)
class TxnID:
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
