"""A message's entry is assembled around its payload (one copy) instead of through protobuf (two):
the bytes must be exactly protobuf's own serialization, for every field combination and for payload
sizes at each varint length boundary, whether the payload is bytes or a view of a receive buffer."""

from __future__ import annotations

import os
import random

import pytest

from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.topic.records import decode, encode_data
from txnkeeper.txnid import TxnID

SIZES = [0, 1, 127, 128, 16383, 16384, 16385, 2**21 - 1, 2**21 + 3]


def through_protobuf(
    payload: bytes,
    key: str,
    txn: TxnID | None,
    time_ms: int,
    *,
    producer: str,
    sequence: int,
    metadata: bytes,
) -> bytes:
    entry = api.PartitionEntry()
    record = entry.data
    record.payload = payload
    record.key = key
    record.publish_time_ms = time_ms
    if metadata:
        record.pulsar_metadata = metadata
    if txn is not None:
        record.txn_id.most = txn.most
        record.txn_id.least = txn.least
    if producer:
        record.producer_name = producer
        record.sequence_id = sequence
    return entry.SerializeToString()


@pytest.mark.parametrize("size", SIZES)
def test_entries_are_protobufs_own_bytes(size: int) -> None:
    rng = random.Random(size)
    for round_ in range(40):
        payload = os.urandom(size)
        key = rng.choice(["", "k", "é" * 70])
        txn = rng.choice([None, TxnID(rng.randrange(2**40), rng.randrange(2**62))])
        time_ms = rng.randrange(1, 2**42)
        producer = rng.choice(["", "producer-1"])
        sequence = rng.randrange(2**63) if producer else 0
        metadata = rng.choice([b"", os.urandom(rng.randrange(1, 300))])
        given: bytes | memoryview = payload if round_ % 2 else memoryview(bytearray(b"xx" + payload))[2:]
        entry = encode_data(
            given, key, txn, time_ms, producer_name=producer, sequence_id=sequence, metadata=metadata
        )
        assert entry == through_protobuf(
            payload, key, txn, time_ms, producer=producer, sequence=sequence, metadata=metadata
        )
        record = decode(entry, "t", 0)
        assert (record.payload, record.key, record.txn_id) == (payload, key, txn)
