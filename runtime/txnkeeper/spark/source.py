"""``spark.read.format("txnkeeper")`` and ``spark.readStream.format("txnkeeper")``: PySpark's Python
Data Source API over a topic's committed messages.

Batch: ``partitions()`` plans one Spark partition per pod-held ledger or Offloaded segment (driver.py)
and each task reads its part (read.py). Streaming: offsets are ``{topic: "ledgerId:entryId"}``, the
last position a micro-batch covers; ``latestOffset`` is the newest readable position (the max read
position with ``committedOnly``), and ``partitions(start, end)`` plans exactly the entries after
``start`` up to ``end``. Because a range of positions below the max read position always reads the
same rows (its transactions have ended; their outcomes are kept while their entries exist), Spark's
offset log makes a restarted query read each message once: a micro-batch planned before a crash is
planned again from its logged offsets.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import islice
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from txnkeeper.ledger.position import Position
from txnkeeper.spark.driver import plan, readable_offsets
from txnkeeper.spark.plan import BEFORE_ALL, Part, ReadOptions, parse_options
from txnkeeper.spark.read import read_part
from txnkeeper.spark.rows import SCHEMA, Row

if TYPE_CHECKING:
    import pyarrow as pa

NAME = "txnkeeper"
# Rows per Arrow batch handed to Spark: one conversion per batch instead of one object per row.
BATCH_ROWS = 4096


def arrow_batches(rows: Iterator[Row]) -> Iterator[pa.RecordBatch]:
    """``rows`` as Arrow record batches of the data source's schema (what Spark takes fastest)."""
    import pyarrow as pa

    schema = pa.schema(
        [
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("ledgerId", pa.int64()),
            ("entryId", pa.int64()),
            ("batchIndex", pa.int32()),
            ("publishTime", pa.timestamp("us", tz="UTC")),
            ("producerName", pa.string()),
            ("key", pa.string()),
            ("properties", pa.map_(pa.string(), pa.string())),
            ("payload", pa.binary()),
            ("txnId", pa.string()),
            ("txnState", pa.string()),
        ]
    )
    while True:
        chunk = list(islice(rows, BATCH_ROWS))
        if not chunk:
            return
        columns = list(zip(*chunk, strict=True))
        columns[8] = tuple(list(p.items()) for p in columns[8])
        yield pa.RecordBatch.from_arrays(
            [pa.array(column, type=field.type) for column, field in zip(columns, schema, strict=True)],
            schema=schema,
        )


def _require_pyarrow() -> None:
    try:
        import pyarrow  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "the txnkeeper data source hands rows to Spark as Arrow batches and needs pyarrow, which "
            "is not installed here: pip install 'txnkeeper[spark-source]' (PySpark >= 4.0 and pyarrow) "
            "in the driver's and the executors' Python"
        ) from exc


class TopicPartition(InputPartition):
    """One planned part (``plan.PodPart`` or ``plan.TierPart``), shipped to an executor."""

    def __init__(self, part: Part) -> None:
        super().__init__(part)
        self.part = part


class TxnkeeperDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA

    def _options(self) -> ReadOptions:
        _require_pyarrow()  # checked where the query is planned, before any executor reads
        return parse_options(dict(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        return TopicReader(self._options())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TopicStreamReader(self._options())


class TopicReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        return [TopicPartition(part) for part in plan(self.options)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TopicPartition)
        yield from arrow_batches(read_part(partition.part, self.options))


class TopicStreamReader(DataSourceStreamReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def initialOffset(self) -> dict[str, str]:
        if self.options.starting == "latest":
            return readable_offsets(self.options)
        return {topic: str(BEFORE_ALL) for topic in self.options.topics}

    def latestOffset(self, start: dict[str, str], limit: object) -> dict[str, str]:
        now = readable_offsets(self.options)
        # Never behind the start: a restarted store reports the same or a later readable position.
        return {t: str(max(Position.parse(now[t]), Position.parse(start.get(t, now[t])))) for t in now}

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> Sequence[InputPartition]:
        bounds: dict[str, tuple[Position, Position | None]] = {}
        for topic in self.options.topics:
            after = Position.parse(start.get(topic, str(BEFORE_ALL)))
            bounds[topic] = (Position(after.ledger_id, after.entry_id + 1), Position.parse(end[topic]))
        return [TopicPartition(part) for part in plan(self.options, bounds)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TopicPartition)
        yield from arrow_batches(read_part(partition.part, self.options))

    def commit(self, end: dict[str, str]) -> None:
        """Nothing to release: the store keeps every entry its retention keeps."""
