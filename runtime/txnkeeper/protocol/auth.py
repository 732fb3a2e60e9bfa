"""The cluster secret and what is derived from it: owner tokens, tickets, coordinator proofs.

Why: stores and coordinators trust each other, clients are trusted with nothing. A secret shared by
coordinator and store pods (never sent on the wire) lets a coordinator prove itself to a store
(challenge-response), lets a store check that a coordinator registered a (txn, topic[, subscription])
before it accepts a transactional produce or ack (a ticket: HMAC over those and the txn's deadline),
and lets a coordinator check that an EndTxn or AddToTxn comes from the client that began the txn (the
owner token returned by NewTxn, an HMAC of the txn id: stateless, so it survives client reconnects and
coordinator restarts). Every derivation has its own label so one can never stand in for another.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import struct
from pathlib import Path

from txnkeeper.errors import ServiceError
from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.secretfile import SecretFileError, read_secret_file
from txnkeeper.txnid import TxnID

SECRET_ENV = "TXNKEEPER_CLUSTER_SECRET_FILE"
SECRET_FLAG = "--cluster-secret-file"
MIN_SECRET_BYTES = 16
NONCE_BYTES = 32
# A store accepts a ticket this long past its deadline (clock skew between coordinator and store pods);
# a txn ended on a topic the store does not hold stays fenced out of it until deadline + 2 * grace.
TICKET_GRACE_MS = 10_000
_U64 = struct.Struct(">QQ")
_LEN = struct.Struct(">I")
# What _mac(b"owner", <txn id>) hashes before the id: computed at every begin and every end, so the
# owner token hashes this prefix and the id in one update (the same bytes, fewer calls).
_OWNER_PREFIX = b"owner" + _LEN.pack(_U64.size)
# A ticket's MAC input around its topic and subscription: label, length-prefixed txn id, the topic's
# length; then the deadline's length and the deadline.
_TICKET_HEAD = struct.Struct(">6sIQQI")
_TICKET_TAIL = struct.Struct(">IQ")
_SHA256_BLOCK = 64


class UnauthorizedError(ServiceError):
    code = api.UNAUTHORIZED


class ClusterSecretError(ValueError):
    """The cluster secret file is missing, unreadable or too short (the message names it)."""


def load_cluster_secret(path: str | os.PathLike[str] | None) -> ClusterSecret | None:
    """The secret from ``path`` (the flag or ``TXNKEEPER_CLUSTER_SECRET_FILE``); None if neither given."""
    if path is None or str(path) == "":
        return None
    file = Path(path)
    try:
        raw = read_secret_file(file, "cluster secret")
    except SecretFileError as exc:
        raise ClusterSecretError(str(exc)) from exc
    if len(raw) < MIN_SECRET_BYTES:
        raise ClusterSecretError(
            f"cluster secret file {file} holds {len(raw)} bytes; it needs at least {MIN_SECRET_BYTES}"
            " (create one with: (umask 077; head -c 32 /dev/urandom | base64 > FILE))"
        )
    return ClusterSecret(raw)


def not_configured(what: str) -> UnauthorizedError:
    return UnauthorizedError(
        f"{what} needs a cluster secret shared by coordinator and store pods; start this pod with"
        f" {SECRET_FLAG} FILE (or {SECRET_ENV})"
    )


def _ticket_use(topic: str, subscription: str) -> str:
    """What a ticket was presented for, as refusals name it."""
    if subscription:
        return f"transactional ack on {topic}/{subscription}"
    return f"transactional produce to {topic}"


class ClusterSecret:
    __slots__ = ("_inner", "_key", "_outer")

    def __init__(self, key: bytes) -> None:
        self._key = key
        # HMAC-SHA256 (RFC 2104) with the key's padded inner and outer hash states computed once:
        # every transactional request checks a ticket or owner token, and hmac.new redoes the key
        # schedule each time (about a third of the cost). Same bytes as hmac.new(key, msg, sha256).
        block = hashlib.sha256(key).digest() if len(key) > _SHA256_BLOCK else key
        block = block.ljust(_SHA256_BLOCK, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in block))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in block))

    @property
    def key(self) -> bytes:
        return self._key

    def _mac(self, label: bytes, *parts: bytes) -> bytes:
        inner = self._inner.copy()
        inner.update(label)
        for part in parts:
            # length-prefixed: ("ab", "c") and ("a", "bc") must differ
            inner.update(_LEN.pack(len(part)))
            inner.update(part)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()

    # --- owner tokens (coordinator only) -----------------------------------------------------------
    def owner_token(self, txn_id: TxnID) -> bytes:
        """``_mac(b"owner", <most, least as two big-endian u64>)``, in one update."""
        inner = self._inner.copy()
        inner.update(_OWNER_PREFIX + _U64.pack(txn_id.most, txn_id.least))
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()

    def check_owner(self, txn_id: TxnID, token: bytes, what: str) -> None:
        if not token:
            raise UnauthorizedError(
                f"{what} of transaction {txn_id} carries no owner token: only the client that began it"
                " (with the token NewTxn returned) may extend or end it"
            )
        if not hmac.compare_digest(token, self.owner_token(txn_id)):
            raise UnauthorizedError(f"{what}: the owner token is not transaction {txn_id}'s")

    # --- tickets -----------------------------------------------------------------------------------
    def _ticket_mac(self, txn_id: TxnID, topic: str, subscription: str, deadline_ms: int) -> bytes:
        # _mac(b"ticket", txn id, topic, subscription, deadline) hashed as one buffer: the same bytes
        # (label, then each part length-prefixed) in one update instead of nine, on every
        # transactional produce and ack.
        topic_bytes = topic.encode()
        subscription_bytes = subscription.encode()
        inner = self._inner.copy()
        inner.update(
            b"".join(
                (
                    _TICKET_HEAD.pack(b"ticket", _U64.size, txn_id.most, txn_id.least, len(topic_bytes)),
                    topic_bytes,
                    _LEN.pack(len(subscription_bytes)),
                    subscription_bytes,
                    _TICKET_TAIL.pack(_TICKET_TAIL.size - _LEN.size, deadline_ms),
                )
            )
        )
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()

    def fill_ticket(
        self, ticket: api.TxnTicket, txn_id: TxnID, topic: str, subscription: str, deadline_ms: int
    ) -> None:
        ticket.topic = topic
        ticket.subscription = subscription
        ticket.deadline_ms = deadline_ms
        ticket.mac = self._ticket_mac(txn_id, topic, subscription, deadline_ms)

    def check_ticket(
        self, ticket: api.TxnTicket, txn_id: TxnID, topic: str, subscription: str, now_ms: int
    ) -> None:
        """Refuse unless ``ticket`` is the coordinator's for exactly this txn, topic and subscription
        and the txn's deadline (plus the skew grace) has not passed on this pod's clock."""
        # Every transactional produce and ack passes here: the refusal's wording is built only when
        # refusing (two f-strings per accepted request were a measurable share of a store's CPU).
        mac = ticket.mac
        if not mac:
            raise UnauthorizedError(
                f"{_ticket_use(topic, subscription)} in transaction {txn_id} carries no ticket: register"
                " it with the coordinator (AddToTxn) and pass the ticket it returns"
            )
        if ticket.topic != topic or ticket.subscription != subscription:
            raise UnauthorizedError(
                f"{_ticket_use(topic, subscription)}: the ticket is for"
                f" {ticket.topic!r}/{ticket.subscription!r}, not this one"
            )
        deadline_ms = ticket.deadline_ms
        if not hmac.compare_digest(mac, self._ticket_mac(txn_id, topic, subscription, deadline_ms)):
            raise UnauthorizedError(
                f"{_ticket_use(topic, subscription)}: the ticket was not issued for transaction {txn_id}"
            )
        if now_ms > deadline_ms + TICKET_GRACE_MS:
            raise UnauthorizedError(
                f"{_ticket_use(topic, subscription)}: transaction {txn_id} passed its timeout deadline;"
                " it is being aborted"
            )

    # --- coordinator -> store handshake ------------------------------------------------------------
    @staticmethod
    def new_nonce() -> bytes:
        return secrets.token_bytes(NONCE_BYTES)

    def coordinator_proof(self, nonce: bytes) -> bytes:
        return self._mac(b"coordinator", nonce)

    def check_coordinator_proof(self, nonce: bytes, proof: bytes) -> bool:
        return bool(nonce) and hmac.compare_digest(proof, self.coordinator_proof(nonce))
