"""One ManagedLedgerFactory per data directory (the pod's PV): opens, caches and closes managed ledgers.

It owns the I/O thread pool that every ledger's blocking file calls (writes, fsyncs, reads, metadata)
run on, so the event loop never blocks on the disk.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

from txnkeeper.aio import SingleFlight

from .config import ManagedLedgerConfig
from .errors import LedgerClosedError
from .fileio import DEFAULT_IO, FileIO
from .managed_ledger import ManagedLedger
from .metadata import directory_ledger_name
from .names import encode_name


class ManagedLedgerFactory:
    def __init__(self, root: Path, *, io: FileIO | None = None, io_threads: int = 4) -> None:
        """``io`` replaces the file layer (fault-injection tests); ``io_threads`` sizes the I/O pool."""
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._io = io if io is not None else DEFAULT_IO
        self._executor = ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="ledger-io")
        self._ledgers: dict[str, ManagedLedger] = {}
        self._opening: SingleFlight[str, ManagedLedger] = SingleFlight()  # concurrent opens of one name
        self._closed = False

    async def open(self, name: str, config: ManagedLedgerConfig | None = None) -> ManagedLedger:
        """Open (recovering after a crash) or create a managed ledger; the same object while open.

        Raises LedgerLockedError if another process holds its directory.
        """
        if self._closed:
            raise LedgerClosedError(f"managed ledger factory on {self.root} is closed")
        encode_name(name)  # a bad name fails here, with the reason
        ledger = self._ledgers.get(name)
        if ledger is not None:
            return ledger
        return await self._opening.run(name, partial(self._open, name, config))

    async def _open(self, name: str, config: ManagedLedgerConfig | None) -> ManagedLedger:
        ledger = await ManagedLedger.open(
            name,
            self.root,
            config=config or ManagedLedgerConfig(),
            io=self._io,
            executor=self._executor,
            on_close=self._forget,
        )
        self._ledgers[name] = ledger
        return ledger

    def opened(self, name: str) -> ManagedLedger | None:
        """The managed ledger of that name if it is open now (None otherwise; nothing is opened)."""
        return self._ledgers.get(name)

    def open_ledgers(self) -> list[ManagedLedger]:
        return list(self._ledgers.values())

    def list_names(self) -> list[str]:
        """Managed ledgers present on disk (open or not), sorted."""
        return sorted(name for child in self.root.iterdir() if (name := directory_ledger_name(child)))

    async def close(self) -> None:
        """Close every open managed ledger (queued appends complete first), then the I/O pool."""
        if self._closed:
            return
        self._closed = True
        for ledger in list(self._ledgers.values()):
            await ledger.close()
        self._executor.shutdown(wait=True)

    def _forget(self, ledger: ManagedLedger) -> None:
        if self._ledgers.get(ledger.name) is ledger:
            del self._ledgers[ledger.name]
