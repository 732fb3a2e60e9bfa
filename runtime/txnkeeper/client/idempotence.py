"""Idempotent sends of a named producer (Pulsar's producer name + sequence id de-duplication).

Why: a plain send whose receipt is lost (connection cut, store killed) leaves the application two bad
choices, send again (maybe twice) or not (maybe never). A named producer numbers its sends; the store
remembers the last sequence id it persisted for the name and answers a send at or below it as a
duplicate without writing. So this class re-sends every unanswered send after a reconnect with the
same sequence id, and the application's send resolves once, with the message's id.

Sequence ids continue from the store's record for the name, learned when the producer opens (a
restarted application keeps its name and so its de-duplication).

A name is exclusive: opening a producer sends SetupAppend(name, a fresh instance token), which fences
every older producer of the name on the store (their sends fail with ``ProducerFencedError``). A
reconnect sends it again as a *resume* of the same instance, which the store refuses once another
instance took the name, and which this class refuses itself when the store's last sequence id is beyond
any it assigned (another producer wrote under the name while the store forgot who held it, e.g. after a
restart). Two producers would otherwise interleave sequence ids and the store would drop one's sends as
the other's duplicates.

When the topic moves to another store pod (placement, contracts §12), a send refused ``NOT_SERVED_HERE``
was not written: it is treated like a lost receipt, and the resume goes to the pod that serves the topic
now (following the redirect), which holds the name's moved de-duplication state, so the re-sent sends
are still written once.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from typing import TYPE_CHECKING

from txnkeeper.client.errors import ClientClosedError, ProducerFencedError, UnsupportedFeatureError
from txnkeeper.client.message import MessageId
from txnkeeper.client.placement import Redirects, is_placement
from txnkeeper.errors import (
    ConnectionClosedError,
    NotServedHereError,
    RequestTimeoutError,
    ServiceError,
    UnavailableError,
)
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.rpc import RpcConnection

if TYPE_CHECKING:
    from txnkeeper.client.placement import StoreRouter
    from txnkeeper.protocol.pool import ConnectionPool

log = logging.getLogger(__name__)

RESEND_BACKOFF = (0.05, 1.0)  # seconds: first retry, cap
_DOUBTFUL = (ConnectionClosedError, RequestTimeoutError, UnavailableError)
# What a duplicate resolves to when the store no longer knows the original message's id (Pulsar's
# client does the same: the send is known to be persisted, its position is not).
UNKNOWN_MESSAGE_ID = MessageId(-1, -1)


class SequencedSends:
    """Sends of producer ``producer_name`` to ``topic``, each with the next sequence id."""

    def __init__(
        self,
        connections: ConnectionPool,
        topic: str,
        router: StoreRouter,
        producer_name: str,
        *,
        resend_timeout: float,
    ) -> None:
        self._connections = connections
        self.topic = topic
        self._router = router
        self.producer_name = producer_name
        self._resend_timeout = resend_timeout
        self.last_sequence_id = -1  # the last sequence id assigned (they start at 0)
        self._unanswered: OrderedDict[int, tuple[api.Command, asyncio.Future[MessageId]]] = OrderedDict()
        self._conn: RpcConnection | None = None
        self._session = 0
        self._resending: asyncio.Task[None] | None = None
        self._doubt_since: float | None = None  # when the oldest unanswered doubt began
        self._failure: ServiceError | None = None
        self._instance = uuid.uuid4().hex  # this producer's token: its reconnects resume it
        # After a resume, the sequence id of the store's last send when that is one of our unanswered
        # sends: sent alone, the others wait for its answer (``_resend``).
        self._probe: int | None = None

    @property
    def store_address(self) -> str:
        return self._router.address(self.topic)

    async def open(self) -> None:
        """Take the name on the store (fencing older producers of it) and continue after its last
        persisted sequence id (-1: none)."""

        async def setup(address: str) -> tuple[RpcConnection, int]:
            conn = await self._connections.get(address)
            return conn, await self._setup(conn, resume=False)

        conn, self.last_sequence_id = await self._router.at_owner(
            self.topic, setup, f"producer {self.producer_name!r} of {self.topic}"
        )
        self._use(conn)

    async def _setup(self, conn: RpcConnection, *, resume: bool) -> int:
        """SetupAppend of the name on ``conn`` (the connection the sends then use): the store's last
        sequence id for the name."""
        command = api.Command()
        setup = command.setup_append
        setup.topic = self.topic
        setup.writer_id = self.producer_name
        setup.producer_session = self._instance
        setup.resume = resume
        try:
            response = await conn.request(command, self._resend_timeout)
        except ServiceError as exc:
            if exc.code == api.UNSUPPORTED_FEATURE or "is not a request a server accepts" in str(exc):
                raise UnsupportedFeatureError(
                    f"producer {self.producer_name!r}: the store at {self.store_address} cannot say the "
                    f"name's last sequence id ({exc}); idempotent producers need single-key transactions"
                    " enabled on the store (--srk-enabled); leave producer_name out for a plain producer",
                    api.UNSUPPORTED_FEATURE,
                ) from exc
            if exc.code == api.WRITER_FENCED:
                raise self._fenced(exc) from exc
            raise
        return response.append_setup.last_event_number

    def _fenced(self, cause: ServiceError) -> ProducerFencedError:
        return ProducerFencedError(
            f"producer {self.producer_name!r} of {self.topic}: fenced by a newer producer with the same"
            f" name ({cause}); its later sends are refused: close it",
            api.WRITER_FENCED,
        )

    def send(self, payload: bytes, key: str) -> asyncio.Future[MessageId]:
        if self._failure is not None:
            raise self._failure
        self.last_sequence_id += 1
        sequence_id = self.last_sequence_id
        command = api.Command()
        body = command.produce
        body.topic = self.topic
        body.payload = payload
        body.key = key
        body.producer_name = self.producer_name
        body.sequence_id = sequence_id
        result: asyncio.Future[MessageId] = asyncio.get_running_loop().create_future()
        self._unanswered[sequence_id] = (command, result)
        conn = self._conn
        if self._probe is not None:
            pass  # sent in order with the sends held back once the probe was answered (_answered)
        elif self._resending is None and conn is not None and conn.is_open:
            self._send(conn, sequence_id, command)
        else:
            self._start_resend()
        return result

    def _use(self, conn: RpcConnection) -> None:
        self._conn = conn
        self._session += 1
        conn.closed.add_done_callback(lambda _: self._lost(conn))

    def _send(self, conn: RpcConnection, sequence_id: int, command: api.Command) -> None:
        session = self._session
        conn.request(command, self._resend_timeout).add_done_callback(
            lambda response: self._answered(session, sequence_id, response)
        )

    def _answered(self, session: int, sequence_id: int, response: asyncio.Future[api.Command]) -> None:
        failure = asyncio.CancelledError() if response.cancelled() else response.exception()
        if session != self._session or sequence_id not in self._unanswered:
            return  # sent again on a newer session; that answer counts
        if isinstance(failure, _DOUBTFUL) or is_placement(failure):
            # Refused by a pod that does not serve the topic (now): not written; resumed at the owner.
            self._start_resend()
            return
        probe = self._probe == sequence_id
        if probe:
            self._probe = None
            if failure is not None:
                # Not ours (WRITER_FENCED), or the store could not tell: none of the sends held back
                # can be answered as written, nor sent again (they would be taken for duplicates).
                if not isinstance(failure, ServiceError):
                    failure = ServiceError(f"producer {self.producer_name!r} of {self.topic}: {failure!r}")
                self._fail(self._fenced(failure) if failure.code == api.WRITER_FENCED else failure)
                return
        _, result = self._unanswered.pop(sequence_id)
        self._doubt_since = None
        if probe and self._conn is not None and self._conn.is_open:
            self._send_unanswered(self._conn)
        if isinstance(failure, ServiceError) and failure.code == api.WRITER_FENCED:
            # Refused before it was written; the sends still unanswered get their own answers (one
            # queued before the newer producer opened is written and answered as usual).
            failure = self._fenced(failure)
            if self._failure is None:
                self._failure = failure
        if failure is not None:
            result.set_exception(failure)
            result.exception()
            return
        receipt = response.result().produce_receipt
        if receipt.HasField("message_id"):
            message_id = MessageId.from_pb(receipt.message_id)
        else:
            message_id = UNKNOWN_MESSAGE_ID
        if not result.done():
            result.set_result(message_id)

    def _lost(self, conn: RpcConnection) -> None:
        if conn is self._conn:
            self._conn = None
            if self._unanswered and self._failure is None:
                self._start_resend()
            elif self._unanswered and isinstance(self._failure, ProducerFencedError):
                # A fenced producer does not reconnect, so these will get no answer.
                self._fail(
                    ConnectionClosedError(
                        f"producer {self.producer_name!r} of {self.topic} was fenced and its connection"
                        " closed before these sends were answered: their outcome is unknown"
                    )
                )

    def _start_resend(self) -> None:
        if self._resending is None and self._failure is None:
            self._conn = None
            self._probe = None  # the next resume decides again
            self._session += 1
            self._resending = asyncio.get_running_loop().create_task(self._resend())

    async def _resend(self) -> None:
        if self._doubt_since is None:
            self._doubt_since = time.monotonic()
        deadline = self._doubt_since + self._resend_timeout
        delay = RESEND_BACKOFF[0]
        redirects = Redirects(f"producer {self.producer_name!r} of {self.topic}", self._resend_timeout)
        while True:
            try:
                if time.monotonic() > deadline:
                    raise RequestTimeoutError("its sends got no answer in time")
                conn = await self._connections.get(self.store_address)
                # Resume the name on the new connection before re-sending (the store refuses a
                # Produce of a name without a session of it there).
                persisted = await self._setup(conn, resume=True)
                break
            except NotServedHereError as exc:
                try:
                    if not is_placement(exc):
                        raise
                    owner = await redirects.after(exc)
                except ServiceError as final:
                    self._resending = None
                    self._fail(final)
                    return
                if owner is not None:
                    self._router.moved(self.topic, owner)
            except _DOUBTFUL as exc:
                if time.monotonic() + delay > deadline:
                    self._resending = None
                    self._fail(
                        RequestTimeoutError(
                            f"producer {self.producer_name} of {self.topic}: no answer from "
                            f"{self.store_address} within {self._resend_timeout}s ({exc}); the outcome "
                            "of its unanswered sends is unknown (a producer with the same name sending "
                            "them again writes each at most once)"
                        )
                    )
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, RESEND_BACKOFF[1])
            except ServiceError as exc:  # fenced, or the store refuses named producers now
                self._resending = None
                self._fail(exc)
                return
        if persisted > self.last_sequence_id:
            self._resending = None
            self._fail(
                ProducerFencedError(
                    f"producer {self.producer_name!r} of {self.topic}: the store holds sequence id "
                    f"{persisted} for the name, beyond {self.last_sequence_id}, the last this producer "
                    "assigned: another producer with the same name wrote since; this one is fenced "
                    "and the outcome of its unanswered sends is unknown (read the topic): close it",
                    api.WRITER_FENCED,
                )
            )
            return
        self._resending = None
        self._use(conn)
        if persisted in self._unanswered:
            # The store's last send has the sequence id of one of ours it never answered. Ours, if
            # the store holds our message there (it compares, and refuses WRITER_FENCED otherwise);
            # else another producer of the name wrote it while the store forgot who held the name
            # (a restart), and our sends at or below it would all be taken for its duplicates. So
            # that one goes alone first; the rest follow once it was answered as ours (``_answered``).
            self._probe = persisted
            self._send(conn, persisted, self._unanswered[persisted][0])
            return
        self._send_unanswered(conn)

    def _send_unanswered(self, conn: RpcConnection) -> None:
        # In sequence order, with their original sequence ids: the store de-duplicates those it holds.
        for sequence_id, (command, _) in list(self._unanswered.items()):
            self._send(conn, sequence_id, command)
        log.info("producer %s of %s: re-sent %d sends", self.producer_name, self.topic, len(self._unanswered))

    def _fail(self, failure: ServiceError) -> None:
        if self._failure is None:
            self._failure = failure
        unanswered, self._unanswered = self._unanswered, OrderedDict()
        for _, result in unanswered.values():
            if not result.done():
                result.set_exception(failure)
                result.exception()

    async def drained(self) -> None:
        if self._unanswered:
            await asyncio.wait([result for _, result in self._unanswered.values()])

    async def close(self) -> None:
        if self._failure is None:
            self._failure = ClientClosedError(f"producer {self.producer_name} of {self.topic} is closed")
        if self._resending is not None:
            self._resending.cancel()
        self._fail(self._failure)
