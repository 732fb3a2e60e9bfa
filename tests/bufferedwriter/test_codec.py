"""The batched entry format is Pulsar's byte for byte, and readers tell the formats apart safely."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txnkeeper.bufferedwriter.codec import (
    BATCH_HEADER,
    PENDING_ACK_CODEC,
    TXN_LOG_CODEC,
    EntryDecodeError,
    RecordEncodeError,
    UnknownBatchVersionError,
    batch_version,
    decode_entry,
    encode_batch,
    frame_record,
    is_batched,
)
from txnkeeper.pb import PulsarTransactionMetadata_pb2 as tm
from txnkeeper.pb import TransactionPendingAck_pb2 as pa

u64 = st.integers(min_value=0, max_value=2**64 - 1)
i64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
status = st.sampled_from([tm.OPEN, tm.COMMITTING, tm.COMMITTED, tm.ABORTING, tm.ABORTED])
txn_ops = st.sampled_from(tm.TransactionMetadataEntry.TransactionMetadataOp.values())  # NEW, ..., UPDATE
ack_types = st.sampled_from(pa.CommandAck.AckType.values())  # Individual, Cumulative


@st.composite
def txn_records(draw: st.DrawFn) -> tm.TransactionMetadataEntry:
    rec = tm.TransactionMetadataEntry(
        metadata_op=draw(txn_ops),
        txnid_least_bits=draw(u64),
        txnid_most_bits=draw(u64),
        partitions=draw(st.lists(st.text(max_size=40), max_size=4)),
        subscriptions=[
            tm.Subscription(topic=t, subscription=s)
            for t, s in draw(st.lists(st.tuples(st.text(max_size=20), st.text(max_size=20)), max_size=3))
        ],
    )
    if draw(st.booleans()):
        rec.expected_status = draw(status)
        rec.new_status = draw(status)
    if draw(st.booleans()):
        rec.timeout_ms = draw(u64)
        rec.start_time = draw(u64)
        rec.owner = draw(st.text(max_size=30))
    return rec


@st.composite
def ack_records(draw: st.DrawFn) -> pa.PendingAckMetadataEntry:
    return pa.PendingAckMetadataEntry(
        pending_ack_op=draw(st.sampled_from([pa.ACK, pa.COMMIT, pa.ABORT])),
        ack_type=draw(ack_types),
        txnid_least_bits=draw(u64),
        txnid_most_bits=draw(u64),
        pending_ack_metadata=[
            pa.PendingAckMetadata(ledgerId=lid, entryId=eid, ack_set=acks, batch_size=bs)
            for lid, eid, acks, bs in draw(
                st.lists(st.tuples(u64, u64, st.lists(i64, max_size=4), st.integers(0, 1000)), max_size=3)
            )
        ],
    )


def test_header_bytes_are_pulsars() -> None:
    assert bytes.fromhex("0e010001") == BATCH_HEADER


@settings(max_examples=150, deadline=None)
@given(st.lists(txn_records(), max_size=20))
def test_txn_batches_equal_protobufs_own_serialization(records: list[tm.TransactionMetadataEntry]) -> None:
    expected = BATCH_HEADER + tm.BatchedTransactionMetadataEntry(transaction_logs=records).SerializeToString()
    assert TXN_LOG_CODEC.encode_batch(records) == expected
    assert encode_batch(records) == expected
    assert encode_batch([r.SerializeToString() for r in records]) == expected
    decoded = decode_entry(expected, TXN_LOG_CODEC)
    assert decoded.batched
    assert decoded.records == records
    assert decoded.batch_size == len(records)


@settings(max_examples=150, deadline=None)
@given(st.lists(ack_records(), max_size=20))
def test_pending_ack_batches_equal_protobufs_own_serialization(
    records: list[pa.PendingAckMetadataEntry],
) -> None:
    expected = BATCH_HEADER + pa.BatchedPendingAckMetadataEntry(pending_ack_logs=records).SerializeToString()
    assert PENDING_ACK_CODEC.encode_batch(records) == expected
    assert PENDING_ACK_CODEC.decode_entry(expected).records == records


@pytest.mark.parametrize("length", [0, 1, 127, 128, 16383, 16384, 70000, 2_100_000])
def test_framing_of_every_varint_width(length: int) -> None:
    rec = tm.TransactionMetadataEntry(owner="x" * length)
    data = rec.SerializeToString()
    expected = tm.BatchedTransactionMetadataEntry(transaction_logs=[rec]).SerializeToString()
    assert frame_record(data) == expected


@settings(max_examples=100, deadline=None)
@given(txn_records())
def test_unbatched_record_is_the_whole_entry(record: tm.TransactionMetadataEntry) -> None:
    data = record.SerializeToString()
    # Field 1 with wire type 6 does not exist, so no record can begin with the magic's first byte.
    assert not is_batched(data)
    decoded = TXN_LOG_CODEC.decode_entry(data)
    assert not decoded.batched
    assert decoded.records == [record]
    assert decoded.batch_size == 0


def test_unknown_version_names_it() -> None:
    data = bytes.fromhex("0e010002") + b"\x0a\x00"
    with pytest.raises(UnknownBatchVersionError, match=r"version 2.*reads batch version 1") as info:
        TXN_LOG_CODEC.decode_entry(data)
    assert info.value.version == 2


def test_truncated_header_is_an_error() -> None:
    with pytest.raises(EntryDecodeError, match="truncated"):
        batch_version(b"\x0e\x01\x00")


def test_garbage_is_a_clear_error_not_a_guess() -> None:
    with pytest.raises(EntryDecodeError, match="not a valid TransactionMetadataEntry"):
        TXN_LOG_CODEC.decode_entry(b"\xff\xff\xff")
    with pytest.raises(EntryDecodeError, match="not a valid BatchedPendingAckMetadataEntry"):
        PENDING_ACK_CODEC.decode_entry(BATCH_HEADER + b"\x0a\x05ab")


def test_missing_required_field_is_refused_at_serialization() -> None:
    rec = pa.PendingAckMetadataEntry(pending_ack_op=pa.ACK)
    rec.pending_ack_metadata.add(ledgerId=1)  # entryId is required
    with pytest.raises(RecordEncodeError, match="required"):
        PENDING_ACK_CODEC.serialize(rec)


def test_wrong_record_type_is_refused() -> None:
    with pytest.raises(TypeError, match="stores PendingAckMetadataEntry records"):
        PENDING_ACK_CODEC.serialize(tm.TransactionMetadataEntry())  # type: ignore[arg-type]
