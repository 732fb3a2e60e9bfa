"""The store pod's edge for single-routing-key blocks (PDP-44): sessions, chunks, fencing, budget.

Why a module of its own: a block arrives as SetupAppend, any number of unanswered AppendBlock chunks and
an AppendBlockEnd, so unlike every other command it holds per-connection state (the open block's
chunks) between requests. Those bytes count against the server's --max-pending-bytes budget, like
incomplete frames, so clients cannot grow a pod without bound; they are released when the block ends,
is aborted, is refused, is fenced or its connection closes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from txnkeeper.errors import BadRequestError, ServiceError
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.blocks import BlockEncodingError, decode_events
from txnkeeper.protocol.limits import ServerStats
from txnkeeper.protocol.server import Session
from txnkeeper.server.client_auth import ClientPrincipals
from txnkeeper.topic.partition import BlockResult, Partition
from txnkeeper.topic.service import TopicService
from txnkeeper.topic.writers import (
    BadBlockError,
    BlockTooLargeError,
    UnsupportedFeatureError,
    validate_writer_id,
    writer_key,
)


class ResourceLimitError(ServiceError):
    code = api.RESOURCE_LIMIT


@dataclass
class PendingBudget:
    """The protocol server's pending-bytes figure and its limit, shared with incomplete frames."""

    stats: ServerStats
    limit: int


# Sessions one connection may hold whose writer never wrote. Sessions hold no writer slot (a writer
# takes one at its first write), so this bounds only their memory: at most this many per connection,
# forgotten when the connection closes. A client opening more writers at once than this before any
# of them writes is refused RESOURCE_LIMIT until some of them wrote.
MAX_UNWRITTEN_SESSIONS_PER_CONNECTION = 256


@dataclass(slots=True)
class WriterSession:
    """One SetupAppend on one connection, with the chunks of its open block."""

    topic: str
    partition: Partition
    epoch: int
    owner: str = ""  # a named producer's instance token ("" for a single-key writer)
    key: str = ""  # the writer table's key (writers.writer_key: the id, qualified by the principal)
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0


