"""Offload settings under Pulsar's broker.conf key names, with Pulsar's defaults.

Operators who know Pulsar's tiered storage recognise the knobs; ``from_properties`` reads the same
``key=value`` names, so a later slice can take them from a topic or namespace policy unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

from .errors import OffloadConfigError

MIB = 1024 * 1024

# Pulsar's own defaults (TieredStorageConfiguration / ServiceConfiguration).
DEFAULT_MAX_BLOCK_SIZE = 64 * MIB
DEFAULT_READ_BUFFER_SIZE = 1 * MIB
# Streaming offload (PIP-76): blocks of the open ledger are cut at the min block size, and the
# offloader buffers at most max(write buffer, min block) bytes of entries read but not yet uploaded.
DEFAULT_MIN_BLOCK_SIZE = 5 * MIB
DEFAULT_WRITE_BUFFER_SIZE = 10 * MIB
# The smallest part S3 accepts in a multipart upload (all parts but the last).
S3_MIN_PART_SIZE = 5 * MIB

DRIVERS = ("aws-s3", "S3", "filesystem")


@dataclass(frozen=True)
class OffloadConfig:
    """One offloader's settings; field names are Pulsar's configuration keys."""

    managedLedgerOffloadDriver: str = "filesystem"
    managedLedgerOffloadBucket: str = ""
    managedLedgerOffloadRegion: str = ""
    managedLedgerOffloadServiceEndpoint: str = ""
    # The filesystem driver's directory (Pulsar's filesystem offloader calls its root fileSystemURI).
    fileSystemURI: str = ""
    # Size of each data block (and at least that of each object part); a block holding a larger entry
    # grows to fit it, exactly as Pulsar's BufferedOffloadStream.calculateBlockSize does.
    managedLedgerOffloadMaxBlockSizeInBytes: int = DEFAULT_MAX_BLOCK_SIZE
    # Pulsar reads in chunks of this size; this reader fetches whole blocks (to check their CRC) and
    # uses it as the size of each ranged GET's read() from the response stream.
    managedLedgerOffloadReadBufferSizeInBytes: int = DEFAULT_READ_BUFFER_SIZE
    # Streaming mode's block size (Pulsar's streamingBlockSize), capped here at the max block size so a
    # small max block (tests) is not silently exceeded.
    managedLedgerOffloadMinBlockSizeInBytes: int = DEFAULT_MIN_BLOCK_SIZE
    # How many bytes of local entries streaming reads ahead of the upload (Pulsar's maxBufferLength is
    # max(this, min block size)); it bounds the offloader's memory, never the producers.
    managedLedgerOffloadWriteBufferSizeInBytes: int = DEFAULT_WRITE_BUFFER_SIZE

    def __post_init__(self) -> None:
        if self.managedLedgerOffloadDriver not in DRIVERS:
            raise OffloadConfigError(
                f"managedLedgerOffloadDriver={self.managedLedgerOffloadDriver!r} is not supported; "
                f"use one of {', '.join(DRIVERS)}"
            )
        # A block must at least hold its 128-byte header and one empty framed entry.
        if self.managedLedgerOffloadMaxBlockSizeInBytes < 128 + 12:
            raise OffloadConfigError(
                f"managedLedgerOffloadMaxBlockSizeInBytes={self.managedLedgerOffloadMaxBlockSizeInBytes} "
                "is too small; it must be at least 140 (the 128-byte block header plus one entry frame)"
            )
        if self.managedLedgerOffloadMaxBlockSizeInBytes > 2**31 - 1:
            raise OffloadConfigError(
                "managedLedgerOffloadMaxBlockSizeInBytes must fit a Java int (at most 2147483647), "
                "as Pulsar's readers size blocks with one"
            )
        if self.managedLedgerOffloadMinBlockSizeInBytes < 128 + 12:
            raise OffloadConfigError(
                f"managedLedgerOffloadMinBlockSizeInBytes={self.managedLedgerOffloadMinBlockSizeInBytes} "
                "is too small; it must be at least 140 (the 128-byte block header plus one entry frame)"
            )
        if self.managedLedgerOffloadWriteBufferSizeInBytes < 1:
            raise OffloadConfigError("managedLedgerOffloadWriteBufferSizeInBytes must be at least 1")
        if self.managedLedgerOffloadReadBufferSizeInBytes < 1:
            raise OffloadConfigError("managedLedgerOffloadReadBufferSizeInBytes must be at least 1")
        if self.is_s3 and not self.managedLedgerOffloadBucket:
            raise OffloadConfigError(
                f"managedLedgerOffloadBucket is required for the {self.managedLedgerOffloadDriver} driver"
            )
        if self.managedLedgerOffloadDriver == "filesystem" and not self.fileSystemURI:
            raise OffloadConfigError(
                "fileSystemURI (the offload directory) is required for the filesystem driver"
            )
        uri = self.fileSystemURI
        if uri and ("\x00" in uri or not os.path.isabs(uri)):
            # A relative one would name a directory under wherever the pod happens to run, not the
            # tier's volume: a restore against it found nothing there and dropped the real segments.
            raise OffloadConfigError(
                f"fileSystemURI={uri[:200]!r} must be an absolute directory path (the tier's mount, "
                "e.g. /var/lib/txnkeeper-offload)"
            )

    @property
    def streaming_block_size(self) -> int:
        return min(self.managedLedgerOffloadMinBlockSizeInBytes, self.managedLedgerOffloadMaxBlockSizeInBytes)

    @property
    def streaming_buffer_size(self) -> int:
        return max(self.managedLedgerOffloadWriteBufferSizeInBytes, self.streaming_block_size)

    def location(self) -> tuple[str, ...]:
        """What says where segments live: a live change of these would strand existing segments."""
        return (
            "s3" if self.is_s3 else "filesystem",
            self.managedLedgerOffloadBucket,
            self.managedLedgerOffloadRegion,
            self.managedLedgerOffloadServiceEndpoint,
            os.path.normpath(self.fileSystemURI) if self.fileSystemURI else "",
        )

    def describe_location(self) -> str:
        """The tier as an operator names it, e.g. "filesystem /offload" or "s3 bucket 'b' at URL"."""
        if not self.is_s3:
            return f"filesystem {os.path.normpath(self.fileSystemURI)}"
        where = f"s3 bucket {self.managedLedgerOffloadBucket!r}"
        if self.managedLedgerOffloadServiceEndpoint:
            where += f" at {self.managedLedgerOffloadServiceEndpoint}"
        if self.managedLedgerOffloadRegion:
            where += f" in region {self.managedLedgerOffloadRegion}"
        return where

    @property
    def is_s3(self) -> bool:
        return self.managedLedgerOffloadDriver in ("aws-s3", "S3")

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> OffloadConfig:
        """Build from Pulsar-style ``key=value`` strings; unknown keys are refused, not ignored."""
        known = {f.name: f for f in fields(cls)}
        kwargs: dict[str, object] = {}
        for key, raw in props.items():
            if key not in known:
                raise OffloadConfigError(
                    f"unknown offload setting {key!r}; known settings: {', '.join(sorted(known))}"
                )
            if known[key].type in ("int", int):
                try:
                    kwargs[key] = int(raw)
                except ValueError:
                    raise OffloadConfigError(f"{key}={raw!r} is not an integer") from None
            else:
                kwargs[key] = raw
        return cls(**kwargs)  # type: ignore[arg-type]
