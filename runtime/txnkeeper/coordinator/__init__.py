"""Transaction coordinator (layer 4): mints TxnIDs; the txn state machine, timeouts, end-txn fan-out."""