class BlockAppender:
    """Answers SetupAppend, AppendBlock, AppendBlockEnd and AbortAppendBlock for one store pod."""

    def __init__(
        self,
        store: Callable[[], TopicService],
        budget: PendingBudget | None = None,
        principals: ClientPrincipals | None = None,
    ) -> None:
        self._store = store
        self.budget = budget
        # Writer ids and producer names are the connection's principal's (writers.writer_key).
        self._principals = principals or ClientPrincipals(None)
        self._sessions: dict[int, dict[str, WriterSession]] = {}
        # connection -> the writer ids of its sessions whose writer had not written when last looked at
        self._unwritten: dict[int, set[str]] = {}
        self._setting_up: Counter[int] = Counter()  # connection -> its SetupAppends being answered

    def _enabled(self, what: str) -> TopicService:
        topics = self._store()
        if not topics.single_key.enabled:
            raise UnsupportedFeatureError(
                f"{what}: single-routing-key transactions are disabled on this store; enable them with"
                " singleKeyTransactions.enabled (serve --srk-enabled)"
            )
        return topics

    def _release(self, writer: WriterSession) -> None:
        if self.budget is not None:
            self.budget.stats.pending_bytes -= writer.size
        writer.chunks = []
        writer.size = 0

    def _writer(self, session: Session, writer_id: str) -> WriterSession:
        writer = self._sessions.get(session.session_id, {}).get(writer_id)
        if writer is None:
            raise BadRequestError(
                f"writer {writer_id!r} has no SetupAppend on this connection; send one first"
            )
        try:
            writer.partition.writers.check_epoch(writer.key, writer.epoch)
        except ServiceError:  # fenced or expired: every later command of this session says so too
            self._release(writer)
            raise
        return writer

    async def setup_append(self, session: Session, command: api.Command) -> api.Command:
        body = command.setup_append
        topics = self._enabled("SetupAppend")
        validate_writer_id(body.writer_id)
        if body.producer_session:
            validate_writer_id(body.producer_session, "producer_session")
        elif body.resume:
            raise BadRequestError(
                "SetupAppend with resume needs the producer_session it resumes (resume is for named"
                " producers reconnecting); a single-key writer sends neither"
            )
        key = writer_key(self._principals.principal(session, "SetupAppend"), body.writer_id)
        sid = session.session_id
        self._check_unwritten(session, topics, body.topic, body.writer_id, key)
        self._setting_up[sid] += 1  # counted against the limit until registered (or refused)
        try:
            return await self._open(session, topics, body, key)
        finally:
            self._setting_up[sid] -= 1
            if not self._setting_up[sid]:
                del self._setting_up[sid]

    async def _open(
        self, session: Session, topics: TopicService, body: api.SetupAppend, key: str
    ) -> api.Command:
        partition = await topics.partition(body.topic)
        await topics.register_topic(body.topic)
        # Writers and named producers alike: the answer counts what older sessions of the id had
        # queued, and their writes not queued yet are refused (Partition.open_session).
        epoch, last = await partition.open_session(key, body.producer_session, body.resume)
        # The answer is complete before the session is registered on the connection: a SetupAppend
        # that fails leaves no session a later Produce or block could use.
        answer = api.Command()
        setup = answer.append_setup
        setup.topic = body.topic
        setup.writer_id = body.writer_id
        setup.last_event_number = last
        if not session.is_open:  # closed while the older sessions' writes settled: nothing to hold
            partition.writers.end_session(key, epoch)
            return answer
        writers = self._sessions.setdefault(session.session_id, {})
        old = writers.get(body.writer_id)
        if old is not None:
            self._end(old)
        writers[body.writer_id] = WriterSession(body.topic, partition, epoch, body.producer_session, key)
        if not partition.writers.has_written(key):
            self._unwritten.setdefault(session.session_id, set()).add(body.writer_id)
        return answer

    def _check_unwritten(
        self, session: Session, topics: TopicService, topic: str, writer_id: str, key: str
    ) -> None:
        """Refuse a session beyond MAX_UNWRITTEN_SESSIONS_PER_CONNECTION whose writer never wrote
        (SetupAppends still being answered count too), before anything (a topic, a session) is
        created for it."""
        sid = session.session_id
        unwritten = self._unwritten.get(sid, set())
        if len(unwritten) + self._setting_up[sid] < MAX_UNWRITTEN_SESSIONS_PER_CONNECTION:
            return
        writers = self._sessions.get(sid, {})
        for held in list(unwritten):
            writer = writers.get(held)
            # Gone, written since, or fenced by a newer session (which holds the id's state now):
            # none of these holds memory for a session that never wrote any more.
            if (
                writer is None
                or writer.partition.writers.has_written(writer.key)
                or not writer.partition.writers.is_current(writer.key, writer.epoch)
            ):
                unwritten.discard(held)
        held_now = len(unwritten) + self._setting_up[sid]
        if held_now < MAX_UNWRITTEN_SESSIONS_PER_CONNECTION or writer_id in unwritten:
            return
        partition = topics.partitions().get(topic)
        if partition is not None and partition.writers.has_written(key):
            return
        raise ResourceLimitError(
            f"this connection holds {held_now} writer sessions that never wrote (or are being set up),"
            f" the limit per connection ({MAX_UNWRITTEN_SESSIONS_PER_CONNECTION}); writer {writer_id!r}"
            " was not set up: write with the sessions already set up (or close them) first"
        )

    def _end(self, writer: WriterSession) -> None:
        """Drop a session of this connection (replaced, or its connection closed)."""
        self._release(writer)
        writer.partition.writers.end_session(writer.key, writer.epoch)

    def producer_session(self, session: Session, topic: str, producer_name: str) -> tuple[str, int]:
        """The writer-table key and epoch of this connection's session of producer ``producer_name``
        on ``topic``, for its Produce to carry: the partition refuses the send once a newer session
        took the name."""
        writer = self._sessions.get(session.session_id, {}).get(producer_name)
        if writer is None or writer.topic != topic or not writer.owner:
            self._enabled("Produce with producer_name (an idempotent producer)")
            raise BadRequestError(
                f"producer {producer_name!r} has no SetupAppend for topic {topic!r} on this connection:"
                " send SetupAppend(topic, writer_id = producer name, producer_session) first; it answers"
                " the name's last sequence id and fences older producers of the name"
            )
        writers = writer.partition.writers
        if not writers.has_session(writer.key):
            # The name's state expired while this connection idled and no other producer took it
            # since (that would have opened a session): this one still holds the name.
            writer.epoch, _ = writers.setup(writer.key, owner=writer.owner, resume=True)
        return writer.key, writer.epoch

    def append_block(self, session: Session, command: api.Command) -> None:
        body = command.append_block
        topics = self._enabled("AppendBlock")
        writer = self._writer(session, body.writer_id)
        size = len(body.data)
        limit = topics.single_key.max_block_bytes
        if writer.size + size > limit:
            held = writer.size
            self._release(writer)
            raise BlockTooLargeError(
                f"block of writer {body.writer_id!r} would hold {held + size} bytes, over maxBlockBytes"
                f" {limit}; the block was dropped: split it into smaller blocks"
            )
        budget = self.budget
        if budget is not None and budget.stats.pending_bytes + size > budget.limit:
            would = budget.stats.pending_bytes + size
            self._release(writer)
            raise ResourceLimitError(
                f"buffered blocks and incomplete frames would hold {would}"
                f" bytes, over this server's limit of {budget.limit} (max pending bytes); the block of"
                f" writer {body.writer_id!r} was dropped: retry it later"
            )
        writer.chunks.append(body.data)
        writer.size += size
        if budget is not None:
            budget.stats.pending_bytes += size

    def append_block_end(self, session: Session, command: api.Command) -> Coroutine[Any, Any, api.Command]:
        body = command.append_block_end
        self._enabled("AppendBlockEnd")
        writer = self._writer(session, body.writer_id)
        data = b"".join(writer.chunks)
        self._release(writer)
        if body.event_count == 0:
            raise BadRequestError("a block must hold at least one event (event_count 0)")
        try:
            events = decode_events(data, body.event_count, body.total_bytes, body.crc)
        except BlockEncodingError as exc:
            raise BadBlockError(f"block of writer {body.writer_id!r}: {exc}") from exc
        return self._apply(writer, body, events, len(data))

    @staticmethod
    async def _apply(
        writer: WriterSession, body: api.AppendBlockEnd, events: list[bytes], size: int
    ) -> api.Command:
        writer_id, first = body.writer_id, body.first_event_number
        result: BlockResult = await writer.partition.append_block(
            writer.key, first, events, body.key, size, epoch=writer.epoch
        )
        answer = api.Command()
        appended = answer.data_appended
        appended.writer_id = writer_id
        appended.event_number = first + len(events) - 1
        appended.previous_event_number = result.previous
        appended.duplicate = result.duplicate
        if result.first_message_id is not None:
            appended.first_message_id.ledger_id = result.first_message_id.ledger_id
            appended.first_message_id.entry_id = result.first_message_id.entry_id
        return answer

    def abort_append_block(self, session: Session, command: api.Command) -> api.Command:
        writer = self._writer(session, command.abort_append_block.writer_id)
        self._release(writer)
        answer = api.Command()
        answer.success.SetInParent()
        return answer

    def session_closed(self, session: Session) -> None:
        self._unwritten.pop(session.session_id, None)
        for writer in self._sessions.pop(session.session_id, {}).values():
            self._end(writer)
