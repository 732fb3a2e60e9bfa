"""The .proto files are the compatibility contract with Pulsar: check the generated code matches them
and that the field numbers are exactly Pulsar's."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf.descriptor import Descriptor

from txnkeeper.pb import PulsarTransactionMetadata_pb2 as tm
from txnkeeper.pb import TransactionPendingAck_pb2 as pa
from txnkeeper.pb.generate import generate

ROOT = Path(__file__).resolve().parents[1]


def test_generated_code_matches_proto_sources(tmp_path: Path) -> None:
    fresh = generate(ROOT / "proto", tmp_path)
    assert fresh, "protoc produced nothing"
    installed = ROOT / "runtime" / "txnkeeper" / "pb"
    for path in fresh:
        committed = installed / path.name
        assert committed.exists(), f"{path.name} missing: run `make proto`"
        assert committed.read_text() == path.read_text(), f"{path.name} is stale: run `make proto`"


def _fields(desc: Descriptor) -> dict[str, int]:
    return {f.name: f.number for f in desc.fields}


@pytest.mark.parametrize(
    ("desc", "expected"),
    [
        (
            tm.TransactionMetadataEntry.DESCRIPTOR,
            {
                "metadata_op": 1,
                "txnid_least_bits": 2,
                "txnid_most_bits": 3,
                "expected_status": 4,
                "new_status": 5,
                "partitions": 6,
                "subscriptions": 7,
                "timeout_ms": 8,
                "start_time": 9,
                "last_modification_time": 10,
                "max_local_txn_id": 11,
                "owner": 12,
            },
        ),
        (tm.Subscription.DESCRIPTOR, {"topic": 1, "subscription": 2}),
        (tm.BatchedTransactionMetadataEntry.DESCRIPTOR, {"transaction_logs": 1}),
        (pa.PendingAckMetadata.DESCRIPTOR, {"ledgerId": 1, "entryId": 2, "ack_set": 3, "batch_size": 4}),
        (
            pa.PendingAckMetadataEntry.DESCRIPTOR,
            {
                "pending_ack_op": 1,
                "ack_type": 2,
                "txnid_least_bits": 3,
                "txnid_most_bits": 4,
                "pending_ack_metadata": 5,
            },
        ),
        (pa.BatchedPendingAckMetadataEntry.DESCRIPTOR, {"pending_ack_logs": 1}),
    ],
)
def test_field_numbers_are_pulsars(desc: Descriptor, expected: dict[str, int]) -> None:
    assert _fields(desc) == expected


def test_enum_values_are_pulsars() -> None:
    assert dict(tm.TxnStatus.items()) == {
        "OPEN": 0,
        "COMMITTING": 1,
        "COMMITTED": 2,
        "ABORTING": 3,
        "ABORTED": 4,
    }
    ops = tm.TransactionMetadataEntry.TransactionMetadataOp
    assert dict(ops.items()) == {"NEW": 0, "ADD_PARTITION": 1, "ADD_SUBSCRIPTION": 2, "UPDATE": 3}
    assert dict(pa.PendingAckOp.items()) == {"ACK": 1, "COMMIT": 2, "ABORT": 3}
    assert dict(pa.CommandAck.AckType.items()) == {"Individual": 0, "Cumulative": 1}


def test_known_wire_bytes() -> None:
    # Hand-computed proto2 encoding: field 1 varint NEW(0), field 2 varint 5, field 3 varint 1.
    entry = tm.TransactionMetadataEntry(
        metadata_op=tm.TransactionMetadataEntry.NEW, txnid_least_bits=5, txnid_most_bits=1
    )
    assert entry.SerializeToString() == bytes([0x08, 0x00, 0x10, 0x05, 0x18, 0x01])
    ack = pa.PendingAckMetadataEntry(pending_ack_op=pa.ACK, txnid_least_bits=7, txnid_most_bits=2)
    assert ack.SerializeToString() == bytes([0x08, 0x01, 0x18, 0x07, 0x20, 0x02])
