"""PIP-160 batched-write settings, declared once: the CR's and the ``--config`` file's ``batchedWrite``
block, Pulsar's TxnBufferedWriterStat (the admin API's spelling), the CRD's fragment and the docs' table.

Why the limits are here: before them the CRD accepted a maxSizeBytes the runtime refused (up to 64 MiB
against the runtime's 16 MiB cap) and the runtime accepted a maxDelayMillis of 10^12 that stalls every
transaction. Every layer now reads this declaration (``contract.batching`` re-exports the constants).
"""

from __future__ import annotations

from txnkeeper.contract.settings.schema import Section, Setting

SECTION_NAME = "batchedWrite"
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

BATCHED_WRITE = Section(
    SECTION_NAME,
    "PIP-160 batched writes of a pod's transaction logs or pending-ack logs. Turning it on or off, or "
    "changing a limit, is applied to running pods one at a time through their admin API, without restarts.",
    (
        Setting(
            "enabled",
            "enabled",
            "bool",
            DEFAULT_ENABLED,
            "Write many records per ledger entry (a batched entry). Needs a 2.x version; enabling it during "
            "an upgrade from 1.x takes effect only after every pod runs 2.x.",
            spellings={"stat": "batchEnabled"},
        ),
        Setting(
            "maxRecords",
            "max_records",
            "int",
            DEFAULT_MAX_RECORDS,
            "Flush a batch once this many records are queued (checked first). 1 disables batching.",
            minimum=MIN_MAX_RECORDS,
            maximum=MAX_MAX_RECORDS,
            range_text=f"from {MIN_MAX_RECORDS} (every record its own entry) to {MAX_MAX_RECORDS}",
            spellings={"stat": "batchedWriteMaxRecords"},
        ),
        Setting(
            "maxSizeBytes",
            "max_size_bytes",
            "int",
            DEFAULT_MAX_SIZE_BYTES,
            "Flush a batch once its queued records reach this many bytes; a single record at least this big "
            "is written alone, unbatched. At most 16 MiB: a batch can reach about twice this size and must "
            "fit a ledger entry.",
            minimum=MIN_MAX_SIZE_BYTES,
            maximum=MAX_MAX_SIZE_BYTES,
            unit="bytes",
            range_text=f"from {MIN_MAX_SIZE_BYTES} (the batch header plus one record header) to"
            f" {MAX_MAX_SIZE_BYTES} (16 MiB)",
            spellings={"stat": "batchedWriteMaxSize"},
        ),
        Setting(
            "maxDelayMillis",
            "max_delay_millis",
            "number",
            DEFAULT_MAX_DELAY_MILLIS,
            "Flush a non-empty batch at least this often (milliseconds; 0: on the next event-loop turn). "
            "Every transactional call may wait this long, hence the one-minute bound.",
            minimum=MIN_MAX_DELAY_MILLIS,
            maximum=MAX_MAX_DELAY_MILLIS,
            unit="ms",
            range_text=f"from {MIN_MAX_DELAY_MILLIS} to {MAX_MAX_DELAY_MILLIS} (every transactional call"
            " waits up to this long)",
            spellings={"stat": "batchedWriteMaxDelayInMillis"},
            # Pods take fractions of a millisecond (config file, admin API); the CR whole milliseconds.
            cr_integer=True,
        ),
        Setting(
            "flushMode",
            "flush_mode",
            "enum",
            DEFAULT_FLUSH_MODE,
            "adaptive (default): flush as soon as the previous batch's write completed, so batches grow "
            "with load; delay: Pulsar's pure timer, flush only at maxDelayMillis, maxRecords or "
            "maxSizeBytes. Read by pods at start: a change takes effect as pods restart.",
            choices=FLUSH_MODES,
            hint=' ("delay" is Pulsar\'s behaviour, "adaptive" flushes at once while the ledger is idle)',
            spellings={"stat": "batchedWriteFlushMode"},
        ),
    ),
)
