"""Errors of the managed ledger.

Every error says what went wrong and what the operator or caller can do about it; the layers above
turn them into admin-API responses and log lines, so the message is the whole story.
"""

from __future__ import annotations

from pathlib import Path

from txnkeeper.statefile import StateFileError


class LedgerError(Exception):
    """Base of every managed-ledger error."""


class CorruptEntryError(LedgerError):
    """A stored entry (or ledger file) fails its checks somewhere other than a torn tail.

    Never skipped: the data behind it could be acknowledged, so the ledger refuses to open or read.
    ``remedy`` says what the operator can do; the default fits any file (restore it).
    """

    def __init__(
        self,
        ledger_id: int,
        entry_id: int | None,
        path: Path,
        offset: int,
        reason: str,
        *,
        remedy: str | None = None,
    ) -> None:
        where = f"entry {entry_id}" if entry_id is not None else "file header"
        super().__init__(
            f"corrupt {where} in ledger {ledger_id} (file {path}, offset {offset}): {reason}; "
            f"the data is not skipped: {remedy or RESTORE_REMEDY}"
        )
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.path = path
        self.offset = offset


RESTORE_REMEDY = (
    "restore the volume from a backup or replica, or move the managed ledger directory aside if its "
    "data may be discarded"
)


def truncate_remedy(entry_id: int, path: Path, offset: int, watermark: Path) -> str:
    """What to do about a damaged record in the ledger that was open for writing."""
    return (
        f"restore the volume from a backup or replica; or, accepting the loss of entry {entry_id} and "
        f"every entry after it, cut the file there (truncate -s {offset} {path}) and delete {watermark} "
        "(the acknowledged-entry watermark, rebuilt on open) before reopening"
    )


class CorruptMetadataError(LedgerError, StateFileError):
    """The managed ledger's or a cursor's metadata file cannot be used (damaged, or out of range)."""

    def __init__(self, path: Path, reason: str, remedy: str | None = None) -> None:
        StateFileError.__init__(
            self,
            path,
            reason,
            remedy or "restore it from a backup or move the managed ledger directory aside",
        )


class MissingCursorError(CorruptMetadataError):
    """A cursor its owner created before has no file: never read as "nothing deleted yet"."""

    def __init__(self, path: Path, owner: str, acceptance: Path) -> None:
        super().__init__(
            path,
            f"it is missing, but {owner} exists; starting its cursor again would treat every entry it "
            "had acknowledged as unacknowledged (all of them delivered again)",
            f"restore the file from a backup of this volume; or, to accept that it starts again from the "
            f"earliest retained entry, run touch '{acceptance}' and start the pod again (the file is "
            "removed once used)",
        )
        self.acceptance = acceptance


class LedgerFencedError(LedgerError):
    """Someone else owns this managed ledger."""


class LedgerLockedError(LedgerFencedError):
    """Another process (or another factory in this process) holds the managed ledger's directory."""

    def __init__(self, directory: Path) -> None:
        super().__init__(
            f"managed ledger directory {directory} is locked by another process (lock file "
            f"{directory / 'LOCK'}); stop the other owner or give this process its own data directory"
        )
        self.directory = directory


class LedgerClosedError(LedgerError):
    """The managed ledger (or its factory) was closed; reopen it to continue."""


class LedgerWriteError(LedgerError):
    """An append (or the ledger creation it needed) did not become durable.

    Every append of the failed group gets this error; entries acknowledged before stay readable.
    """


class NoSuchEntryError(LedgerError):
    """The requested position was never written, or its ledger was trimmed."""
