"""Opening a managed ledger directory after a clean close or a crash (runs on an executor thread).

Steps: take the directory lock; read the metadata and the acknowledged-entry watermark; drop leftovers
of interrupted operations (temp files, files of trimmed ledgers); scan every ledger (closed ones
strictly against their recorded count, the ledger that was open for writing against the watermark,
with its torn tail cut; a closed ledger's record bodies are checksummed when read, not here); then,
like Pulsar, close the recovered ledger and start a new one, unless the recovered ledger is empty, in
which case it is simply reused (nothing in it was ever acknowledged).
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from .cursor import CursorState
from .entry_format import FILE_HEADER
from .errors import CorruptEntryError, CorruptMetadataError
from .fileio import FileIO
from .ledger_file import LedgerFile
from .lock import acquire_directory_lock, release_directory_lock
from .metadata import METADATA_FILE, LedgerInfo, ManagedLedgerMetadata
from .names import decode_name, encode_name, is_bounded_form
from .watermark import WATERMARK_FILE, WatermarkFile, WatermarkState, current_boot_id, load_watermark

log = logging.getLogger(__name__)

LEDGERS_DIR = "ledgers"
CURSORS_DIR = "cursors"
_LEDGER_FILE = re.compile(r"^(\d{20})\.ledger$")


@dataclass
class Recovered:
    meta: ManagedLedgerMetadata
    files: dict[int, LedgerFile]
    current: LedgerFile
    cursors: dict[str, tuple[Path, CursorState]]
    lock_fd: int
    watermark: WatermarkFile
    torn_tails: list[str] = field(default_factory=list)


def _ensure_dir(io: FileIO, path: Path) -> None:
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        io.sync_dir(path.parent)


def recover(name: str, directory: Path, io: FileIO) -> Recovered:
    _ensure_dir(io, directory)
    lock_fd = acquire_directory_lock(directory)
    try:
        return _recover_locked(name, directory, io, lock_fd)
    except BaseException:
        release_directory_lock(lock_fd)
        raise


def _recover_locked(name: str, directory: Path, io: FileIO, lock_fd: int) -> Recovered:
    ledgers_dir = directory / LEDGERS_DIR
    cursors_dir = directory / CURSORS_DIR
    _ensure_dir(io, ledgers_dir)
    _ensure_dir(io, cursors_dir)
    meta_path = directory / METADATA_FILE
    if meta_path.exists():
        meta = ManagedLedgerMetadata.decode(meta_path.read_bytes(), meta_path)
        if meta.name != name:
            raise CorruptMetadataError(meta_path, f"it belongs to managed ledger {meta.name!r}, not {name!r}")
    else:
        meta = ManagedLedgerMetadata(name)
    for leftover in [*directory.glob("*.tmp"), *cursors_dir.glob("*.tmp")]:
        leftover.unlink()
    _remove_trimmed_files(io, ledgers_dir, meta, meta_path)

    watermark = load_watermark(io, directory)
    files, torn = check_ledgers(io, directory, meta, meta_path, watermark, cut=True)
    for note in torn:
        log.warning("managed ledger %s: %s", name, note)

    last = meta.ledgers[-1] if meta.ledgers else None
    if last is not None and not last.closed and files[last.ledger_id].entries == 0:
        current = files[last.ledger_id]
        if current.on_disk:
            current.open_for_writes()
        else:
            current.create()
    else:
        if last is not None and not last.closed:
            recovered = files[last.ledger_id]
            last.closed = True
            last.entries = recovered.entries
            last.size = recovered.data_bytes
            last.file_bytes = recovered.file_bytes
        new_id = meta.next_ledger_id
        meta.next_ledger_id = new_id + 1
        meta.ledgers.append(LedgerInfo(new_id, file_bytes=FILE_HEADER.size, created_at=time.time()))
        io.write_file_atomically(meta_path, meta.encode())  # the id is durable before its file exists
        current = LedgerFile(io, ledgers_dir, new_id)
        current.create()
        files[new_id] = current

    for ledger in files.values():
        if ledger is not current:
            ledger.seal_index()  # closed: only the sparse index stays in memory
    cursors = read_cursors(cursors_dir, files)
    # The file is created empty-handed (nothing vouched for) when missing: a directory from before the
    # watermark existed, or one whose watermark the operator deleted to accept a shortened log.
    if watermark is None:
        watermark_file = WatermarkFile.create(io, directory, None)
    else:
        watermark_file = WatermarkFile(io, directory, watermark)
    return Recovered(meta, files, current, cursors, lock_fd, watermark_file, torn)


def read_cursors(cursors_dir: Path, files: dict[int, LedgerFile]) -> dict[str, tuple[Path, CursorState]]:
    """Every persisted cursor's state, checked against the ledgers ``files`` (files are only read)."""
    ledger_entries = {ledger_id: ledger.entries for ledger_id, ledger in files.items()}
    cursors: dict[str, tuple[Path, CursorState]] = {}
    if not cursors_dir.is_dir():
        return cursors
    for path in sorted(cursors_dir.glob("*.json")):
        cursor_name = decode_name(path.stem)
        if cursor_name is None:
            if not is_bounded_form(path.stem):
                continue
            # A long name's file is named by a hash: the name is the one inside, if it leads here.
            cursor_name = CursorState.stored_name(path)
            if encode_name(cursor_name, "cursor") != path.stem:
                raise CorruptMetadataError(
                    path,
                    f"it holds cursor {cursor_name!r}, whose file is "
                    f"{encode_name(cursor_name, 'cursor')}.json, not this one",
                )
        # checked against the recovered ledgers: a position past them is refused, not adopted
        cursors[cursor_name] = (path, CursorState.load(path, cursor_name, ledger_entries))
    return cursors


