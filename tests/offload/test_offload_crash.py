"""SIGKILL at injected offload points; the verdict uses only what the child acknowledged before dying.

The child (this file run as a script) produces entries, prints each acknowledged position, then runs a
manual offload (in ``streaming`` mode the offloader streams in the background while the child produces,
so the kill lands between appends) with a blob store or FileIO subclass that kills the process at the
point named on its command line: in the middle of a data part, after the index PUT but before the
metadata records the segment Offloaded, or while deleting a local ledger file. The parent reopens and
checks that every acknowledged entry reads back once, in order, and that no ledger lost its file
without Offloaded segments holding it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from txnkeeper.ledger import ManagedLedgerConfig, ManagedLedgerFactory, Position
from txnkeeper.ledger.fileio import FileIO
from txnkeeper.ledger.offload import BlobStore, BlobUpload, FileSystemBlobStore, OffloadConfig
from txnkeeper.ledger.offload.offloader import OffloadPolicy

NAME = "persistent://public/default/crashing"
POINTS = ("mid-part", "after-index", "local-delete")


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class _KillingUpload(BlobUpload):
    def __init__(self, inner: BlobUpload, countdown: list[int]) -> None:
        self.inner = inner
        self.countdown = countdown

    async def write(self, data: bytes | bytearray) -> None:
        self.countdown[0] -= 1
        if self.countdown[0] <= 0:
            await self.inner.write(data[: len(data) // 2])
            _die()
        await self.inner.write(data)

    async def complete(self) -> int:
        return await self.inner.complete()

    async def abort(self) -> None:
        await self.inner.abort()


class _KillingStore(FileSystemBlobStore):
    def __init__(self, root: str, point: str, countdown: int) -> None:
        super().__init__(root)
        self.point = point
        self.countdown = [countdown]

    def open_upload(self, key: str) -> BlobUpload:
        upload = super().open_upload(key)
        return _KillingUpload(upload, self.countdown) if self.point == "mid-part" else upload

    async def put(self, key: str, data: bytes) -> None:
        await super().put(key, data)
        if self.point == "after-index" and key.endswith("-index"):
            self.countdown[0] -= 1
            if self.countdown[0] <= 0:
                _die()


class _KillingIO(FileIO):
    def __init__(self, countdown: int) -> None:
        self.countdown = countdown

    def unlink(self, path: Path) -> None:
        if path.suffix == ".ledger":
            self.countdown -= 1
            if self.countdown <= 0:
                _die()
        super().unlink(path)


def make_config(
    tier: Path, store: BlobStore | None = None, *, streaming: bool = False
) -> ManagedLedgerConfig:
    config = OffloadConfig(
        fileSystemURI=str(tier),
        managedLedgerOffloadMaxBlockSizeInBytes=256,
        managedLedgerOffloadMinBlockSizeInBytes=200,
    )
    policy = OffloadPolicy(
        config,
        managedLedgerOffloadDeletionLagMs=0,
        maxOffloadSegmentSizeInBytes=300,
        # streaming: automatic offload on, so the open ledger streams while the child produces
        managedLedgerOffloadThresholdInBytes=0 if streaming else -1,
        offloadRetryIntervalSeconds=0.1,
        store_factory=(lambda _c: store) if store is not None else None,
    )
    return ManagedLedgerConfig(max_entries_per_ledger=20, max_ledger_age_seconds=None, offload=policy)


async def child(root: Path, tier: Path, point: str, countdown: int, mode: str) -> None:
    store = _KillingStore(str(tier), point, countdown)
    io = _KillingIO(countdown) if point == "local-delete" else None
    factory = ManagedLedgerFactory(root, io=io)
    ml = await factory.open(NAME, make_config(tier, store, streaming=mode == "streaming"))
    for i in range(70):
        position = await ml.add_entry(f"entry-{i:03d}".encode())
        print(position, flush=True)
        if mode == "streaming" and i % 5 == 4:
            await asyncio.sleep(0.02)  # gives the background stream turns between appends (not a wait)
    assert ml.offloader is not None
    await ml.offloader.offload()
    print("finished", flush=True)
    await factory.close()


@pytest.mark.parametrize(
    ("mode", "countdown"), [("manual", n) for n in range(1, 8)] + [("streaming", n) for n in range(1, 5)]
)
@pytest.mark.parametrize("point", POINTS)
async def test_sigkill_during_offload_loses_nothing_acknowledged(
    tmp_path: Path, point: str, countdown: int, mode: str
) -> None:
    root, tier = tmp_path / "data", tmp_path / "tier"
    tier.mkdir()
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, __file__, str(root), str(tier), point, str(countdown), mode],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    lines = proc.stdout.split()
    acked = [Position.parse(x) for x in lines if x != "finished"]
    assert proc.returncode in (-signal.SIGKILL, 0), proc.stderr
    assert (proc.returncode == 0) == ("finished" in lines), proc.stderr
    if countdown == 1:
        assert proc.returncode == -signal.SIGKILL, f"the {point} kill point was never reached"
    factory = ManagedLedgerFactory(root)
    try:
        ml = await factory.open(NAME, make_config(tier))
        assert ml.offloader is not None
        meta = ml.offload_metadata()
        for info in meta.ledgers:  # no local file gone without Offloaded segments holding the ledger
            if info.offloaded:
                assert ml.offloader.fully_offloaded(info, meta), info
        entries = await ml.read_entries(Position(1, 0), 10_000)
        got = [(e.position, e.data) for e in entries]
        assert len({p for p, _ in got}) == len(got)  # no entry twice
        assert got[: len(acked)] == [(p, f"entry-{i:03d}".encode()) for i, p in enumerate(acked)]
        await ml.offloader.offload()  # the orphan was failed and is retried; everything ends Offloaded
        assert all(s.status == "Offloaded" for s in ml.offloader.segments())
        assert [(e.position, e.data) for e in await ml.read_entries(Position(1, 0), 10_000)] == got
    finally:
        await factory.close()


if __name__ == "__main__":
    asyncio.run(child(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]))
