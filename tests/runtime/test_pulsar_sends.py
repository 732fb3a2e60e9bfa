"""Receipts of a Pulsar producer go out in the order of its sends (server/pulsar_sends.py): Pulsar's
producers match each receipt with their oldest pending send, so a later send whose write completes
first waits for the earlier ones. Pure logic; a recording session stands in for the connection."""

from __future__ import annotations

from txnkeeper.errors import UnavailableError
from txnkeeper.ledger.position import Position
from txnkeeper.pb import PulsarApi_pb2 as pulsar
from txnkeeper.protocol.pulsar_frames import PulsarFrameDecoder
from txnkeeper.server.pulsar_sends import Producer, Send, written


class RecordingSession:
    session_id = 1
    peer_host = "127.0.0.1"
    is_open = True

    def __init__(self) -> None:
        self.frames: list[pulsar.BaseCommand] = []
        self._decoder = PulsarFrameDecoder()
        self.request_bytes = 0

    def request_began(self, size: int) -> None:
        self.request_bytes += size

    def request_ended(self, size: int) -> None:
        self.request_bytes -= size

    def send_frame(self, frame: bytes) -> None:
        self.frames.extend(f.command for f in self._decoder.feed(frame))

    def push_frame(self, frame: bytes) -> None:
        self.send_frame(frame)

    def ready_for_push(self) -> bool:
        return True

    def close_for_protocol(self, message: str) -> None:
        raise AssertionError(message)


def test_a_later_write_that_completes_first_waits_for_the_earlier_ones() -> None:
    session = RecordingSession()
    producer = Producer(session, 7, "persistent://t/n/x", "p")
    sends = [Send(sequence_id, sequence_id, 100) for sequence_id in (10, 11, 12)]
    producer.sends.extend(sends)
    for send in sends:
        session.request_began(send.size)
    written(producer, sends[2], Position(1, 2), None)
    written(producer, sends[1], None, UnavailableError("the write failed"))
    assert session.frames == []  # the oldest send is not written yet
    assert session.request_bytes == 300  # nor answered: all three still count against the budget
    written(producer, sends[0], Position(1, 0), None)
    kinds = [(f.type, f.send_receipt.sequence_id or f.send_error.sequence_id) for f in session.frames]
    assert kinds == [
        (pulsar.BaseCommand.SEND_RECEIPT, 10),
        (pulsar.BaseCommand.SEND_ERROR, 11),
        (pulsar.BaseCommand.SEND_RECEIPT, 12),
    ]
    assert session.frames[0].send_receipt.message_id.entryId == 0
    assert session.frames[1].send_error.error == pulsar.ServiceNotReady
    assert session.frames[2].send_receipt.message_id.entryId == 2
    assert not producer.sends
    assert session.request_bytes == 0
