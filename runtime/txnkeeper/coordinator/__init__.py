"""Transaction coordinator (layer 4): mints TxnIDs; the transaction state machine, timeouts, end-txn fan-out."""
