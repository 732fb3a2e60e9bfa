"""Transaction coordinator (layer 4): TxnIDs, the transaction state machine, timeouts, end-txn fan-out."""
