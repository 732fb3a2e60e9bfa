"""The one rule for topic and subscription names, wherever a name enters: the store's wire requests,
the coordinator's (a name it logged must be one every store accepts at the end, which it retries until
applied) and the admin API's topic verbs.

Why a low-layer module: those are independent layers that must refuse the same names in the same
words. The rule is about characters only: ``ledger/names.py`` stores any name it allows in a bounded
file name (a long one in a hashed form), so how many bytes a name takes on disk is never the client's
concern (docs/contracts.md §1, "Name encoding"). The rule itself lives in ``contract.names``, so that
the operator checks the topic names a CR carries with it too.
"""

from __future__ import annotations

from txnkeeper.contract.names import name_problem

__all__ = ["name_problem"]
