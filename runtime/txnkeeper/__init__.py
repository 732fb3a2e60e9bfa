"""txnkeeper: transactional streaming storage with Pulsar PIP-160 batched transaction logs.

The package is layered (see docs/contracts.md): ledger -> bufferedwriter -> stores -> services -> edges.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("txnkeeper")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"
