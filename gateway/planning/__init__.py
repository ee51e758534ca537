"""Planning: which engine serves a model on this host, with which options, and why."""

from gateway.planning.capacity import (
    KV_DTYPE_BYTES,
    PREFILL_EFFICIENCY,
    Capacity,
    MemoryPool,
    assess,
    decode_tokens_per_s,
    kv_bytes,
    kv_bytes_per_token,
    max_concurrency,
    max_context,
    prefill_seconds,
)
from gateway.planning.installed import Installed, installed_set, is_installed
from gateway.planning.overrides import OptionOverride, apply_user
from gateway.planning.plan import NoEngineError, Plan, plan
from gateway.planning.selection import ENGINES, Candidate, Rejection, RuleBook, load_rules
from gateway.planning.specs import ModelSpec, SpecError, load_spec
from gateway.planning.workload import Profile, Workload, load_workload

__all__ = [
    "ENGINES",
    "KV_DTYPE_BYTES",
    "PREFILL_EFFICIENCY",
    "Candidate",
    "Capacity",
    "Installed",
    "MemoryPool",
    "ModelSpec",
    "NoEngineError",
    "OptionOverride",
    "Plan",
    "Profile",
    "Rejection",
    "RuleBook",
    "SpecError",
    "Workload",
    "apply_user",
    "assess",
    "decode_tokens_per_s",
    "installed_set",
    "is_installed",
    "kv_bytes",
    "kv_bytes_per_token",
    "load_rules",
    "load_spec",
    "load_workload",
    "max_concurrency",
    "max_context",
    "plan",
    "prefill_seconds",
]
