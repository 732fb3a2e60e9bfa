"""Pre-copy of a shard's immutable files before its fence (docs/contracts.md §12, "Pre-copy"): which
files cannot change any more (closed ledgers' entry files), their checksums remembered by what the
file is on disk, and the target's staged copies with the index that says what each one holds.

Why its own module: a move's pause (fence -> switch) is what clients feel, and it grew with the
shard's bytes while the whole copy happened inside it. A closed ledger's file is written once and
never again (a rollover seals it before the metadata marks it closed), so it can be listed, summed
and copied while the source keeps serving; at the fence only the rest (the open ledger, cursors,
metadata, snapshots, the shard's rows) is new. Everything here is blocking file work: callers run it
in a thread.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from txnkeeper.ledger.ledger_file import ledger_file_name
from txnkeeper.ledger.recovery import LEDGERS_DIR
from txnkeeper.server import shard_files as sf

WRITEBACK_BYTES = 4 << 20  # a pre-copy writes its pulled bytes back to disk every 4 MiB
PRECOPY_DIR = "precopy"  # under moves-in/<move>/: files/<path> and index.json
PASS_DIR = "precopy-pass"  # one pass's pulls, checked, before they join the staged copies
INDEX_FILE = "index.json"


def closed_ledger_files(data_dir: Path, units: Iterable[str]) -> list[str]:
    """The entry files of every closed, still local ledger of the managed ledgers among ``units``
    (paths relative to ``data_dir``). A ledger counts only while its file has exactly the size its
    metadata recorded at close; a directory whose metadata cannot be read lists nothing (the fence's
    manifest then carries it whole)."""
    found: list[str] = []
    for unit, meta in sf.ledger_metadata(data_dir, units):
        for info in meta.ledgers:
            if not info.closed or info.offloaded:
                continue
            rel = f"{unit}/{LEDGERS_DIR}/{ledger_file_name(info.ledger_id)}"
            try:
                size = (data_dir / rel).stat().st_size
            except OSError:
                continue  # trimmed or deleted after offload meanwhile
            if size == info.file_bytes:
                found.append(rel)
    return found


@dataclass(frozen=True, slots=True)
class _Seen:
    size: int
    mtime_ns: int
    inode: int
    crc32c: int


class ChecksumCache:
    """CRC32C of closed files, reused while the file is the same on disk (size, mtime, inode: what
    rsync trusts). Only files listed as closed are remembered, so a file that is written to is always
    read again; a closed file that was changed all the same (damage, a bug) gets a new mtime and is
    read again too, and the target then sees its checksum differ from its pre-copied one."""

    def __init__(self) -> None:
        self._seen: dict[str, _Seen] = {}

    def files(self, data_dir: Path, paths: Iterable[str], *, remember: bool) -> list[sf.ManifestFile]:
        out = []
        for rel in paths:
            path = data_dir / rel
            st = path.stat()
            seen = self._seen.get(rel)
            if seen is not None and (seen.size, seen.mtime_ns, seen.inode) == (
                st.st_size,
                st.st_mtime_ns,
                st.st_ino,
            ):
                out.append(sf.ManifestFile(rel, seen.size, seen.crc32c))
                continue
            size, crc = sf.checksum_file(path)
            if remember:
                self._seen[rel] = _Seen(size, st.st_mtime_ns, st.st_ino, crc)
            out.append(sf.ManifestFile(rel, size, crc))
        return out

    def forget(self, paths: Iterable[str]) -> None:
        for rel in paths:
            self._seen.pop(rel, None)


class StagedCopies:
    """The target's pre-copied files of one move (``moves-in/<move>/precopy``) and their index:
    path -> [size, crc32c] as checked on arrival. A file is in the index only after it was fsync'd
    in place, so after a crash the index never names a file that is not whole."""

    def __init__(self, incoming: Path) -> None:
        self.root = incoming / PRECOPY_DIR
        self.files_dir = self.root / "files"
        self.pass_dir = incoming / PASS_DIR

    def index(self) -> dict[str, tuple[int, int]]:
        try:
            raw = json.loads((self.root / INDEX_FILE).read_text())
        except (OSError, ValueError):
            return {}
        out: dict[str, tuple[int, int]] = {}
        if isinstance(raw, dict):
            for rel, value in raw.items():
                if (
                    isinstance(rel, str)
                    and sf.safe_relative(rel)
                    and isinstance(value, list)
                    and len(value) == 2
                    and all(isinstance(v, int) for v in value)
                ):
                    out[rel] = (value[0], value[1])
        return out

    def wanted(self, files: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The entries of a listing not staged already with the same size and checksum."""
        index = self.index()
        return [e for e in files if index.get(e["path"]) != (e["size"], e["crc32c"])]

    def adopt_pass(self, entries: list[dict[str, Any]]) -> None:
        """Move one checked, fsync'd pass into the staged copies, then record them in the index."""
        index = self.index()
        for entry in entries:
            rel = entry["path"]
            destination = self.files_dir / rel
            destination.parent.mkdir(parents=True, exist_ok=True)
            (self.pass_dir / rel).replace(destination)
            index[rel] = (entry["size"], entry["crc32c"])
        for directory in {(self.files_dir / e["path"]).parent for e in entries}:
            sf.fsync_dir(directory)
        self._write_index(index)
        sf.remove(self.pass_dir)

    def _write_index(self, index: dict[str, tuple[int, int]]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / (INDEX_FILE + ".tmp")
        with tmp.open("w") as handle:
            json.dump({k: list(v) for k, v in sorted(index.items())}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(self.root / INDEX_FILE)
        sf.fsync_dir(self.root)

    def link_into(self, files: list[dict[str, Any]], staged: Path) -> tuple[list[Any], list[Any], list[str]]:
        """For the fence's manifest: hard-link every file staged with the manifest's size and checksum
        into ``staged`` (the receive's copy); answers (reused entries, entries still to pull, paths
        that were pre-copied with another checksum: the source's file changed since, pulled again)."""
        index = self.index()
        reused: list[Any] = []
        todo: list[Any] = []
        changed: list[str] = []
        for entry in files:
            rel = entry["path"]
            held = index.get(rel)
            source = self.files_dir / rel
            if held == (entry["size"], entry["crc32c"]) and source.is_file():
                target = staged / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.unlink(missing_ok=True)
                os.link(source, target)
                reused.append(entry)
                continue
            if held is not None:
                changed.append(rel)
            todo.append(entry)
        return reused, todo, changed


class Pace:
    """A pre-copy's pace: with a bound on its bytes per second, after each chunk it sleeps until the
    bytes so far fit (None: no bound; the pull still writes back every WRITEBACK_BYTES)."""

    def __init__(self, bytes_per_second: int | None) -> None:
        self._rate = float(bytes_per_second) if bytes_per_second else None
        self._began = time.monotonic()
        self._bytes = 0

    async def took(self, size: int) -> None:
        self._bytes += size
        if self._rate is None:
            return
        ahead = self._bytes / self._rate - (time.monotonic() - self._began)
        if ahead > 0:
            await asyncio.sleep(ahead)


def write_back(handle: IO[bytes]) -> None:
    handle.flush()
    os.fdatasync(handle.fileno())
