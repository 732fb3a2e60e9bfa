"""An in-process store speaking the single-key append frames over a real socket, with failure knobs.

Why a fake next to the real pods: the writer's reconnect decisions (applied vs re-send, state lost,
fenced, an old release) must each be produced exactly and repeatably; the fake applies the
protocol's rules (contracts §6, single-key appends) in memory and lets a test drop one answer after
applying, forget a writer's state, or behave like a release without the feature. Everything that
a real store must do (durability, recovery, crash) is tested against real pods in tests/runtime.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

from txnkeeper.errors import BadRequestError, ServiceError
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.server import ProtocolServer, Session

LEDGER = 7


@dataclass
class Writer:
    last_event_number: int = -1  # numbers start at 0 (contracts §10)
    last_first_entry: int = -1
    session: Session | None = None


@dataclass
class FakeStore:
    """The topic's messages as (key, payload, writer or producer, event or sequence number)."""

    messages: list[tuple[str, bytes]] = field(default_factory=list)
    writers: dict[str, Writer] = field(default_factory=dict)
    producers: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (last seq, entry)
    chunks: dict[tuple[int, str], list[bytes]] = field(default_factory=dict)
    drop_next_answers: int = 0  # apply, then close the connection instead of answering
    forget_when_dropping: bool = False  # and lose the writer's state (expiry) before it reconnects
    refuse_next_blocks: int = 0  # refuse blocks as too large, without applying them
    old_release: bool = False  # refuse setup_append as a release without the feature does
    unparsable: bool = False  # drop the connection on setup_append, as a release that cannot parse it
    duplicates_without_ids: bool = False  # answer a duplicate block as a store that lost its first id
    blocks_applied: int = 0
    duplicates: int = 0

    def handle(self, session: Session, body_name: str, command: api.Command) -> api.Command | None:
        if body_name == "setup_append":
            return self._setup(session, command.setup_append)
        if body_name == "append_block":
            self.chunks.setdefault((id(session), command.append_block.writer_id), []).append(
                command.append_block.data
            )
            return api.Command(success=api.Success())
        if body_name == "append_block_end":
            return self._end(session, command.append_block_end)
        if body_name == "produce":
            return self._produce(session, command.produce)
        raise BadRequestError(f"'{body_name}' is not a request a server accepts")

    def _setup(self, session: Session, body: api.SetupAppend) -> api.Command | None:
        if self.old_release:
            raise BadRequestError("'setup_append' is not a request a server accepts")
        if self.unparsable:
            session.close()  # type: ignore[attr-defined]
            return None
        writer = self.writers.setdefault(body.writer_id, Writer())
        writer.session = session  # the newest session fences older ones
        if body.writer_id in self.producers:
            return api.Command(
                append_setup=api.AppendSetup(last_event_number=self.producers[body.writer_id][0])
            )
        return api.Command(append_setup=api.AppendSetup(last_event_number=writer.last_event_number))

    def _end(self, session: Session, body: api.AppendBlockEnd) -> api.Command | None:
        writer = self.writers.setdefault(body.writer_id, Writer(session=session))
        if writer.session is not session:
            raise ServiceError(f"writer {body.writer_id} was fenced by a newer session", api.WRITER_FENCED)
        data = b"".join(self.chunks.pop((id(session), body.writer_id), []))
        if self.refuse_next_blocks > 0:
            self.refuse_next_blocks -= 1
            raise ServiceError(f"block of {body.total_bytes} bytes above maxBlockBytes", api.BLOCK_TOO_LARGE)
        if zlib.crc32(data) != body.crc or len(data) != body.total_bytes:
            raise ServiceError("bad block", api.BAD_BLOCK)
        last = body.first_event_number + body.event_count - 1
        if last <= writer.last_event_number:
            self.duplicates += 1
            known = last == writer.last_event_number and not self.duplicates_without_ids
            return self._answer(session, last, writer.last_first_entry if known else None)
        if body.first_event_number != writer.last_event_number + 1:
            if writer.last_event_number == -1:
                raise ServiceError(f"writer {body.writer_id} is not known here", api.WRITER_STATE_LOST)
            raise ServiceError("gap", api.EVENT_NUMBER_GAP)
        events = []
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack_from(">I", data, offset)
            events.append(data[offset + 4 : offset + 4 + length])
            offset += 4 + length
        assert len(events) == body.event_count
        first_entry = len(self.messages)
        self.messages.extend((body.key, e) for e in events)
        writer.last_event_number = last
        writer.last_first_entry = first_entry
        self.blocks_applied += 1
        return self._answer(session, last, first_entry)

    def _answer(self, session: Session, last: int, first_entry: int | None) -> api.Command | None:
        if self.drop_next_answers > 0:
            self.drop_next_answers -= 1
            if self.forget_when_dropping:
                self.writers.clear()
            session.close()  # type: ignore[attr-defined]
            return None
        answer = api.DataAppended(event_number=last)
        if first_entry is not None:
            answer.first_message_id.CopyFrom(api.MessageIdData(ledger_id=LEDGER, entry_id=first_entry))
        return api.Command(data_appended=answer)

    def _produce(self, session: Session, body: api.Produce) -> api.Command | None:
        if body.producer_name:
            last, entry = self.producers.get(body.producer_name, (-1, -1))
            if body.sequence_id <= last:
                self.duplicates += 1
                receipt = api.ProduceReceipt(duplicate=True)
                if body.sequence_id == last:
                    receipt.message_id.CopyFrom(api.MessageIdData(ledger_id=LEDGER, entry_id=entry))
                return self._receipt(session, api.Command(produce_receipt=receipt))
            self.producers[body.producer_name] = (body.sequence_id, len(self.messages))
        self.messages.append((body.key, body.payload))
        entry = len(self.messages) - 1
        receipt = api.ProduceReceipt(message_id=api.MessageIdData(ledger_id=LEDGER, entry_id=entry))
        return self._receipt(session, api.Command(produce_receipt=receipt))

    def _receipt(self, session: Session, response: api.Command) -> api.Command | None:
        if self.drop_next_answers > 0:
            self.drop_next_answers -= 1
            session.close()  # type: ignore[attr-defined]
            return None
        return response

    def session_closed(self, session: Session) -> None:
        for key in [k for k in self.chunks if k[0] == id(session)]:
            del self.chunks[key]

    def session_holds_state(self, session: Session) -> bool:
        return False

    def session_writable(self, session: Session) -> None:
        pass  # nothing is pushed by the fake store


async def start_fake(store: FakeStore) -> tuple[ProtocolServer, str]:
    server = ProtocolServer(store)
    await server.start("127.0.0.1", 0)
    return server, f"127.0.0.1:{server.port}"
