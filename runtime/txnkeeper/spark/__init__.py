"""A Spark data source for txnkeeper topics: ``spark.read.format("txnkeeper")`` and ``readStream``.

Reads a topic's committed messages (as a consumer would see them: no aborted transaction's message,
no open transaction's message until it commits) directly from the store pods' ledgers (through their
admin API, in bounded ranges) and from the PIP-76 tier (objects read by the executors), one Spark
partition per ledger or Offloaded segment. ``register(spark)`` makes the format name known to a
session; README "Reading topics from Spark" has the options. Only ``source`` imports PySpark.
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Register the ``txnkeeper`` format with a SparkSession."""
    from txnkeeper.spark.source import TxnkeeperDataSource

    spark.dataSource.register(TxnkeeperDataSource)
