"""Settings of one managed ledger, validated when built so a bad value fails at open, not mid-write."""

from __future__ import annotations

from dataclasses import dataclass

from .offload.offloader import OffloadPolicy


@dataclass(frozen=True)
class ManagedLedgerConfig:
    """Rollover limits and durability switches (see docs/contracts.md section 1)."""

    max_entries_per_ledger: int = 50_000
    max_size_per_ledger_bytes: int = 64 * 1024 * 1024
    max_ledger_age_seconds: float | None = 4 * 3600.0
    fsync: bool = True
    group_commit: bool = True
    # Small groups that find the writer idle are written and fsynced on the event loop's thread
    # while recent writes took less than this (ledger/writer.py); None: always on the I/O pool.
    inline_sync_under_ms: float | None = 0.5
    # PIP-76 offload to a blob store; None (the default) never offloads and never reads a tier.
    offload: OffloadPolicy | None = None

    def __post_init__(self) -> None:
        if self.max_entries_per_ledger < 1:
            raise ValueError(
                f"max_entries_per_ledger must be >= 1 (got {self.max_entries_per_ledger}); "
                "use 1 for one entry per ledger"
            )
        if self.max_size_per_ledger_bytes < 1:
            raise ValueError(f"max_size_per_ledger_bytes must be >= 1 (got {self.max_size_per_ledger_bytes})")
        if self.inline_sync_under_ms is not None and not self.inline_sync_under_ms > 0:
            raise ValueError(
                f"inline_sync_under_ms must be > 0, or None to write every group on the I/O pool "
                f"(got {self.inline_sync_under_ms})"
            )
        if self.max_ledger_age_seconds is not None and not self.max_ledger_age_seconds > 0:
            raise ValueError(
                f"max_ledger_age_seconds must be > 0 or None to disable age rollover "
                f"(got {self.max_ledger_age_seconds})"
            )
