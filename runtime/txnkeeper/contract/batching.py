"""PIP-160 batched-write limits and defaults: the one set the runtime, its ``--config`` file, the admin API
and the CRDs all enforce.

Why a module of its own: before it, the CRD accepted a maxSizeBytes the runtime refused (up to 64 MiB
against the runtime's 16 MiB cap) and the runtime accepted a maxDelayMillis of 10^12 that stalls every
transaction. Every layer now reads its bounds from here. It imports only the standard library so the
operator (which never imports runtime internals, docs/contracts.md §0) can import it too.
"""

from __future__ import annotations

# Defaults are Pulsar's (transactionLogBatchedWriteEnabled=false, 512 records, 4 MiB, 1 ms).
DEFAULT_ENABLED = False
DEFAULT_MAX_RECORDS = 512
DEFAULT_MAX_SIZE_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_DELAY_MILLIS = 1
# How a batch leaves (ours, not Pulsar's): "adaptive" hands it to the ledger at once while no batch
# entry is in flight and accumulates while one is; "delay" is Pulsar's pure timer, for parity.
FLUSH_MODES = ("adaptive", "delay")
DEFAULT_FLUSH_MODE = "adaptive"

# maxRecords 1 means "every record is its own (plain) entry", as in Pulsar. The upper bound keeps a
# batch's ack set (one bit per record, kept per entry by every cursor) small.
MIN_MAX_RECORDS = 1
MAX_MAX_RECORDS = 65536
# A batch that batches at all holds at least two records (the CRD refuses enabled with maxRecords 1).
MIN_MAX_RECORDS_WHEN_ENABLED = 2

# The smallest batch is its 4-byte header plus one framed empty record (tag + length byte); the
# bufferedwriter's tests check that this still matches the codec's format.
MIN_MAX_SIZE_BYTES = 6
# A batch can reach about twice maxSize (it flushes after the record that crosses the limit); this
# bound keeps every batch well inside the managed ledger's 64 MiB entry limit.
MAX_MAX_SIZE_BYTES = 16 * 1024 * 1024

# 0 flushes on the next event-loop turn. A transaction's operation waits for its batch to be written,
# so the delay is added to every transactional call: past a minute, every client times out first.
MIN_MAX_DELAY_MILLIS = 0
MAX_MAX_DELAY_MILLIS = 60_000
