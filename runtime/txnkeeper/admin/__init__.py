"""The pod admin/metrics HTTP API (contracts §5), consumed by the operator, the verifier and humans."""
