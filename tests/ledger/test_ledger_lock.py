"""A managed ledger directory has one owner: a second process (or factory) is refused, by name."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from txnkeeper.ledger import LedgerLockedError, ManagedLedgerFactory

OPEN_IN_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from txnkeeper.ledger import LedgerLockedError, ManagedLedgerFactory

    async def main() -> int:
        factory = ManagedLedgerFactory(Path(sys.argv[1]))
        try:
            await factory.open("persistent://t/ns/locked")
        except LedgerLockedError as exc:
            print(exc)
            return 3
        finally:
            await factory.close()
        return 0

    sys.exit(asyncio.run(main()))
    """
)


def open_in_child(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", OPEN_IN_CHILD, str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_second_process_gets_ledger_locked_error(tmp_path: Path) -> None:
    factory = ManagedLedgerFactory(tmp_path)
    ml = await factory.open("persistent://t/ns/locked")
    child = open_in_child(tmp_path)
    assert child.returncode == 3, child.stderr
    assert str(ml.directory) in child.stdout and "locked by another process" in child.stdout
    await factory.close()
    assert open_in_child(tmp_path).returncode == 0  # released on close


async def test_second_factory_in_the_same_process_is_refused(tmp_path: Path) -> None:
    first = ManagedLedgerFactory(tmp_path)
    second = ManagedLedgerFactory(tmp_path)
    await first.open("log")
    with pytest.raises(LedgerLockedError, match="log"):
        await second.open("log")
    await second.open("other")  # other managed ledgers under the same root are independent
    await first.close()
    await second.open("log")
    await second.close()
