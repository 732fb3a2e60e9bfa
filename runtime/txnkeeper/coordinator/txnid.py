"""The transaction id, as the coordinator and the layers above name it.

There is one TxnID class: it lives with the stores (layer 3), which key their records by it, and is
re-exported here so that a coordinator's id and a store's id compare and hash as the same value.
"""

from txnkeeper.txnlog.txnid import TxnID

__all__ = ["TxnID"]
