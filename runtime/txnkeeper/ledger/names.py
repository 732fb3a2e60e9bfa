"""On-disk names for managed ledgers and cursors.

Names such as ``persistent://tenant/ns/topic`` contain '/' and ':'; each name maps to exactly one file
or directory name and back (percent-encoding every byte outside [A-Za-z0-9_-], so '.' and '..' are
safe too).
"""

from __future__ import annotations

import re

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_MAX_COMPONENT = 240  # leaves room for ".tmp" and similar suffixes under the usual 255-byte limit
_ENCODED = re.compile(r"^(?:[A-Za-z0-9_-]|%[0-9A-F]{2})+$")


def encode_name(name: str, what: str = "managed ledger") -> str:
    """Return the single path component that stores ``name``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} name must be a non-empty string (got {name!r})")
    out = "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in name.encode("utf-8"))
    if len(out) > _MAX_COMPONENT:
        raise ValueError(
            f"{what} name {name[:60]!r}... is too long: its on-disk form needs {len(out)} bytes, "
            f"at most {_MAX_COMPONENT} are allowed; use a shorter name"
        )
    return out


def decode_name(component: str) -> str | None:
    """Inverse of encode_name; None when ``component`` is not an encoded name."""
    if not _ENCODED.match(component):
        return None
    raw = bytearray()
    i = 0
    while i < len(component):
        if component[i] == "%":
            raw.append(int(component[i + 1 : i + 3], 16))
            i += 3
        else:
            raw.append(ord(component[i]))
            i += 1
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
