"""On-disk names for managed ledgers and cursors.

Names such as ``persistent://tenant/ns/topic`` contain '/' and ':'; each name maps to exactly one file
or directory name (percent-encoding every byte outside [A-Za-z0-9_-], so '.' and '..' are safe too).

Why a bounded form: the wire and the admin API accept names of 1..512 characters, whose encoded form
can need up to 6 KiB (a 4-byte character takes 12), while a file name has 255 bytes. A name whose
encoding fits ``MAX_COMPONENT`` bytes is stored as that encoding, unchanged (so every existing file
keeps its name); a longer one is stored as the first ``_PREFIX`` bytes of its encoding, a '~' (which no
encoding contains) and the SHA-256 of the whole name in hex. That form does not decode: whoever lists
a directory reads the name from inside the file (a ledger's metadata, a cursor's body) and checks that
it encodes to the component it was found under.
"""

from __future__ import annotations

import hashlib
import re

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
# Leaves room for ".snapshot.tmp", ".accept-reset" and similar suffixes under the usual 255-byte limit.
MAX_COMPONENT = 240
_HASH_HEX = 64
_PREFIX = MAX_COMPONENT - 1 - _HASH_HEX  # readable prefix of a bounded form, so `ls` still says what it is
_ENCODED = re.compile(r"^(?:[A-Za-z0-9_-]|%[0-9A-F]{2})+$")
_BOUNDED = re.compile(r"^(?:[A-Za-z0-9_-]|%[0-9A-F]{2})*~[0-9a-f]{64}$")


def encode_name(name: str, what: str = "managed ledger") -> str:
    """Return the single path component, of at most MAX_COMPONENT bytes, that stores ``name``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} name must be a non-empty string (got {name!r})")
    raw = name.encode("utf-8")
    out = "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in raw)
    if len(out) <= MAX_COMPONENT:
        return out
    cut = _PREFIX
    if "%" in out[cut - 2 : cut]:  # never end the prefix inside a %XX triple
        cut = out.rindex("%", cut - 2, cut)
    return f"{out[:cut]}~{hashlib.sha256(raw).hexdigest()}"


def decode_name(component: str) -> str | None:
    """Inverse of encode_name for a plain encoding; None for anything else, including the bounded
    form (``is_bounded_form``: its name is read from the file's content)."""
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


def is_bounded_form(component: str) -> bool:
    """Whether ``component`` is the bounded (hashed) form of a name too long to store plainly."""
    return len(component) <= MAX_COMPONENT and _BOUNDED.match(component) is not None
