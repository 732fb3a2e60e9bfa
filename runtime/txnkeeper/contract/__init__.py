"""Pure contract modules shared by the runtime and the operator (stdlib only, no txnkeeper internals)."""
