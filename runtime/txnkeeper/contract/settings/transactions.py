"""Transaction-timeout settings of a coordinator pod, declared once: the CR's and the ``--config``
file's ``transactions`` section, the ``--max-txn-timeout-ms`` serve flag and its env, the CRD's fields.

The section holds one value (``maxTimeoutMs``, the process maximum) and two structures, ``namespaces``
and ``topics`` (name -> ``{"maxTimeoutMs": ms}``; lists of named entries in the CR), whose limits are
each checked by ``ENTRY_MAX_TIMEOUT``. The names and limits are ``contract.coordinator_settings``'.
"""

from __future__ import annotations

from txnkeeper.contract import coordinator_settings as txn
from txnkeeper.contract.settings.schema import Section, Setting

MAX_TIMEOUT = Setting(
    txn.MAX_TIMEOUT_KEY,
    "max_timeout_ms",
    "int",
    txn.DEFAULT_MAX_TIMEOUT_MS,
    f"Longest timeout a begin may ask for (ms); default {txn.DEFAULT_MAX_TIMEOUT_MS} (15 minutes, Kafka's "
    f"transaction.max.timeout.ms), at most {txn.HARD_MAX_TIMEOUT_MS} (a day).",
    flag="--max-txn-timeout-ms",
    env="MAX_TXN_TIMEOUT_MS",
    minimum=1,
    maximum=txn.HARD_MAX_TIMEOUT_MS,
    unit="ms",
    # A CR without it renders no key, and pods use their own default (the CEL rules compare with it).
    cr_default=False,
    flag_help=f"longest transaction timeout a begin may ask for (config {txn.TRANSACTIONS_SECTION}."
    f"{txn.MAX_TIMEOUT_KEY}; 15 minutes by default); longer ones are refused",
)

# A namespace's or topic's own maximum: the same bounds, and at most the process maximum (checked by
# the reader, which knows both).
ENTRY_MAX_TIMEOUT = Setting(
    txn.MAX_TIMEOUT_KEY,
    "max_timeout_ms",
    "int",
    None,
    "Longest timeout of a transaction that registers a topic of this namespace or topic (ms); at most "
    "maxTimeoutMs.",
    minimum=1,
    maximum=txn.HARD_MAX_TIMEOUT_MS,
    unit="ms",
)

TRANSACTIONS = Section(
    txn.TRANSACTIONS_SECTION,
    "The longest transaction timeout the coordinators grant, per process, namespace and topic.",
    (MAX_TIMEOUT,),
    structured=txn.LIMITED_KINDS,
)
