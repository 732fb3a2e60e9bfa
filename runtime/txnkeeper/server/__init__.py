"""The runtime process (edges, layer 5): the protocol handler, the pod runtime and ``txnkeeper serve``."""
