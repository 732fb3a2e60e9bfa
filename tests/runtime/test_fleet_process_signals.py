"""A fleet member signals its process group only while the group's id is still its own.

Why: the group id is the leader's pid. Once the leader is reaped the number is free, and on a machine
whose pid_max is 32,768 a busy test run wraps it within minutes, so a late SIGKILL to that group could
land on an unrelated process group (a container's shim, an API server). A reaped member is never
signalled again; a running one has its whole group killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from txnkeeper.fleet.process import RuntimeProcess


def _member(tmp_path: Path) -> RuntimeProcess:
    return RuntimeProcess(
        name="store-0",
        role="store",
        data_dir=tmp_path / "data",
        work_dir=tmp_path,
        release="test",
        token_file=tmp_path / "token",
    )


def _dead(pid: int) -> bool:
    """Gone, or a zombie waiting for whoever inherited it to reap it (it runs nothing any more)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def test_a_running_member_has_its_whole_group_killed(tmp_path: Path) -> None:
    member = _member(tmp_path)
    # A leader with a child in its group: both must die.
    member.proc = subprocess.Popen(
        ["sh", "-c", "sleep 60 & echo $!; wait"], start_new_session=True, stdout=subprocess.PIPE
    )
    assert member.proc.stdout is not None
    child = int(member.proc.stdout.readline())
    member.kill()
    member.proc.stdout.close()
    assert member.proc.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 30
    while not _dead(child):  # SIGKILL is delivered at once; the orphan's exit is the kernel's to finish
        assert time.monotonic() < deadline, f"the leader's child {child} outlived the group kill"
        time.sleep(0.01)


def test_a_reaped_member_is_not_signalled_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    member = _member(tmp_path)
    member.proc = subprocess.Popen(["true"], start_new_session=True)
    member.proc.wait()
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: sent.append((pgid, sig)))
    member.kill()
    assert sent == []
