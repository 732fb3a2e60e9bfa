"""Small durable state files (ledger metadata, cursors, sequences, routes, registries): one format.

Why one module: every piece of state that is not a ledger entry lives in a small file that is replaced
whole. Each kind used to have its own writer and reader, and they differed in what they survived: no
checksum anywhere (a flipped bit became a different, silently accepted value), and some refusals did not
even name the file. This module is the only place that writes such a file (temp file, fsync, rename,
fsync directory) and the only place that reads one back, so every kind gets the same guarantees:

- the file is ``HEADER LINE`` + ``BODY``; the header is
  ``txnkeeper-state <kind> <version> <body length> <crc32 hex>`` and the body is JSON (UTF-8, one line,
  ending in a newline). The CRC-32 covers the kind, the version and every body byte, so any damage to
  the file is either a refusal or (in the header's fixed words) a refusal too; never a different value;
- a refusal is a ``StateFileError`` that names the file, says what is wrong and what to do;
- a file written by the previous release (no header) is read only if it has exactly the old shape; the
  next update rewrites it in this format.

It sits below every layer (it imports nothing from txnkeeper), so the ledger, the coordinator, the topic
service and the server all use it without importing upwards.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAGIC = "txnkeeper-state"
_MAX_HEADER = 256
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


class StateFileError(Exception):
    """A state file cannot be used; the message names the file, the problem and what to do."""

    def __init__(self, path: Path, problem: str, remedy: str | None = None) -> None:
        self.path = path
        self.problem = problem
        self.remedy = remedy or "restore the file from a backup (its content is never guessed at)"
        super().__init__(f"state file {path} is unusable: {problem}; {self.remedy}")


class StateShapeError(ValueError):
    """A decoded body (or a previous release's file) does not have the expected shape."""


class FileOps:
    """The file calls an atomic replace needs, as overridable methods.

    The managed ledger's FileIO extends this class, so a fault injected into one primitive (say
    ``pwrite`` failing with ENOSPC) reaches state-file writes too.
    """

    def open(self, path: Path, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags, mode)

    def close(self, fd: int) -> None:
        os.close(fd)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def sync(self, fd: int) -> None:
        os.fsync(fd)

    def replace(self, src: Path, dst: Path) -> None:
        os.replace(src, dst)

    def sync_dir(self, path: Path) -> None:
        """fsync a directory so created, renamed and removed names in it are durable."""
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def pwritev(self, fd: int, buffers: Sequence[memoryview], offset: int) -> int:
        """One vectored write (at most ``IOV_MAX`` buffers): the bytes written."""
        return os.pwritev(fd, buffers, offset)

    def pwrite_all(self, fd: int, data: bytes | Sequence[bytes | memoryview], offset: int) -> None:
        """Write all of ``data`` (bytes, or buffers one after another) at ``offset``; a short write
        continues, an error propagates. Buffers go to the kernel as they are (``pwritev``): joining a
        ledger group's headers and entries first copied every byte of it once more."""
        if isinstance(data, bytes):
            view = memoryview(data)
            while view:
                written = self.pwrite(fd, view, offset)
                if written <= 0:
                    raise OSError(f"pwrite wrote {written} bytes at offset {offset}")
                view = view[written:]
                offset += written
            return
        views = [memoryview(buffer) for buffer in data if len(buffer)]
        first = 0
        while first < len(views):
            written = self.pwritev(fd, views[first : first + _IOV_MAX], offset)
            if written <= 0:
                raise OSError(f"pwritev wrote {written} bytes at offset {offset}")
            offset += written
            while written:
                size = len(views[first])
                if written < size:
                    views[first] = views[first][written:]
                    break
                written -= size
                first += 1

    def write_file_atomically(self, path: Path, data: bytes | Sequence[bytes]) -> None:
        """Replace ``path`` with ``data`` (bytes, or pieces written one after another) so a crash
        leaves either the old or the new content.

        Write a temp file, fsync it, rename it over the target, fsync the directory.
        """
        tmp = path.with_name(path.name + ".tmp")
        fd = self.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            self.pwrite_all(fd, data, 0)
            self.sync(fd)
        finally:
            self.close(fd)
        self.replace(tmp, path)
        self.sync_dir(path.parent)


DEFAULT_OPS = FileOps()


def _checksum(kind: str, version: int, *body: bytes) -> int:
    """The CRC-32 of a body (given whole, or as the pieces it is written in) under its kind and version."""
    crc = zlib.crc32(f"{kind} {version}\n".encode())
    for piece in body:
        crc = zlib.crc32(piece, crc)
    return crc


# Elements of an array encoded per json.dumps call, and strings long enough to be a piece of their own
# (see _json_pieces).
_SLICE = 4096
_LARGE_STRING = 16 * 1024


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _json_pieces(body: Any, out: list[bytes]) -> None:
    """Append to ``out`` the UTF-8 pieces that, joined, are
    ``json.dumps(body, sort_keys=True, separators=(",", ":"))`` byte for byte.

    Why pieces, and why slices: json.dumps is one C call that holds the GIL throughout. Encoding a
    large state file (a million-record transaction log snapshot is tens of MB) on a worker thread then
    froze the event loop for over half a second; in slices of a few thousand array elements the GIL is
    given up between calls. And the pieces are written as they are (``pwritev``), never joined: a
    transaction buffer snapshot of a busy topic is a few MB of base64, and joining the slices, then the
    object, then header and body, made three or four more copies of it at once, a recurring spike of
    10-25 MB in a store's resident set (docs/performance.md, the memory soak). Strings of an array
    (those base64 chunks) are one piece each, so no piece is much larger than the largest string.
    """
    if isinstance(body, list):
        out.append(b"[")
        start = 0
        for i, item in enumerate(body):
            if isinstance(item, str) and len(item) >= _LARGE_STRING:
                _json_slice(body, start, i, out)
                _json_slice(body, i, i + 1, out)
                start = i + 1
            elif i - start == _SLICE:
                _json_slice(body, start, i, out)
                start = i
        _json_slice(body, start, len(body), out)
        out.append(b"]")
        return
    if isinstance(body, dict) and all(isinstance(key, str) for key in body):
        out.append(b"{")
        for i, key in enumerate(sorted(body)):
            out.append((b"," if i else b"") + _dumps(key).encode() + b":")
            _json_pieces(body[key], out)
        out.append(b"}")
        return
    out.append(_dumps(body).encode())


def _json_slice(body: list[Any], start: int, end: int, out: list[bytes]) -> None:
    """The elements ``body[start:end]`` as one piece, after a comma unless they open the array."""
    if start < end:
        opened = out[-1] == b"["
        out.append((b"" if opened else b",") + _dumps(body[start:end])[1:-1].encode())


def encode_pieces(kind: str, version: int, body: Any) -> list[bytes]:
    """A state file of ``kind`` holding the JSON value ``body``, as pieces to be written one after
    another (header first): its checksum runs over the pieces, never over a joined copy."""
    pieces: list[bytes] = []
    _json_pieces(body, pieces)
    pieces.append(b"\n")
    length = sum(len(piece) for piece in pieces)
    crc = _checksum(kind, version, *pieces)
    return [f"{MAGIC} {kind} {version} {length} {crc:08x}\n".encode(), *pieces]


def encode(kind: str, version: int, body: Any) -> bytes:
    """The bytes of a state file of ``kind`` holding the JSON value ``body``."""
    return b"".join(encode_pieces(kind, version, body))


def write(path: Path, kind: str, version: int, body: Any, ops: FileOps = DEFAULT_OPS) -> None:
    """Durably replace ``path`` with a state file (creating its directory if needed)."""
    data = encode_pieces(kind, version, body)
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        ops.sync_dir(path.parent.parent)
    ops.write_file_atomically(path, data)


@dataclass(frozen=True)
class StateDocument:
    """What a state file held: its body and whether it was in the previous release's shape."""

    version: int
    body: Any
    legacy: bool = False


def decode(
    raw: bytes,
    path: Path,
    kind: str,
    versions: frozenset[int],
    *,
    legacy: Callable[[bytes], Any] | None = None,
    remedy: str | None = None,
) -> StateDocument:
    """Check and parse a state file's bytes; refuse (StateFileError naming ``path``) anything else.

    ``legacy`` parses the previous release's header-less shape (raising StateShapeError for anything
    that is not exactly that shape); without it a file with no header is refused.
    """
    if not raw.startswith(MAGIC.encode() + b" "):
        if legacy is None:
            problem = f"it does not start with the {MAGIC!r} header of a {kind} file"
            raise StateFileError(path, problem, remedy)
        try:
            return StateDocument(0, legacy(raw), legacy=True)
        except (StateShapeError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise StateFileError(
                path,
                f"it has no {MAGIC!r} header and is not a {kind} file of the previous release either "
                f"({_describe(exc)})",
                remedy,
            ) from exc
    end = raw.find(b"\n", 0, _MAX_HEADER)
    if end < 0:
        raise StateFileError(path, f"its header line is not terminated within {_MAX_HEADER} bytes", remedy)
    fields = raw[:end].split(b" ")
    if len(fields) != 5:
        raise StateFileError(path, f"its header {raw[:end]!r} does not have 5 fields", remedy)
    try:
        file_kind = fields[1].decode("ascii")
        version = _header_int(fields[2])
        length = _header_int(fields[3])
        crc = _header_crc(fields[4])
    except (UnicodeDecodeError, ValueError):
        raise StateFileError(path, f"its header {raw[:end]!r} is malformed", remedy) from None
    if file_kind != kind:
        raise StateFileError(path, f"it is a {file_kind!r} state file, not a {kind!r} one", remedy)
    if version not in versions:
        raise StateFileError(
            path,
            f"{kind} format version {version} is not one this release reads ({sorted(versions)}); "
            "it was written by a newer release",
            "run the release that wrote it, or restore the file from a backup",
        )
    body = raw[end + 1 :]
    if len(body) != length:
        problem = f"the header promises {length} body bytes, the file has {len(body)}"
        raise StateFileError(path, problem, remedy)
    if crc != _checksum(kind, version, body):
        raise StateFileError(
            path, f"checksum mismatch (header says {fields[4].decode(errors='replace')})", remedy
        )
    try:
        return StateDocument(version, json.loads(body.decode("utf-8")))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        # The checksum matched, so this was written like this: a bug, not damage. Still never served.
        raise StateFileError(path, f"its body is not JSON ({_describe(exc)})", remedy) from exc


def read(
    path: Path,
    kind: str,
    versions: frozenset[int],
    *,
    legacy: Callable[[bytes], Any] | None = None,
    remedy: str | None = None,
) -> StateDocument | None:
    """Read and check the state file at ``path``; None if it does not exist."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateFileError(path, f"it cannot be read ({exc.strerror or exc})", remedy) from exc
    return decode(raw, path, kind, versions, legacy=legacy, remedy=remedy)


def _header_int(text: bytes) -> int:
    if not text.isdigit() or not text.isascii() or (len(text) > 1 and text.startswith(b"0")):
        raise ValueError(text)
    return int(text)


def _header_crc(text: bytes) -> int:
    # Lower-case only, as written: an upper-case digit would be a changed byte that still parses.
    if len(text) != 8 or text.strip(b"0123456789abcdef"):
        raise ValueError(text)
    return int(text, 16)


def _describe(exc: Exception) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8: byte 0x{exc.object[exc.start]:02x} at offset {exc.start}"
    if isinstance(exc, json.JSONDecodeError):
        return f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    return str(exc)


# --- shape checks for decoded bodies (raise StateShapeError; callers add the file) -------------------


def parse_json(raw: bytes) -> Any:
    """Parse a previous release's JSON file strictly (UTF-8, JSON; errors propagate)."""
    return json.loads(raw.decode("utf-8"))


def obj(value: Any, what: str, keys: set[str] | None = None) -> dict[str, Any]:
    """``value`` as a JSON object; with ``keys``, it must have exactly those keys."""
    if not isinstance(value, dict):
        raise StateShapeError(f"{what} must be a JSON object, not {type(value).__name__}")
    if keys is not None and set(value) != keys:
        missing = sorted(keys - set(value))
        extra = sorted(set(value) - keys)
        parts = ([f"missing field(s) {missing}"] if missing else []) + (
            [f"unexpected field(s) {extra}"] if extra else []
        )
        raise StateShapeError(f"{what}: " + ", ".join(parts))
    return value


def integer(value: Any, what: str, minimum: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise StateShapeError(f"{what} must be an integer, not {json.dumps(value)}")
    if minimum is not None and value < minimum:
        raise StateShapeError(f"{what} must be >= {minimum}, not {value}")
    return value


def number(value: Any, what: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise StateShapeError(f"{what} must be a number, not {json.dumps(value)}")
    return float(value)


def boolean(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise StateShapeError(f"{what} must be true or false, not {json.dumps(value)}")
    return value


def string(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise StateShapeError(f"{what} must be a string, not {json.dumps(value)}")
    return value


def array(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise StateShapeError(f"{what} must be a JSON array, not {type(value).__name__}")
    return value


def versioned_legacy_body(
    raw: bytes, what: str, body_keys: set[str], version: int, check: Callable[[dict[str, Any]], object]
) -> dict[str, Any]:
    """A previous release's plain-JSON file: exactly {"version": ``version``} plus today's body fields.

    ``check`` parses the body as today's decoder would, so a refusal also says it is no old file either.
    """
    doc = obj(parse_json(raw), what, body_keys | {"version"})
    if doc["version"] != version or isinstance(doc["version"], bool):
        raise StateShapeError(f"unknown {what} version {doc['version']!r}")
    body = {k: v for k, v in doc.items() if k != "version"}
    check(body)
    return body