def check_ledgers(
    io: FileIO,
    directory: Path,
    meta: ManagedLedgerMetadata,
    meta_path: Path,
    watermark: WatermarkState | None,
    *,
    cut: bool,
) -> tuple[dict[int, LedgerFile], list[str]]:
    """Check every ledger the metadata lists; index them; return them and the torn tails found.

    ``cut``: cut torn tails (recovery); otherwise only report them (the read-only view of inspect).
    """
    ledgers_dir = directory / LEDGERS_DIR
    watermark_path = directory / WATERMARK_FILE
    boot_id = current_boot_id()
    acknowledged = watermark.vouched(boot_id) if watermark is not None else None
    ids = [info.ledger_id for info in meta.ledgers]
    if (
        acknowledged is not None
        and acknowledged.ledger_id not in ids
        and (not ids or acknowledged.ledger_id > ids[0])
    ):
        raise CorruptMetadataError(
            meta_path,
            f"the watermark {watermark_path} records entry {acknowledged} as acknowledged, but the metadata "
            f"lists ledgers {ids} only (was it replaced by an older copy, or a ledger's entry lost?)",
        )
    files: dict[int, LedgerFile] = {}
    torn: list[str] = []
    for index, info in enumerate(meta.ledgers):
        if info.offloaded:
            continue  # its entries are in the tier (offload segments); no local file to check
        ledger = LedgerFile(io, ledgers_dir, info.ledger_id)
        was_open = index == len(meta.ledgers) - 1 and not info.closed
        floor = watermark.entry_in(info.ledger_id, boot_id) if watermark is not None else None
        if not ledger.path.exists():
            # The ledger that was open may never have had its file created (rollover records the id
            # first); any other missing file, or one holding acknowledged entries, is lost data.
            if not was_open and info.entries > 0:
                raise CorruptEntryError(
                    info.ledger_id,
                    None,
                    ledger.path,
                    0,
                    f"file missing; metadata records {info.entries} entries",
                )
            if floor is not None and floor >= 0:
                raise CorruptEntryError(
                    info.ledger_id,
                    None,
                    ledger.path,
                    0,
                    f"file missing; the watermark {watermark_path} records entry {floor} as acknowledged",
                )
        else:
            expected = None if was_open else info.entries
            if cut:
                reason = ledger.recover(
                    writable_tail=was_open,
                    expected_entries=expected,
                    acknowledged=floor,
                    watermark_path=watermark_path,
                    verify_data=was_open,
                )
            else:
                result = ledger.check(
                    writable_tail=was_open,
                    expected_entries=expected,
                    acknowledged=floor,
                    watermark_path=watermark_path,
                    verify_data=was_open,
                )
                ledger.adopt(result)
                reason = result.torn_reason
            if reason is not None:
                verb = "cut torn tail" if cut else "torn tail (cut when the ledger is next opened)"
                torn.append(f"ledger {info.ledger_id}: {verb} ({reason})")
        files[info.ledger_id] = ledger
    return files, torn


def _remove_trimmed_files(
    io: FileIO, ledgers_dir: Path, meta: ManagedLedgerMetadata, meta_path: Path
) -> None:
    """Delete files of ledgers the metadata no longer lists (a trim interrupted before unlinking) and
    of ledgers it records as offloaded (a local delete after offload interrupted before unlinking)."""
    known = {i.ledger_id for i in meta.ledgers if not i.offloaded}
    removed = False
    for path in ledgers_dir.iterdir():
        match = _LEDGER_FILE.match(path.name)
        if match is None:
            continue
        ledger_id = int(match.group(1))
        if ledger_id in known:
            continue
        if ledger_id >= meta.next_ledger_id:
            raise CorruptMetadataError(
                meta_path,
                f"ledger file {path} has id {ledger_id}, but ids below {meta.next_ledger_id} are all that "
                "were ever allocated (was the metadata replaced by an older copy?)",
            )
        io.unlink(path)
        removed = True
    if removed:
        io.sync_dir(ledgers_dir)
