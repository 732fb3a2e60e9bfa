"""The API group, versions, labels and annotations every party must spell the same way.

The operator's CRDs and objects, its rollout engine, the verifier's report documents and the local
fleet all use these; a second spelling is a pause annotation nobody honours or a report nobody parses.
Standard library only (docs/contracts.md §0).
"""

from __future__ import annotations

GROUP = "txnkeeper.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"

PAUSE_ANNOTATION = f"{GROUP}/pause-reconciliation"
VERSION_LABEL = f"{GROUP}/version"
STARTUP_BATCH_ANNOTATION = f"{GROUP}/startup-batch"
VERIFIER_OF_LABEL = f"{GROUP}/verifier-of"
