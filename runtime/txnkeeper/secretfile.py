"""Reading a secret from a file the way ssh reads a private key: refused when others could read it.

Why one module: the admin token and the cluster secret are both files a pod is given (a Kubernetes
Secret volume, or a file an operator wrote by hand), and both must be refused with the same rule and
the same advice when their permissions would let another user read or replace them. It sits below
every layer and imports nothing from txnkeeper.
"""

from __future__ import annotations

import stat
from pathlib import Path

# Refused permission bits: any access by others, and write by the group. Group read stays allowed:
# Kubernetes adds it to every file of a read-only Secret volume when the pod has an fsGroup (the
# operator mounts its secrets with defaultMode 0440 and fsGroup = the runtime's own group).
FORBIDDEN_SECRET_MODE = stat.S_IRWXO | stat.S_IWGRP


class SecretFileError(ValueError):
    """A secret file cannot be used; the message names the file, what is wrong and what to do."""


def read_secret_file(path: Path, what: str) -> bytes:
    """The file's bytes, stripped; refused if unreadable, empty or readable by others."""
    try:
        mode = path.stat().st_mode  # follows the symlinks of a Kubernetes Secret volume
        raw = path.read_bytes().strip()
    except OSError as exc:
        raise SecretFileError(f"cannot read {what} file {path}: {exc}") from exc
    if mode & FORBIDDEN_SECRET_MODE:
        raise SecretFileError(
            f"{what} file {path} has mode {stat.S_IMODE(mode):04o}: other users could read it or"
            f" group members change it; run `chmod 600 {path}` (0640 and 0440 are accepted too)"
        )
    if not raw:
        raise SecretFileError(f"{what} file {path} is empty")
    return raw
