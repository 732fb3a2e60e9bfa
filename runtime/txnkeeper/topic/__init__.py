"""Topic partitions (layer 4): managed-ledger partitions, the transaction buffer, subscriptions with
plain and transactional acks (the latter through each subscription's pending-ack store)."""
