"""The runtime's name for the release table, kept so storage modules import it from one familiar place.

The table itself lives in ``txnkeeper.contract.formats`` (shared with the operator); one codebase
emulates every release, which lets old and new pods run side by side in tests, the fleet and the cluster.
The runtime keeps a pod's level as a plain int (its admin API reports it as a JSON number).
"""

from __future__ import annotations

from txnkeeper.contract import formats
from txnkeeper.contract.formats import BATCHED_LEVEL, UNBATCHED_LEVEL, FormatLevel, UnknownReleaseError

__all__ = ["BATCHED_LEVEL", "UNBATCHED_LEVEL", "FormatLevel", "UnknownReleaseError", "format_level"]


def format_level(release: str) -> int:
    """The format level of ``release`` as an int (``formats.format_level`` gives the named level)."""
    return int(formats.format_level(release))
