"""Names vulture (``make deadcode``) cannot see used: called by a framework, read by a reflection, or
kept as data. Each one says who uses it; anything else vulture reports is dead and goes.

This file is never imported; vulture reads it as one more module whose attribute accesses count.
"""

# ruff: noqa
from typing import Any

_: Any = None

# Called by frameworks, by name.
_.do_GET  # http.server handlers: e2e/podapps/probe_server.py, tests/chart/test_selfcheck.py
_.do_POST  # e2e/podapps/probe_server.py
_.log_message  # http.server: silences its stderr logging
_.connection_made  # asyncio.Protocol callbacks: protocol/connection.py, protocol/server.py
_.data_received
_.pause_writing  # asyncio.Protocol flow control: protocol/server.py (a peer not reading)
_.resume_writing
_.connection_lost
pytest_runtest_makereport  # pytest hook (e2e/conftest.py)
pytest_terminal_summary  # pytest hook (e2e/conftest.py: the containers the session's pods ran)
_remember_cluster  # an autouse session fixture (e2e/conftest.py)
_operator_disruption  # an autouse fixture (e2e/conftest.py): the operator lock of disrupts_operator tests
pytestmark  # pytest reads a module's marks from this name
restore_gc  # an autouse pytest fixture (tests/test_gcpolicy.py), and its generator's yield value
signum  # signal handler signature (bench/pulsar_peer/run.py)

# PySpark's Python Data Source API calls these by name (runtime/txnkeeper/spark/source.py).
_.streamReader
_.initialOffset
_.latestOffset

# kopf reads its settings object's attributes (operator/txnkeeper_operator/handlers.py).
_.progress_storage
_.diffbase_storage
_.server_timeout

# Protobuf fields set for encoding (tests/bufferedwriter/test_codec.py).
_.expected_status
_.max_local_txn_id  # NEW record of the coordinator's begin (coordinator.py), Pulsar's field

# Data kept on purpose: fields of records that are parsed, logged or recovered whole.
_.last_modification_ms  # coordinator TxnMeta (state.py): recovered from the log, Pulsar's TxnMeta field
last_modification_ms
index_length  # offload SegmentDescription: the index object's length, as the segment metadata records it
live_unbatched  # verifier StoreReport: the pod's census, parsed and validated with the rest

# Offloader counters read by name (getattr) when the pod's collector builds brk_ledgeroffloader_*
# families (runtime/txnkeeper/server/offload_topics.py).
_.write_storage_error
_.delete_offload_ops
write_storage_error
delete_offload_ops

# Exception chaining set by hand where the error is returned rather than raised (client/errors.py).
_.__cause__

# Set on the kubernetes client's Configuration and read by its REST client (e2e/helpers.py load_api).
_.retries

# Fields of Pulsar's protobuf messages, set by name and read by Pulsar's clients on the wire
# (server/pulsar_handler.py, tests/runtime/pulsar_wire.py).
_.publish_time
_.server_version
_.brokerServiceUrl
_.authoritative
_.producer_ready
_.client_version
_.schema_version
_.brokerServiceUrlTls
