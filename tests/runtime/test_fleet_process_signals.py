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


def test_a_running_member_has_its_whole_group_killed(tmp_path: Path) -> None:
    member = _member(tmp_path)
    # A leader with a child in its group: both must die.
    member.proc = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
    member.kill()
    assert member.proc.returncode == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):
        os.killpg(member.proc.pid, 0)  # nothing of the group is left


def test_a_reaped_member_is_not_signalled_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    member = _member(tmp_path)
    member.proc = subprocess.Popen(["true"], start_new_session=True)
    member.proc.wait()
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: sent.append((pgid, sig)))
    member.kill()
    assert sent == []
