"""The pure rollout engine shared by the Kopf operator and the local fleet.

No I/O, no clock, no kopf import: callers translate the world into ``Desired``/``Observed``/``Progress``,
call ``decide`` and carry out the single action it returns.
"""

from txnkeeper.contract.batching import BatchSettings
from txnkeeper.contract.formats import (
    BATCHED_LEVEL,
    UNBATCHED_LEVEL,
    UnknownReleaseError,
    format_level,
)
from txnkeeper.contract.names import PAUSE_ANNOTATION
from txnkeeper_operator.engine.model import (
    Action,
    ApplyTemplate,
    Condition,
    ConditionStatus,
    ConfigureBatchLog,
    Decision,
    Desired,
    DowngradeProgress,
    Observed,
    OffloadState,
    Phase,
    PodState,
    Progress,
    RestartPod,
    RestoreOffloaded,
    RolloverStores,
    RunVerifier,
    StoreVerdict,
    Template,
    VerifierReport,
    VerifierState,
    describe,
)
from txnkeeper_operator.engine.rollout import (
    DEFAULT_CONFIG,
    EngineConfig,
    decide,
    record_rollover,
)

__all__ = [
    "BATCHED_LEVEL",
    "DEFAULT_CONFIG",
    "PAUSE_ANNOTATION",
    "UNBATCHED_LEVEL",
    "Action",
    "ApplyTemplate",
    "BatchSettings",
    "Condition",
    "ConditionStatus",
    "ConfigureBatchLog",
    "Decision",
    "Desired",
    "DowngradeProgress",
    "EngineConfig",
    "Observed",
    "OffloadState",
    "Phase",
    "PodState",
    "Progress",
    "RestartPod",
    "RestoreOffloaded",
    "RolloverStores",
    "RunVerifier",
    "StoreVerdict",
    "Template",
    "UnknownReleaseError",
    "VerifierReport",
    "VerifierState",
    "decide",
    "describe",
    "format_level",
    "record_rollover",
]
