"""The API group, versions, labels and annotations every party must spell the same way.

The operator's CRDs and objects, its rollout engine, the verifier's report documents and the local
fleet all use these; a second spelling is a pause annotation nobody honours or a report nobody parses.
The rule for topic and subscription names is here too (``txnkeeper.topicnames`` serves it to the
runtime): a CR that names topics (``TransactionCoordinator.spec.transactions.topics``) must be checked
against the very rule every pod applies. Standard library only (docs/contracts.md §0).
"""

from __future__ import annotations

import re

GROUP = "txnkeeper.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"

PAUSE_ANNOTATION = f"{GROUP}/pause-reconciliation"
# "now": rebalance placement (contracts §12); the operator removes it once the rebalance is done.
REBALANCE_ANNOTATION = f"{GROUP}/rebalance"
VERSION_LABEL = f"{GROUP}/version"
STARTUP_BATCH_ANNOTATION = f"{GROUP}/startup-batch"
VERIFIER_OF_LABEL = f"{GROUP}/verifier-of"

# ---- topic and subscription names ---------------------------------------------------------------------

MAX_TOPIC_NAME = 512  # characters (a UTF-8 name of 512 four-byte characters is 2 KiB)
PENDING_ACK_SUFFIX = "__transaction_pending_ack"  # the store's pending-ack logs are named with it
_CONTROL = re.compile(r"[\x00-\x1f]")


def name_problem(kind: str, name: str) -> str | None:
    """What is wrong with ``name`` as a ``kind`` ("topic" or "subscription") name; None if nothing."""
    if not name or len(name) > MAX_TOPIC_NAME or _CONTROL.search(name) is not None:
        shown = repr(name) if len(name) <= 80 else f"{name[:60]!r}... ({len(name)} characters)"
        return f"{kind} name {shown} must be 1..{MAX_TOPIC_NAME} printable characters"
    if name.endswith(PENDING_ACK_SUFFIX):
        return f"{kind} name {name[:80]!r} may not end with {PENDING_ACK_SUFFIX}"
    return None
