"""Reading the entries of one planned part on an executor: a pod-held ledger through its admin API, or
an Offloaded segment straight from the blob store (never through the driver or the pod).

Why apart from the rows: the offload audit (``verify-offload``) compares what these readers get from the
tier with what the pod serves, on executors that may have nothing but the shipped txnkeeper code (no
protobuf: nothing here decodes an entry). A tier block is CRC-checked against its index before any entry
of it is returned (``SegmentReader``), and any failure is a PartReadError naming the topic, the
positions and the object or pod, so a task fails rather than return wrong data.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator, Iterator, Mapping
from dataclasses import fields
from typing import Any

from txnkeeper.ledger.offload import OffloadConfig, OffloadError, SegmentReader, data_key, index_key
from txnkeeper.ledger.offload.blobstore import BlobStore
from txnkeeper.ledger.offload.offloader import open_blob_store
from txnkeeper.spark import store_http
from txnkeeper.spark.plan import PodPart, ReadOptionError, ReadOptions, TierPart

# Entries read from a segment per call (a call reads every block holding them).
TIER_CHUNK = 1_000


class PartReadError(RuntimeError):
    """A part could not be read; names topic, positions and the object or pod; no row of it is returned
    past the failure."""


def tier_config(properties: Mapping[str, Any] | None) -> OffloadConfig:
    """The blob-store part of an offload section (policy keys ignored)."""
    if not properties:
        raise ReadOptionError(
            "the topic has ledgers only the tier holds: give the tier's settings as .option('offload', "
            'JSON of the pods\' offload section, e.g. {"managedLedgerOffloadDriver": "filesystem", '
            '"fileSystemURI": "/var/lib/txnkeeper-offload"})'
        )
    known = {f.name for f in fields(OffloadConfig)}
    try:
        return OffloadConfig.from_properties({k: str(v) for k, v in properties.items() if k in known})
    except (OffloadError, ValueError) as exc:
        raise ReadOptionError(f"option 'offload': bad tier settings: {exc}") from exc


def pod_entries(part: PodPart, options: ReadOptions) -> Iterator[tuple[int, bytes]]:
    """(entry id, data) of the part's range, in bounded requests."""
    view = part.view
    entry = part.first
    while entry <= part.last:
        limit = min(options.request_entries, part.last - entry + 1)
        try:
            got = store_http.read_entries(
                view.admin_url,
                view.topic,
                (part.ledger_id, entry),
                (limit, options.request_bytes),
                options.timeout_s,
            )
        except store_http.StoreReadError as exc:
            raise PartReadError(str(exc)) from None
        if not got.entries:
            raise PartReadError(
                f"topic {view.topic!r}: the store holds {got.durable_entries} entries of ledger "
                f"{part.ledger_id}, but entries {part.ledger_id}:{entry}..{part.last} were planned (trimmed "
                "meanwhile?); run the read again"
            )
        for data in got.entries[: part.last - entry + 1]:
            yield entry, data
            entry += 1


def tier_entries(
    part: TierPart, options: ReadOptions, store: BlobStore | None = None
) -> Generator[tuple[int, int, bytes], None, None]:
    """(ledger id, entry id, data) of the segment's ranges, read and checked from the blob store."""
    loop = asyncio.new_event_loop()
    owned = store is None
    if store is None:
        store = open_blob_store(tier_config(options.offload))
    reader = SegmentReader(store, part.uuid)
    try:
        for ledger_id, first, last in part.ranges:
            start = first
            while start <= last:
                end = min(last, start + TIER_CHUNK - 1)
                try:
                    datas = loop.run_until_complete(reader.read_entry_data(ledger_id, start, end))
                except (OffloadError, OSError) as exc:
                    raise PartReadError(
                        f"topic {part.view.topic!r}: reading entries {ledger_id}:{start}..{end} from tier "
                        f"segment {part.uuid} (objects {data_key(part.uuid)!r} and "
                        f"{index_key(part.uuid)!r} at {store.location}) failed: {exc}"
                    ) from None
                for i, data in enumerate(datas):
                    yield ledger_id, start + i, data
                start = end + 1
    finally:
        if owned:
            loop.run_until_complete(store.close())
        loop.close()
