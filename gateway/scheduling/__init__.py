"""Admission as a scheduler: whose request goes next (gateway/routing/admission.py applies it)."""

from gateway.scheduling.demand import RANK, TIERS, Demand
from gateway.scheduling.fair_queue import REFUSAL_REASONS, FairQueue, Refused, RefusalReason, Waiter

__all__ = ["RANK", "REFUSAL_REASONS", "TIERS", "Demand", "FairQueue", "Refused", "RefusalReason", "Waiter"]
