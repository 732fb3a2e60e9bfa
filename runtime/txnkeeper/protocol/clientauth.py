"""Client credentials: tokens that name a client's principal, checked by store pods.

Why: single-key writer ids and producer names are exclusive (the newest session takes them over), so
without credentials any client that reaches a store can take over, or exhaust, every other client's.
A store given a client token key authenticates each connection that presents a token (``ClientAuth``)
and keeps writer ids and producer names apart per principal: one credential can neither take over
nor fill another's (Pulsar keeps producer names per tenant).

Tokens have the shape of Pulsar's token authentication: a JWT (RFC 7519, compact form) signed with
HMAC-SHA256 under a secret key shared by the stores and whoever issues tokens, whose ``sub`` claim is
the principal and whose optional ``exp`` (and ``nbf``) claims bound when it is valid. Nothing but
HS256 is accepted (never ``none``). Stateless: revoking one token means changing the key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any

from txnkeeper.errors import BadRequestError
from txnkeeper.protocol.auth import UnauthorizedError
from txnkeeper.secretfile import SecretFileError, read_secret_file

KEY_ENV = "TXNKEEPER_CLIENT_TOKEN_KEY_FILE"
KEY_FLAG = "--client-token-key-file"
MIN_KEY_BYTES = 32  # HS256 wants a key at least as long as its hash
MAX_TOKEN_CHARS = 8192
MAX_PRINCIPAL = 256
_HEADER = {"alg": "HS256", "typ": "JWT"}


class ClientTokenKeyError(ValueError):
    """The client token key file is missing, unreadable, too open or too short (the message says)."""


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64decode(part: str, what: str) -> bytes:
    try:  # strict: a character outside the base64url alphabet is an error, never skipped
        return base64.b64decode(part + "=" * (-len(part) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError) as exc:
        raise UnauthorizedError(f"the token's {what} is not base64url: {exc}") from exc


def validate_principal(principal: str) -> None:
    if (
        not principal
        or len(principal) > MAX_PRINCIPAL
        or any(ord(c) < 32 or ord(c) == 127 for c in principal)
    ):
        raise BadRequestError(
            f"principal {principal[:300]!r} must be 1..{MAX_PRINCIPAL} characters, none of them a control"
            " character"
        )


class ClientTokenKey:
    """The HS256 key client tokens are signed with."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if len(key) < MIN_KEY_BYTES:
            raise ClientTokenKeyError(
                f"a client token key needs at least {MIN_KEY_BYTES} bytes, has {len(key)}"
            )
        self._key = key

    def _sign(self, signing_input: bytes) -> bytes:
        return hmac.new(self._key, signing_input, hashlib.sha256).digest()

    def create_token(self, principal: str, *, expires_at: int | None = None) -> str:
        """A token for ``principal``, valid until ``expires_at`` (seconds since the epoch) if given."""
        validate_principal(principal)
        claims: dict[str, Any] = {"sub": principal}
        if expires_at is not None:
            claims["exp"] = expires_at
        header = _b64encode(json.dumps(_HEADER, separators=(",", ":")).encode())
        payload = _b64encode(json.dumps(claims, separators=(",", ":")).encode())
        signing_input = f"{header}.{payload}".encode("ascii")
        return f"{header}.{payload}.{_b64encode(self._sign(signing_input))}"

    def principal_of(self, token: str, now_s: float) -> str:
        """The principal ``token`` names; ``UnauthorizedError`` saying why when it is not a token
        signed with this key, names no valid principal, or is outside its validity."""
        if not token:
            raise UnauthorizedError("ClientAuth carries no token")
        if len(token) > MAX_TOKEN_CHARS:
            raise UnauthorizedError(f"the token has {len(token)} characters, more than {MAX_TOKEN_CHARS}")
        parts = token.split(".")
        if len(parts) != 3:
            raise UnauthorizedError("the token is not a JWT (three base64url parts separated by '.')")
        header_part, payload_part, signature_part = parts
        header = _claims(_b64decode(header_part, "header"), "header")
        if header.get("alg") != "HS256":
            raise UnauthorizedError(
                f"the token is signed with {header.get('alg')!r}; this store accepts HS256 tokens only"
            )
        signature = _b64decode(signature_part, "signature")
        expected = self._sign(f"{header_part}.{payload_part}".encode("ascii", "replace"))
        if not hmac.compare_digest(signature, expected):
            raise UnauthorizedError("the token's signature does not match this store's client token key")
        claims = _claims(_b64decode(payload_part, "payload"), "payload")
        principal = claims.get("sub")
        if not isinstance(principal, str):
            raise UnauthorizedError(
                "the token names no principal (its 'sub' claim is missing or not a string)"
            )
        try:
            validate_principal(principal)
        except BadRequestError as exc:
            raise UnauthorizedError(f"the token's 'sub' claim: {exc}") from exc
        expires = claims.get("exp")
        if expires is not None:
            if not _is_time(expires):
                raise UnauthorizedError("the token's 'exp' claim is not a number of seconds")
            if now_s >= expires:
                raise UnauthorizedError(f"the token of principal {principal!r} expired (exp {expires})")
        not_before = claims.get("nbf")
        if not_before is not None:
            if not _is_time(not_before):
                raise UnauthorizedError("the token's 'nbf' claim is not a number of seconds")
            if now_s < not_before:
                raise UnauthorizedError(
                    f"the token of principal {principal!r} is not valid yet (nbf {not_before})"
                )
        return principal


def _is_time(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and abs(value) < 2**53


def _claims(raw: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise UnauthorizedError(f"the token's {what} is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise UnauthorizedError(f"the token's {what} is not a JSON object")
    return value


def load_client_token_key(path: str | os.PathLike[str] | None) -> ClientTokenKey | None:
    """The key from ``path`` (the flag or ``TXNKEEPER_CLIENT_TOKEN_KEY_FILE``); None if neither given."""
    if path is None or str(path) == "":
        return None
    file = Path(path)
    try:
        raw = read_secret_file(file, "client token key")
    except SecretFileError as exc:
        raise ClientTokenKeyError(str(exc)) from exc
    if len(raw) < MIN_KEY_BYTES:
        raise ClientTokenKeyError(
            f"client token key file {file} holds {len(raw)} bytes; it needs at least {MIN_KEY_BYTES}"
            " (create one with: (umask 077; head -c 48 /dev/urandom | base64 > FILE))"
        )
    return ClientTokenKey(raw)
