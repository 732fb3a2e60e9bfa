"""TxnID sequence allocation that never reuses an id after a restart.

Why not only ``max_local_txn_id`` in the log: the coordinator deletes a transaction's records when it
ends, so after a quiet period the log may hold no record at all. A hi/lo reservation file does not
depend on the log: the allocator durably reserves a block of ids (a checksummed state file, kind
``txn-sequence``, replaced atomically) before handing any of them out, and a restart resumes above the
reserved ceiling. Ids skipped by a crash are simply never used.

Because every id is reserved before it is used, a reservation below an id the log still holds means
the file is not the one this log was written with (an older copy, another coordinator's file): it is
refused rather than trusted, since resuming from it could hand out an id twice. The previous release
wrote the bare number; that is still read, and the next reservation rewrites it checksummed.
"""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path
from typing import Any

from txnkeeper import statefile
from txnkeeper.statefile import StateFileError, StateShapeError

log = logging.getLogger(__name__)

RESERVATION_BLOCK = 10_000
SEQUENCE_KIND = "txn-sequence"
SEQUENCE_VERSION = 1
_LEGACY = re.compile(rb"0|[1-9][0-9]*")  # the previous release wrote str(ceiling), nothing else
_REMEDY = (
    "the coordinator does not start, so that no transaction id is handed out twice; restore the file "
    "from a backup taken together with the transaction log"
)


class SequenceAllocator:
    """Allocates increasing sequence numbers for one coordinator."""

    def __init__(self, path: Path, block: int = RESERVATION_BLOCK) -> None:
        if block <= 0:
            raise ValueError(f"reservation block must be positive, got {block}")
        self._path = path
        self._block = block
        self._last = 0
        self._ceiling = 0
        self._reserving: asyncio.Future[None] | None = None

    def load(self, floor: int = 0) -> None:
        """Read the persisted ceiling; ``floor`` is the highest id the log still shows (if any).

        Raises StateFileError (naming the file) for a damaged file or a ceiling below ``floor``.
        """
        doc = statefile.read(
            self._path, SEQUENCE_KIND, frozenset({SEQUENCE_VERSION}), legacy=_legacy_body, remedy=_REMEDY
        )
        ceiling = 0
        if doc is None and floor > 0:
            log.warning(
                "sequence file %s is missing while the transaction log holds id %d: resuming above it; "
                "ids of transactions whose records were already deleted could be handed out again",
                self._path,
                floor,
            )
        if doc is not None:
            try:
                ceiling = _ceiling(doc.body)
            except StateShapeError as exc:
                raise StateFileError(self._path, f"not a valid sequence file: {exc}", _REMEDY) from exc
            if ceiling < floor:
                raise StateFileError(
                    self._path,
                    f"it reserves transaction ids only up to {ceiling}, but the transaction log holds id "
                    f"{floor}, and every id is reserved before it is used (the file is older than the log)",
                    _REMEDY,
                )
        self._last = max(ceiling, floor)
        self._ceiling = self._last

    @property
    def last(self) -> int:
        return self._last

    def next_nowait(self) -> int | None:
        """The next id if the reserved block has one left (no wait), else None: use ``next()``."""
        if self._last >= self._ceiling or self._reserving is not None:
            return None
        self._last += 1
        return self._last

    async def next(self) -> int:
        while self._last >= self._ceiling:
            if self._reserving is None:
                self._reserving = asyncio.get_running_loop().create_future()
                target = self._last + self._block
                try:
                    await asyncio.to_thread(
                        statefile.write,
                        self._path,
                        SEQUENCE_KIND,
                        SEQUENCE_VERSION,
                        {"reservedThrough": target},
                    )
                    self._ceiling = target
                    self._reserving.set_result(None)
                except BaseException as exc:
                    self._reserving.set_exception(exc)
                    raise
                finally:
                    self._reserving = None
            else:
                await asyncio.shield(self._reserving)
        self._last += 1
        return self._last


def _legacy_body(raw: bytes) -> dict[str, Any]:
    if _LEGACY.fullmatch(raw) is None:
        raise StateShapeError(f"the previous release wrote a bare decimal number, not {raw[:40]!r}")
    return {"reservedThrough": int(raw)}


def _ceiling(body: Any) -> int:
    doc = statefile.obj(body, "sequence", {"reservedThrough"})
    return statefile.integer(doc["reservedThrough"], "reservedThrough", 0)
