"""The cluster secret's MACs are plain HMAC-SHA256 over length-prefixed parts.

ClusterSecret precomputes the key's inner and outer hash states (a hot path: every transactional
request checks one); these tests pin its output to the standard library's HMAC for every key length
class (shorter than, equal to and longer than the SHA-256 block), so tokens and tickets issued by a
pod running an older release stay valid.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

import pytest

from txnkeeper.pb import txnkeeper_api_pb2 as api
from txnkeeper.protocol.auth import TICKET_GRACE_MS, ClusterSecret, UnauthorizedError
from txnkeeper.txnid import TxnID


def reference_mac(key: bytes, label: bytes, *parts: bytes) -> bytes:
    mac = hmac.new(key, label, hashlib.sha256)
    for part in parts:
        mac.update(struct.pack(">I", len(part)))
        mac.update(part)
    return mac.digest()


@pytest.mark.parametrize("key_len", [16, 44, 63, 64, 65, 200])
def test_owner_tokens_and_tickets_equal_the_standard_hmac(key_len: int) -> None:
    key = bytes(range(256))[:key_len]
    secret = ClusterSecret(key)
    txn = TxnID(3, 77)
    ids = struct.pack(">QQ", 3, 77)
    assert secret.owner_token(txn) == reference_mac(key, b"owner", ids)
    assert secret.coordinator_proof(b"nonce") == reference_mac(key, b"coordinator", b"nonce")
    expected = reference_mac(key, b"ticket", ids, b"t", b"s", struct.pack(">Q", 123))
    assert secret._ticket_mac(txn, "t", "s", 123) == expected
    # fill_ticket hashes the same parts in one update: the same MAC, which check_ticket accepts.
    for topic, subscription in (("t", "s"), ("persistent://tenant/ns/tópico", ""), ("", "")):
        ticket = api.TxnTicket()
        secret.fill_ticket(ticket, txn, topic, subscription, 2**40 + 5)
        assert ticket.mac == secret._ticket_mac(txn, topic, subscription, 2**40 + 5)
        secret.check_ticket(ticket, txn, topic, subscription, now_ms=2**40)
    # The same secret gives the same answer twice (the precomputed states are copied, never reused).
    assert secret.owner_token(txn) == secret.owner_token(txn)


def test_a_token_from_another_secret_is_refused() -> None:
    txn = TxnID(0, 1)
    token = ClusterSecret(b"a" * 32).owner_token(txn)
    ClusterSecret(b"a" * 32).check_owner(txn, token, "end-txn")
    with pytest.raises(UnauthorizedError, match="owner token is not"):
        ClusterSecret(b"b" * 32).check_owner(txn, token, "end-txn")


def test_ticket_refusals_name_the_request_and_what_was_wrong() -> None:
    secret = ClusterSecret(b"k" * 32)
    txn = TxnID(0, 9)
    ticket = api.TxnTicket()
    secret.fill_ticket(ticket, txn, "t", "s", 1_000)
    secret.check_ticket(ticket, txn, "t", "s", 1_000)  # accepted
    refusals = [
        (api.TxnTicket(), "t", "s", 0, "transactional ack on t/s in transaction (0,9) carries no ticket:"),
        (ticket, "t", "", 0, "transactional produce to t: the ticket is for 't'/'s', not this one"),
        (ticket, "u", "s", 0, "transactional ack on u/s: the ticket is for 't'/'s', not this one"),
        (
            api.TxnTicket(topic="t", subscription="s", deadline_ms=1_000, mac=b"x" * 32),
            "t",
            "s",
            0,
            "transactional ack on t/s: the ticket was not issued for transaction (0,9)",
        ),
        (ticket, "t", "s", 1_000 + TICKET_GRACE_MS + 1, "transaction (0,9) passed its timeout deadline"),
    ]
    for presented, topic, subscription, now_ms, message in refusals:
        with pytest.raises(UnauthorizedError) as refused:
            secret.check_ticket(presented, txn, topic, subscription, now_ms)
        assert message in str(refused.value)
