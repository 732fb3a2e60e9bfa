"""Bearer-token check for mutating admin calls.

Why a dedicated module: the rule ("no valid token: 401 and nothing changes") must be applied before
any handler runs, in one place, with a constant-time comparison. The token file is refused, like ssh
refuses a private key, when other users could read it or group members could change it.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from txnkeeper.secretfile import SecretFileError, read_secret_file

TOKEN_ENV = "TXNKEEPER_ADMIN_TOKEN"


def load_admin_token(token_file: str | None) -> str | None:
    """The token from ``--admin-token-file`` (preferred) or ``TXNKEEPER_ADMIN_TOKEN``; None if neither."""
    if token_file:
        path = Path(token_file)
        raw = read_secret_file(path, "admin token")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SecretFileError(f"admin token file {path} is not UTF-8 text (byte {exc.start})") from exc
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
