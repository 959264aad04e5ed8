"""Swappable decision logic: priority, placement, retry, memory, replication, scaling
and speculation policies.

Policies are registered by kind and name in :data:`policies.REGISTRY` and created with
``REGISTRY.create(kind, name, params)``; actors swap them at runtime on a
``SetPolicyRequest`` message. Register your own with ``@policies.register(kind, name)``.
"""

from policies import (
    memory,
    placement,
    priority,
    replication,
    retry,
    scaling,
    speculation,
    survival,
)
from policies.base import (
    BENIGN_LOSSES,
    KINDS,
    MAX_RETRY_DELAY,
    NOT_LOADABLE,
    ON_PURPOSE,
    REGISTRY,
    CategoryStats,
    CategoryStatsView,
    DataLocality,
    MemoryPolicy,
    PlacementPolicy,
    PolicyParamsError,
    PolicyRegistry,
    PoolView,
    PriorityPolicy,
    ReplicationPolicy,
    RetryDecision,
    RetryPolicy,
    ScalingPolicy,
    SpeculationPolicy,
    TaskView,
    WalltimeLoss,
    WorkerView,
    params_of,
    params_text,
    register,
)

DEFAULTS = {
    "priority": "graph",
    "placement": "locality",
    "retry": "default",
    "memory": "producers-yield",
    "replication": "recompute-cost",
    "scaling": "fixed",
    "speculation": "idle-tail",
}

__all__ = [
    "BENIGN_LOSSES",
    "DEFAULTS",
    "KINDS",
    "MAX_RETRY_DELAY",
    "NOT_LOADABLE",
    "ON_PURPOSE",
    "REGISTRY",
    "CategoryStats",
    "CategoryStatsView",
    "DataLocality",
    "MemoryPolicy",
    "PlacementPolicy",
    "PolicyParamsError",
    "PolicyRegistry",
    "PoolView",
    "PriorityPolicy",
    "ReplicationPolicy",
    "RetryDecision",
    "RetryPolicy",
    "ScalingPolicy",
    "SpeculationPolicy",
    "TaskView",
    "WalltimeLoss",
    "WorkerView",
    "memory",
    "params_of",
    "params_text",
    "placement",
    "priority",
    "register",
    "replication",
    "retry",
    "scaling",
    "speculation",
    "survival",
]
