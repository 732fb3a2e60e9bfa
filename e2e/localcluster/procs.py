"""Detached daemon processes with pid files, and condition waits with deadlines.

Why: `make cluster-up` returns while the control plane keeps running, and `make cluster-down` (or the
pytest fixture) must later stop exactly those processes and nothing else. A pid file records the pid
and the kernel's start time of the process, so a recycled pid is never signalled by mistake.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


class WaitTimeout(RuntimeError):
    pass


def wait_until(
    condition: Callable[[], bool],
    what: str,
    timeout: float,
    interval: float = 0.2,
    alive: Callable[[], str | None] | None = None,
) -> None:
    """Poll `condition` until true; `alive` returns an error text when waiting is pointless."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return
        if alive is not None and (err := alive()) is not None:
            raise RuntimeError(f"while waiting for {what}: {err}")
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def start_time(pid: int) -> int | None:
    """The process start time in clock ticks since boot (field 22 of /proc/PID/stat), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie has exited; only its parent's wait() is missing
        return None
    return int(fields[19])


def write_pidfile(path: Path, pid: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{pid} {start_time(pid)}\n")


def read_pidfile(path: Path) -> int | None:
    """The pid recorded in `path` if that very process still runs, else None."""
    try:
        pid_s, started = path.read_text().split()
    except (FileNotFoundError, ValueError):
        return None
    pid = int(pid_s)
    return pid if str(start_time(pid)) == started else None


def spawn(name: str, argv: list[str], log_dir: Path, pid_dir: Path, env: dict[str, str] | None = None) -> int:
    """Start `argv` in its own session (it outlives the caller), logging to log_dir/name.log."""
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    write_pidfile(pid_dir / f"{name}.pid", proc.pid)
    return proc.pid


def exit_error(name: str, pid: int, log_dir: Path) -> Callable[[], str | None]:
    """An `alive` check for wait_until: reports the log tail once the process has died."""

    def check() -> str | None:
        try:
            done, _status = os.waitpid(pid, os.WNOHANG)  # reap if it is our child
        except ChildProcessError:
            done = 0
        if start_time(pid) is not None and done == 0:
            return None
        try:
            tail = (log_dir / f"{name}.log").read_text(errors="replace").splitlines()[-25:]
        except FileNotFoundError:
            tail = []
        return f"{name} (pid {pid}) exited; last log lines:\n" + "\n".join(tail)

    return check


def stop(pidfile: Path, grace: float = 15.0, group: bool = True) -> bool:
    """SIGTERM the recorded process (and its process group), SIGKILL after `grace`. True if it ran."""
    pid = read_pidfile(pidfile)
    if pid is None:
        pidfile.unlink(missing_ok=True)
        return False
    _signal(pid, signal.SIGTERM, group)
    try:
        wait_until(lambda: start_time(pid) is None, f"pid {pid} to exit", grace, interval=0.05)
    except WaitTimeout:
        _signal(pid, signal.SIGKILL, group)
        wait_until(lambda: start_time(pid) is None, f"pid {pid} to die", 10, interval=0.05)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reap it when it is our child (the pytest fixture started it)
    pidfile.unlink(missing_ok=True)
    return True


def _signal(pid: int, sig: signal.Signals, group: bool) -> None:
    try:
        if group and os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass
