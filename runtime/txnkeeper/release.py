"""The runtime's name for the release table, kept so storage modules import it from one familiar place.

The table itself lives in ``txnkeeper.contract.formats`` (shared with the operator); one codebase
emulates every release, which lets old and new pods run side by side in tests, the fleet and the cluster.
"""

from __future__ import annotations

from txnkeeper.contract.formats import (
    BATCHED_LEVEL,
    UNBATCHED_LEVEL,
    FormatLevel,
    UnknownReleaseError,
    format_level,
)

__all__ = ["BATCHED_LEVEL", "UNBATCHED_LEVEL", "FormatLevel", "UnknownReleaseError", "format_level"]
