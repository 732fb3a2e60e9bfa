"""The verifier's name for the report-freshness rule, which lives in ``txnkeeper.contract.freshness``.

Kept so the verifier's executor code and its callers import it where they always did; the rule itself
is shared with the operator's rollout engine and must exist once.
"""

from __future__ import annotations

from txnkeeper.contract.freshness import report_is_fresh, staleness, staleness_reason

__all__ = ["report_is_fresh", "staleness", "staleness_reason"]
