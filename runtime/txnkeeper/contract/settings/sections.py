"""Every declared settings section, in the order docs/contracts.md §6 "Settings path" lists them."""

from __future__ import annotations

from txnkeeper.contract.settings.batched_write import BATCHED_WRITE
from txnkeeper.contract.settings.connections import CONNECTIONS, MEMORY
from txnkeeper.contract.settings.interpreter import INTERPRETER
from txnkeeper.contract.settings.offload import OFFLOAD
from txnkeeper.contract.settings.process import PROCESS
from txnkeeper.contract.settings.pulsar import PULSAR
from txnkeeper.contract.settings.schema import Section
from txnkeeper.contract.settings.single_key import SINGLE_KEY
from txnkeeper.contract.settings.tls import TLS
from txnkeeper.contract.settings.topic_policies import TOPIC_POLICIES
from txnkeeper.contract.settings.transactions import TRANSACTIONS

SECTIONS: tuple[Section, ...] = (
    PROCESS,
    CONNECTIONS,
    MEMORY,
    INTERPRETER,
    BATCHED_WRITE,
    SINGLE_KEY,
    TRANSACTIONS,
    PULSAR,
    TLS,
    OFFLOAD,
    TOPIC_POLICIES,
)
