"""Bearer-token check for mutating admin calls.

Why a dedicated module: the rule ("no valid token: 401 and nothing changes") must be applied before
any handler runs, in one place, with a constant-time comparison. The token file is refused, like ssh
refuses a private key, when other users could read it or group members could change it.
"""

from __future__ import annotations

import hmac
import os
import stat
from pathlib import Path

TOKEN_ENV = "TXNKEEPER_ADMIN_TOKEN"
# Refused permission bits: any access by others, and write by the group. Group read stays allowed:
# Kubernetes adds it to every file of a read-only Secret volume when the pod has an fsGroup (the
# operator mounts the token with defaultMode 0440 and fsGroup = the runtime's own group).
FORBIDDEN_TOKEN_MODE = stat.S_IRWXO | stat.S_IWGRP


def load_admin_token(token_file: str | None) -> str | None:
    """The token from ``--admin-token-file`` (preferred) or ``TXNKEEPER_ADMIN_TOKEN``; None if neither."""
    if token_file:
        path = Path(token_file)
        try:
            mode = path.stat().st_mode  # follows the symlinks of a Kubernetes Secret volume
            token = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ValueError(f"cannot read admin token file {path}: {exc}") from exc
        except UnicodeDecodeError as exc:
            raise ValueError(f"admin token file {path} is not UTF-8 text (byte {exc.start})") from exc
        if mode & FORBIDDEN_TOKEN_MODE:
            raise ValueError(
                f"admin token file {path} has mode {stat.S_IMODE(mode):04o}: other users could read it or"
                f" group members change it; run `chmod 600 {path}` (0640 and 0440 are accepted too)"
            )
        if not token:
            raise ValueError(f"admin token file {path} is empty")
        return token
    token = os.environ.get(TOKEN_ENV, "").strip()
    return token or None


def check_bearer(header: str | None, expected: str | None) -> str | None:
    """None when ``header`` carries the expected token, else why the call is refused."""
    if expected is None:
        return "this pod has no admin token configured (--admin-token-file or TXNKEEPER_ADMIN_TOKEN)"
    if not header:
        return "missing Authorization: Bearer <token>"
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return "Authorization header must be 'Bearer <token>'"
    if not hmac.compare_digest(token.strip().encode(), expected.encode()):
        return "invalid admin token"
    return None
