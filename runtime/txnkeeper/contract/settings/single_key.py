"""PDP-44 single-routing-key transaction settings, declared once: the CR's and the ``--config`` file's
``singleKeyTransactions`` section, the ``--srk-*`` serve flags and their ``TXNKEEPER_SRK_*`` env, the
CRD's fragment and the docs' table, with their limits (``SRK_*``, which ``contract.store_settings``
re-exports).
"""

from __future__ import annotations

from txnkeeper.contract.settings.schema import Section, Setting

MIB = 1024 * 1024
SRK_MAX_BLOCK_BYTES = 16 * MIB  # PDP-44's max transaction size; a block is applied in one group commit
SRK_DEFAULT_MAX_BLOCK_BYTES = 16 * MIB
# How long a silent writer's last event number (and an idempotent producer's last sequence id) is
# remembered: 7 days, longer than Pulsar's brokerDeduplicationProducerInactivityMinutes (360), because a
# writer that reconnects after its state expired gets WRITER_STATE_LOST instead of a retry.
SRK_DEFAULT_WRITER_INACTIVITY_MINUTES = 7 * 24 * 60
SRK_MAX_WRITER_INACTIVITY_MINUTES = 365 * 24 * 60  # a year
SRK_DEFAULT_MAX_WRITERS_PER_TOPIC = 10_000
SRK_MAX_MAX_WRITERS_PER_TOPIC = 1_000_000  # the writer table is held in memory and in every snapshot

SINGLE_KEY = Section(
    "singleKeyTransactions",
    "PDP-44 single-routing-key transactions (release 3.x): a writer's block of events for one key is "
    "applied atomically by the topic's store pod, without the coordinator.",
    (
        Setting(
            "enabled",
            "enabled",
            "bool",
            False,
            "Accept single-key transactions.",
            flag="--srk-enabled",
            env="SRK_ENABLED",
            flag_help="serve single-routing-key transactions: true or false (config"
            " singleKeyTransactions.enabled)",
        ),
        Setting(
            "maxBlockBytes",
            "max_block_bytes",
            "int",
            SRK_DEFAULT_MAX_BLOCK_BYTES,
            "Largest transaction (block) a writer may commit, at most 16 MiB.",
            flag="--srk-max-block-bytes",
            env="SRK_MAX_BLOCK_BYTES",
            minimum=1,
            maximum=SRK_MAX_BLOCK_BYTES,
            unit="bytes",
            flag_help="largest block a writer may append",
        ),
        Setting(
            "writerInactivityMinutes",
            "writer_inactivity_minutes",
            "int",
            SRK_DEFAULT_WRITER_INACTIVITY_MINUTES,
            "Forget a writer's state after this many idle minutes (its next block gets WriterStateLost).",
            flag="--srk-writer-inactivity-minutes",
            env="SRK_WRITER_INACTIVITY_MINUTES",
            minimum=1,
            maximum=SRK_MAX_WRITER_INACTIVITY_MINUTES,
            unit="min",
            flag_help="a writer idle this long is forgotten (7 days by default)",
        ),
        Setting(
            "maxWritersPerTopic",
            "max_writers_per_topic",
            "int",
            SRK_DEFAULT_MAX_WRITERS_PER_TOPIC,
            "Writers whose state a topic keeps at most.",
            flag="--srk-max-writers-per-topic",
            env="SRK_MAX_WRITERS_PER_TOPIC",
            minimum=1,
            maximum=SRK_MAX_MAX_WRITERS_PER_TOPIC,
            flag_help="writers (and idempotent producers) a topic remembers, per principal when clients"
            " authenticate",
        ),
    ),
)
